"""A hostile pull request against the real smoke path, in every runner mode this machine can produce.

``hostile_model.py`` (its __init__ attacks, then raises with what it got) runs through
``gpu_runner.runner.smoke`` exactly as the App runs it:

* ``root``: the runner as root (bubblewrap + setpriv to nobody);
* ``uid 10001``: the runner as the image's uid 10001 (bubblewrap + a user namespace), the key mounted
  0440 for its group, as Kubernetes' fsGroup does;
* ``no user namespaces``: the runner as uid 10001 under a seccomp filter that denies user namespaces
  (what Docker's and Kubernetes' default profiles do): it must refuse, and run only, loudly, with
  TORCHREVIEW_SANDBOX=weak.

Every attack must fail, nothing planted as a secret may appear in the run's result or in the check run
the App would post, and a refused run must not have run any of the PR's code.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from bot.smoke import plan_smoke_check_run
from gpu_runner import syscall_filter
from gpu_runner.runner import TargetRequest, smoke
from gpu_runner.sandbox import SandboxLimits, available_layers

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).with_name("hostile_model.py")
RUNNER_UID = 10001
LIMITS = {"memory_bytes": 768 << 20, "processes": 96, "timeout_s": 240}
SECRETS = {
    "key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEplantedKEYmaterial0123456789abcdefghijklmnop\n-----END RSA PRIVATE KEY-----\n",
    "ssh": "ssh-rsa-PLANTED-SSH-SECRET-0123456789abcdef",
    "db": "PLANTED-BROKER-ROW-0123456789abcdef",
    "env": "planted-webhook-secret-0123456789abcdef",
}
# What each attack's success would look like is in hostile_model.py; all must report got=False.
ATTACKS = ("read-key-file", "read-ssh-key", "read-broker-db", "read-checkout", "read-shadow", "environment",
           "parent-environ", "runner-environ", "see-runner", "signal-runner", "ptrace-parent", "ptrace-runner",
           "tcp-loopback", "unix-socket", "abstract-socket", "nested-userns", "mount", "keyctl", "bpf",
           "perf-event-open", "write-outside-tmp", "forge-result", "memory-bomb", "fork-bomb",
           "leave-process-behind")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("setpriv"),
                                reason="needs root, bubblewrap and setpriv to produce the runner modes")


class World:
    """The runner's surroundings, with secrets planted where a real deployment keeps them."""

    def __init__(self, root: Path):
        self.root = root
        root.chmod(0o755)
        self.tag = "torchreview-attack-" + uuid.uuid4().hex[:12]
        self.code = root / "code"
        self.code.mkdir(mode=0o755)
        (self.code / "benign.py").write_text(
            "import torch.nn as nn\n\nclass Tiny(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(4, 3)\n\n    def forward(self, x):\n        return self.fc(x)\n")
        keys = root / "keys"
        keys.mkdir(mode=0o750)
        os.chown(keys, 0, RUNNER_UID)
        self.key = keys / "private-key.pem"
        self.key.write_text(SECRETS["key"])
        os.chown(self.key, 0, RUNNER_UID)
        self.key.chmod(0o440)  # fsGroup-style: readable by the runner's group
        self.home = root / "home"
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_rsa").write_text(SECRETS["ssh"])
        self.data = root / "data"
        self.data.mkdir()
        (self.data / "broker.sqlite").write_text(SECRETS["db"])
        for path in (self.home, self.home / ".ssh", self.home / ".ssh" / "id_rsa", self.data,
                     self.data / "broker.sqlite"):
            os.chown(path, RUNNER_UID, RUNNER_UID)
        self.writable = root / "world-writable"
        self.writable.mkdir()
        self.writable.chmod(0o777)
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.unix_path = f"/run/{self.tag}.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen(8)
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.tag)
        self.abstract.listen(8)
        self.marker = self.writable / "imported"

    def env(self) -> dict[str, str]:
        return {"GITHUB_PRIVATE_KEY_PATH": str(self.key), "HOME": str(self.home), "TORCHREVIEW_DATA_DIR": str(self.data),
                "GITHUB_WEBHOOK_SECRET": SECRETS["env"], "PLANTED_TOKEN": SECRETS["env"]}

    def write_hostile(self, runner_pid: int) -> None:
        params = {"key_path": str(self.key), "ssh_path": str(self.home / ".ssh" / "id_rsa"),
                  "db_path": str(self.data / "broker.sqlite"), "project_file": str(PROJECT_ROOT / "pyproject.toml"),
                  "runner_pid": runner_pid, "tcp_port": self.tcp.getsockname()[1], "unix_path": self.unix_path,
                  "abstract_name": self.tag, "tag": self.tag, "target": "hostile.py:Hostile",
                  "memory_bytes": LIMITS["memory_bytes"], "processes": LIMITS["processes"],
                  "writable_targets": [str(self.code), str(self.writable), "/", "/usr", sys.prefix, str(PROJECT_ROOT)]}
        source = HOSTILE.read_text().replace("@@PARAMS@@", json.dumps(params))
        # Importing the module leaves a marker where only an unsandboxed child could write: proof it ran.
        source = source.replace("results = {}\n", f"results = {{}}\ntry:\n    open({str(self.marker)!r}, 'w').close()\n"
                                                  "except OSError:\n    pass\n", 1)
        (self.code / "hostile.py").write_text(source)

    def close(self) -> None:
        for s in (self.tcp, self.unix, self.abstract):
            s.close()
        Path(self.unix_path).unlink(missing_ok=True)

    def contacted(self) -> list[str]:
        """Listeners that got a connection (non-blocking accept)."""
        got = []
        for name, s in (("tcp", self.tcp), ("unix", self.unix), ("abstract", self.abstract)):
            s.setblocking(False)
            try:
                s.accept()[0].close()
                got.append(name)
            except BlockingIOError:
                pass
        return got

    def survivors(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and self.tag.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
        return found


@pytest.fixture(scope="session")
def runner_python(tmp_path_factory):
    """An interpreter uid 10001 can run: a venv of the system Python 3 that sees this venv's packages
    (this interpreter may live under /root, which 10001 cannot traverse, as it could not in an image)."""
    import sysconfig

    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3 to build a venv for uid 10001")
    check = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if check.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip("the system python3 is not this Python version (torch's binary packages would not load)")
    root = Path(tempfile.mkdtemp(prefix="torchreview-runner-venv-"))
    root.chmod(0o755)
    subprocess.run([system, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    purelib = subprocess.run([str(root / "venv" / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "torchreview-test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = str(root / "venv" / "bin" / "python")
    reachable = subprocess.run(["setpriv", f"--reuid={RUNNER_UID}", f"--regid={RUNNER_UID}", "--clear-groups", "--",
                                python, "-c", "import gpu_runner, torch"], capture_output=True, text=True,
                               env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}, cwd="/")
    if reachable.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        # A checkout (or its venv) under a folder only root may enter, e.g. /root: the unprivileged runner
        # cannot even import itself there, as in no real deployment. CI clones to a readable folder.
        pytest.skip(f"uid {RUNNER_UID} cannot read this checkout or its packages: {reachable.stderr[-200:]}")
    yield python
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def world():
    w = World(Path(tempfile.mkdtemp(prefix="torchreview-attack-")))
    try:
        yield w
    finally:
        w.close()
        for pid in w.survivors():  # only this run's tagged processes
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(w.root, ignore_errors=True)


# The runner as a separate process: as uid 10001, optionally under a filter, printing the run as JSON.
DRIVER = """
import json, sys
from pathlib import Path
from gpu_runner.runner import TargetRequest, smoke
from gpu_runner.sandbox import SandboxLimits
args = json.loads(sys.argv[1])
run = smoke(Path(args["code"]), [TargetRequest(t) for t in args["targets"]], steps=2, limits=SandboxLimits(**args["limits"]))
print(json.dumps(run.to_dict()))
"""


def run_as_runner_uid(python: str, world: World, targets: list[str], *, deny_userns: bool = False,
                      extra_env=None) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(PROJECT_ROOT), "LANG": "C.UTF-8",
           **world.env(), **(extra_env or {})}
    command = ["setpriv", f"--reuid={RUNNER_UID}", f"--regid={RUNNER_UID}", f"--groups={RUNNER_UID}",
               "--inh-caps=-all", "--bounding-set=-all", "--"]
    pass_fds = ()
    if deny_userns:
        # Docker's/Kubernetes' default seccomp profiles: no user namespaces for an unprivileged process.
        read, write = os.pipe()
        os.write(write, syscall_filter.compiled_filter())
        os.close(write)
        command += [python, "-I", "-c", syscall_filter.LOADER, str(read)]
        pass_fds = (read,)
    args = json.dumps({"code": str(world.code), "targets": targets, "limits": LIMITS})
    try:
        done = subprocess.run(command + [python, "-c", DRIVER, args], env=env, capture_output=True,
                              text=True, timeout=600, pass_fds=pass_fds, cwd=str(world.root))
    finally:
        for fd in pass_fds:
            os.close(fd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_as_root(world: World, monkeypatch, targets: list[str]) -> dict:
    for key, value in world.env().items():
        monkeypatch.setenv(key, value)
    run = smoke(world.code, [TargetRequest(t) for t in targets], steps=2, limits=SandboxLimits(**LIMITS))
    return run.to_dict()


def outcomes_of(report: dict) -> dict:
    reason = report["head"]["reason"]
    assert "ATTACKS<<" in reason, reason
    return json.loads(reason.split("ATTACKS<<", 1)[1].split(">>ATTACKS", 1)[0])


def assert_nothing_leaked(world: World, run: dict) -> None:
    posted = plan_smoke_check_run(run, "0" * 40)
    for text in (json.dumps(run), posted.title, posted.summary):
        for name, secret in SECRETS.items():
            for line in secret.splitlines():
                if len(line) > 20 and "-----" not in line:
                    assert line not in text, f"the {name} secret leaked"
    assert world.contacted() == []
    assert not any(world.writable.iterdir()), list(world.writable.iterdir())
    assert sorted(p.name for p in world.code.iterdir()) == ["benign.py", "hostile.py"]
    assert not (PROJECT_ROOT / f"pwned-{world.tag}").exists()


def assert_attacks_failed(world: World, run: dict) -> None:
    (target,) = run["targets"]
    # The model raised in __init__ after forging "passed" results on stdout and on every descriptor it had.
    assert target["status"] == "skipped", target
    outcomes = outcomes_of(target)
    assert sorted(outcomes) == sorted(ATTACKS)
    succeeded = {name: o["detail"] for name, o in outcomes.items() if o["got"]}
    if "write-outside-tmp" in succeeded:
        # A checkout under /tmp (a CI scratch clone): the sandbox's private tmpfs holds the directories made
        # for its read-only binds, so a file written there lands in the sandbox's own RAM. Only a file that
        # reached the host is an escape.
        written = json.loads(succeeded["write-outside-tmp"])
        if not [d for d in written if Path(d, f"pwned-{world.tag}").exists()] and \
                all(Path(d).resolve().is_relative_to("/tmp") for d in written):
            del succeeded["write-outside-tmp"]
    assert succeeded == {}, succeeded
    fork_count = int(outcomes["fork-bomb"]["detail"].split()[0])
    assert fork_count < LIMITS["processes"], outcomes["fork-bomb"]
    memory = json.loads(outcomes["memory-bomb"]["detail"])
    assert memory["tmp"] > 0 and memory["data"] > 0, memory  # the bomb ran, and was stopped
    assert memory["shared"] == 0 and memory["memfd"] == 0, memory
    assert world.survivors() == [], "a process of the PR outlived the run"
    posted = plan_smoke_check_run(run, "0" * 40)
    assert "@octocat" not in posted.summary and "<!-- torchreview" not in posted.summary  # neutralized
    assert_nothing_leaked(world, run)


def test_root_runner_contains_every_attack(world, monkeypatch):
    world.write_hostile(os.getpid())
    run = run_as_root(world, monkeypatch, ["hostile.py:Hostile"])
    assert run["refused"] is None and run["warnings"] == [], run["warnings"]
    assert_attacks_failed(world, run)


def test_uid_10001_runner_contains_every_attack(runner_python, world):
    # A process of the runner's own uid holding the secrets in its environment, standing in for the
    # worker: the child is that uid outside its user namespace, so this is what it could reach.
    worker = subprocess.Popen(["setpriv", f"--reuid={RUNNER_UID}", f"--regid={RUNNER_UID}", "--clear-groups", "--",
                               sys.executable, "-c", "import time; time.sleep(600)"], env=world.env())
    try:
        world.write_hostile(worker.pid)
        run = run_as_runner_uid(runner_python, world, ["hostile.py:Hostile"])
        assert worker.poll() is None, "the stand-in worker was killed"
    finally:
        worker.kill()
        worker.wait()
    assert run["refused"] is None and run["warnings"] == [], run["warnings"]
    assert_attacks_failed(world, run)


def test_without_user_namespaces_the_runner_refuses(runner_python, world):
    world.write_hostile(os.getpid())
    run = run_as_runner_uid(runner_python, world, ["hostile.py:Hostile"], deny_userns=True)
    assert run["refused"], run
    assert "bubblewrap" in run["refused"] and "user namespaces" in run["refused"]  # what to enable
    assert "TORCHREVIEW_SANDBOX=weak" in run["refused"]
    (target,) = run["targets"]
    assert target["status"] == "error" and target["head"]["reason"] == run["refused"]
    assert not world.marker.exists(), "the PR's code ran although the sandbox refused"
    posted = plan_smoke_check_run(run, "0" * 40)
    assert "refused" in posted.title.lower() and "user namespaces" in posted.summary
    assert_nothing_leaked(world, run)


def test_weak_mode_runs_only_when_opted_in_and_says_so_loudly(runner_python, world):
    run = run_as_runner_uid(runner_python, world, ["benign.py:Tiny"], deny_userns=True, extra_env={"TORCHREVIEW_SANDBOX": "weak"})
    assert run["refused"] is None
    assert run["targets"][0]["status"] in ("passed", "failed"), run["targets"][0]
    assert run["warnings"][0].startswith("WEAK SANDBOX"), run["warnings"]
    posted = plan_smoke_check_run(run, "0" * 40)
    assert "WEAK SANDBOX" in posted.summary


def test_this_machine_gives_root_every_required_layer():
    # The modes above are only meaningful if the root runner really has the full sandbox here.
    assert all(available_layers().values()), available_layers()
