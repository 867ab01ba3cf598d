"""The sandbox's resource limits against a hostile pull request (issue 23, items 7, 11 and 16), in the runner
modes this machine can produce: the runner as root (bubblewrap + setpriv) and as the deploy's uid 10001
(bubblewrap + a user namespace).

* memory: MAP_GROWSDOWN mappings (which RLIMIT_DATA does not count) are denied, the stack's hard limit is
  small, and ``/dev`` (a RAM filesystem of the sandbox's own) is read-only;
* sockets: only the families Python and torch use (AF_UNIX, AF_INET/6, NETLINK_ROUTE); AF_VSOCK and the rest
  fail with EAFNOSUPPORT;
* processes: a hostile run holding its whole process limit does not make a concurrent run fail (each run's
  limit counts only its own processes).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gpu_runner import sandbox, syscall_filter
from gpu_runner.runner import TargetRequest, smoke
from gpu_runner.sandbox import SandboxLimits
from test_attacks import DRIVER, PROJECT_ROOT, RUNNER_UID, runner_python  # noqa: F401 - a fixture
from test_attacks import pytestmark as needs_runner_modes

MODEL = Path(__file__).with_name("resource_model.py")
LIMITS = {"memory_bytes": 512 << 20, "processes": 48, "timeout_s": 120}
HOLD_S = 30
DENIED_FAMILIES = ("AF_VSOCK", "AF_PACKET", "AF_ALG", "AF_KEY", "AF_TIPC", "AF_RDS", "AF_XDP", "AF_BLUETOOTH",
                   "AF_CAN", "AF_QIPCRTR", "AF_SMC", "family 60", "socketpair AF_VSOCK")
BENIGN = ("import torch.nn as nn\n\nclass Tiny(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
          "        self.fc = nn.Linear(4, 3)\n\n    def forward(self, x):\n        return self.fc(x)\n")


@pytest.fixture
def code():
    root = Path(tempfile.mkdtemp(prefix="torchreview-resources-"))
    root.chmod(0o755)
    params = {"memory_bytes": LIMITS["memory_bytes"], "processes": LIMITS["processes"], "hold_s": HOLD_S}
    (root / "limits.py").write_text(MODEL.read_text().replace("@@PARAMS@@", json.dumps(params)))
    (root / "benign.py").write_text(BENIGN)
    for path in root.iterdir():
        path.chmod(0o644)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


def start_as_runner_uid(python: str, code: Path, target: str) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(PROJECT_ROOT), "LANG": "C.UTF-8"}
    args = json.dumps({"code": str(code), "targets": [target], "limits": LIMITS})
    return subprocess.Popen(["setpriv", f"--reuid={RUNNER_UID}", f"--regid={RUNNER_UID}", f"--groups={RUNNER_UID}",
                             "--inh-caps=-all", "--bounding-set=-all", "--", python, "-c", DRIVER, args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(code))


def finish(process: subprocess.Popen) -> dict:
    try:
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def run_in_mode(mode: str, python: str, code: Path, target: str) -> dict:
    if mode == "root":
        return smoke(code, [TargetRequest(target)], steps=2, limits=SandboxLimits(**LIMITS)).to_dict()
    return finish(start_as_runner_uid(python, code, target))


def results_of(run: dict) -> dict:
    assert run["refused"] is None and run["warnings"] == [], run
    (target,) = run["targets"]
    reason = target["head"]["reason"]
    assert "RESOURCES<<" in reason, target
    return json.loads(reason.split("RESOURCES<<", 1)[1].split(">>RESOURCES", 1)[0])


@pytest.fixture(params=["root", "uid 10001"])
def mode(request):
    return request.param


@pytest.fixture
def python(mode, request):
    return request.getfixturevalue("runner_python") if mode != "root" else sys.executable


@needs_runner_modes
def test_memory_outside_the_data_limit_and_other_socket_families_are_denied(mode, python, code):
    results = results_of(run_in_mode(mode, python, code, "limits.py:Limits"))
    assert results["growsdown"] == {"MiB": 0, "stopped": "EPERM"}, results
    assert results["dev"] == {"MiB": 0, "stopped": "EROFS"}, results  # no uncapped RAM filesystem
    assert results["stack"] == "not allowed to raise maximum limit", results
    assert results["files"]["stopped"] == "EMFILE" and results["files"]["pairs"] < sandbox.MAX_OPEN_FILES // 2
    sockets = results["sockets"]
    assert {name: sockets[name] for name in DENIED_FAMILIES} == dict.fromkeys(DENIED_FAMILIES, "EAFNOSUPPORT")
    assert sockets["AF_NETLINK_AUDIT"] == sockets["AF_NETLINK_UEVENT"] == "EPROTONOSUPPORT", sockets
    assert [sockets[name] for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK_ROUTE")] == ["open"] * 4
    assert results["needs"] == {"dataloader_batches": 4, "gloo_all_reduce": [1.0, 1.0]}, results  # what they serve
    if mode == "root":  # a uid of the run's own, not the shared nobody
        assert sandbox.RUN_UID_BASE <= results["uid"] < sandbox.RUN_UID_BASE + sandbox.RUN_UID_COUNT, results


def _tasks_of(uids: range) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields and int(fields["Uid"].split()[0]) in uids:
            count += int(fields["Threads"])
    return count


@needs_runner_modes
def test_a_run_holding_its_process_limit_does_not_starve_a_concurrent_run(mode, python, code):
    hog_run: dict = {}
    if mode == "root":
        hog = threading.Thread(target=lambda: hog_run.update(run_in_mode(mode, python, code, "limits.py:Hog")))
        hog.start()
        uids = range(sandbox.RUN_UID_BASE, sandbox.RUN_UID_BASE + sandbox.RUN_UID_COUNT)
    else:
        hog = start_as_runner_uid(python, code, "limits.py:Hog")
        uids = range(RUNNER_UID, RUNNER_UID + 1)
    try:
        deadline = time.monotonic() + 90
        while _tasks_of(uids) < LIMITS["processes"] - 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _tasks_of(uids) >= LIMITS["processes"] - 8, "the hostile run never held its processes"
        benign = run_in_mode(mode, python, code, "benign.py:Tiny")
    finally:
        if mode == "root":
            hog.join(timeout=300)
        else:
            hog_run.update(finish(hog))
    (target,) = benign["targets"]
    assert target["status"] in ("passed", "failed"), target  # it ran (EAGAIN would be an error)
    held = results_of(hog_run)["processes"]
    assert held["stopped"] == "EAGAIN" and held["held"] < LIMITS["processes"], held  # the hog met its own limit


@pytest.mark.parametrize("gpu", [False, True])
def test_every_filter_denies_growsdown_and_vsock(gpu):
    """The GPU filter leaves shared memory to the CUDA driver, never these."""
    probe = ("import ctypes, errno, mmap\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "try:\n    mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100); print('mapped')\n"
             "except OSError as e:\n    print(errno.errorcode[e.errno])\n"
             "print('open' if libc.socket(40, 1, 0) >= 0 else errno.errorcode[ctypes.get_errno()])\n")
    read, write = os.pipe()
    os.write(write, syscall_filter.compiled_filter(gpu=gpu))
    os.close(write)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", syscall_filter.LOADER, str(read), sys.executable, "-c", probe],
                              pass_fds=(read,), capture_output=True, text=True, timeout=60)
    finally:
        os.close(read)
    assert done.stdout.split() == ["EPERM", "EAFNOSUPPORT"], done.stderr


def test_a_job_stops_at_its_time_budget_and_the_check_run_says_so(tmp_path, monkeypatch):
    """Targets x smoke.timeout is unbounded (100 sleeping classes held the executor 8 hours): the job's budget
    stops it, whatever the per-target timeout."""
    from bot.smoke import plan_smoke_check_run
    from gpu_runner import executor, runner

    code = tmp_path / "code"
    code.mkdir()
    (code / "slow.py").write_text("import time\nimport torch.nn as nn\n" + "".join(
        f"\n\nclass Slow{i}(nn.Module):\n    def __init__(self):\n        super().__init__()\n        time.sleep(10**6)\n"
        for i in range(4)))
    monkeypatch.setenv(runner.JOB_BUDGET_VARIABLE, "12")
    started = time.monotonic()
    run = executor._execute(code, {"targets": [{"target": f"slow.py:Slow{i}"} for i in range(4)], "device": "cpu",
                                   "steps": 2, "limits": {"timeout_s": 60}, "job_budget_s": 10 ** 6}, None)
    assert time.monotonic() - started < 40  # not 4 x 60 s: the executor's own budget caps what the job asks
    assert {t["status"] for t in run["targets"]} == {"error"}
    assert {t["head"]["reason"] for t in run["targets"]} == {runner.BUDGET_REASON}
    assert "time budget of 12s ran out" in run["stopped"] and runner.JOB_BUDGET_VARIABLE in run["stopped"]
    posted = plan_smoke_check_run(run, "0" * 40)
    assert posted.conclusion == "failure" and "time budget of 12s ran out" in posted.summary


def test_the_job_budget_setting_is_a_positive_number_of_seconds():
    from gpu_runner.runner import DEFAULT_JOB_BUDGET_S, job_budget_s

    assert job_budget_s("90") == 90 and job_budget_s("") == DEFAULT_JOB_BUDGET_S
    for wrong in ("0", "-5", "inf", "nan", "soon"):
        assert job_budget_s(wrong) == DEFAULT_JOB_BUDGET_S


def test_a_base_run_past_the_budget_is_stopped_and_the_head_kept(tmp_path):
    from gpu_runner import runner

    head, base = tmp_path / "head", tmp_path / "base"
    for root, init in ((head, ""), (base, "        import time\n        time.sleep(10**6)\n")):
        root.mkdir()
        (root / "model.py").write_text("import torch.nn as nn\n\nclass Tiny(nn.Module):\n    def __init__(self):\n"
                                       "        super().__init__()\n        self.fc = nn.Linear(4, 3)\n" + init +
                                       "\n    def forward(self, x):\n        return self.fc(x)\n")
    run = smoke(head, [TargetRequest("model.py:Tiny")], base_dir=base, steps=2, limits=SandboxLimits(timeout_s=120),
                budget_s=40).to_dict()
    (target,) = run["targets"]
    assert target["status"] in ("passed", "failed") and target["base"] is None and target["comparison"] == []
    assert "time budget of 40s ran out" in run["stopped"], run
