"""The sandbox with real child processes, on every backend this machine can run.

``best`` is what the runner gets here; ``no-bubblewrap`` and ``bare`` re-probe with bubblewrap (and
then unshare and setpriv) switched off, to exercise the weak fallbacks for real: they run only with the
operator's opt-in (policy ``weak``) and are refused otherwise. A layer a backend lacks is not skipped:
the test asserts that the result says so (``layers`` and ``warnings``) and that the behaviour observed
matches what it says.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import subprocess
import textwrap
import time
import uuid
import ast
from pathlib import Path

import pytest

import gpu_runner
from gpu_runner import sandbox
from gpu_runner.sandbox import LAYER_NAMES, SandboxLimits, SandboxRefused, SandboxResult, run_sandboxed

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# A word each layer's warning contains, so a test can find the warning that explains a missing layer.
WARNING_WORD = {"network": "network", "pid_namespace": "PID namespace", "uid": "uid", "filesystem": "allowlist",
                "readonly_code": "read-only", "private_tmp": "/tmp", "seccomp": "seccomp", "rlimits": "rlimit",
                "clean_env": "environment"}

BACKENDS = {
    "best": lambda: sandbox._capabilities(),
    "no-bubblewrap": lambda: sandbox._probe(allow_bubblewrap=False),
    "bare": lambda: sandbox._probe(allow_bubblewrap=False, allow_unshare=False, allow_uid_switch=False),
}
_probed: dict[str, sandbox._Capabilities] = {}


def capabilities(backend: str) -> sandbox._Capabilities:
    if backend not in _probed:
        _probed[backend] = BACKENDS[backend]()
    return _probed[backend]


@pytest.fixture(params=list(BACKENDS))
def backend(request, monkeypatch):
    caps = capabilities(request.param)
    monkeypatch.setattr(sandbox, "_capabilities", lambda: caps)
    return request.param


@pytest.fixture
def code_dir(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "model.py").write_text("ANSWER = 42\n")
    return code


def run_python(program: str, code_dir: Path, **kwargs) -> SandboxResult:
    # The weak backends need the operator's opt-in; "best" must not.
    policy = "strict" if sandbox._capabilities().backend == "bubblewrap" else "weak"
    return run_sandboxed([sys.executable, "-c", textwrap.dedent(program), *kwargs.pop("args", [])],
                         code_dir=code_dir, python_paths=[code_dir], packages=[PROJECT_ROOT / "gpu_runner"],
                         policy=kwargs.pop("policy", policy), **kwargs)


def assert_reported(result: SandboxResult, layer: str, available: bool) -> None:
    """The layer is reported as ``available``; a missing one comes with a warning that names it."""
    assert result.layers[layer] is available, (layer, result.layers, result.warnings)
    if not available:
        assert any(WARNING_WORD[layer] in w for w in result.warnings), (layer, result.warnings)


def test_every_missing_layer_is_explained(backend, code_dir):
    result = run_python("print('ok')", code_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    assert set(result.layers) == set(LAYER_NAMES)
    for layer, available in result.layers.items():
        assert_reported(result, layer, available)
    assert result.layers["clean_env"]  # cannot be missing
    # Only a child left running as root escapes RLIMIT_NPROC.
    assert result.layers["rlimits"] is (backend != "bare" or os.geteuid() != 0)


def test_bare_backend_reports_everything_it_lacks():
    caps = capabilities("bare")
    assert caps.backend == "plain"
    for layer in ("network", "pid_namespace", "uid", "filesystem", "readonly_code", "private_tmp"):
        assert caps.layers[layer] is False
        assert any(WARNING_WORD[layer] in w for w in caps.warnings), layer


@pytest.mark.parametrize("name", ["no-bubblewrap", "bare"])
def test_weak_backends_are_refused_without_the_opt_in(name, code_dir, monkeypatch):
    caps = capabilities(name)
    monkeypatch.setattr(sandbox, "_capabilities", lambda: caps)
    monkeypatch.delenv("TORCHREVIEW_SANDBOX", raising=False)
    marker = code_dir.parent / "ran"
    with pytest.raises(SandboxRefused) as refused:
        run_python(f"open({str(marker)!r}, 'w').close()", code_dir, policy=None)
    assert not marker.exists()  # nothing ran
    message = str(refused.value)
    assert "bubblewrap" in message and "TORCHREVIEW_SANDBOX=weak" in message
    monkeypatch.setenv("TORCHREVIEW_SANDBOX", "weak")
    result = run_python("print('ran')", code_dir, policy=None)
    assert result.stdout == "ran\n" and result.warnings[0].startswith("WEAK SANDBOX"), result.warnings


def test_seccomp_filter_holds_on_every_backend(backend, code_dir):
    # The weak backends load it through a loader after unshare; bubblewrap through --seccomp.
    result = run_python("""
        import ctypes, errno, mmap, os
        libc = ctypes.CDLL(None, use_errno=True)
        def outcome(value):
            return "allowed" if value >= 0 else errno.errorcode[ctypes.get_errno()]
        print(outcome(libc.ptrace(16, os.getppid() or 1, 0, 0)))  # PTRACE_ATTACH
        print(outcome(libc.unshare(0x10000000)))  # CLONE_NEWUSER
        try:
            mmap.mmap(-1, 1 << 20)  # shared anonymous memory: outside the budget
            print("allowed")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
    """, code_dir)
    assert result.returncode == 0, result.stderr
    assert result.layers["seccomp"]
    assert result.stdout.split() == ["EPERM", "EPERM", "EPERM"]


def test_policy_values():
    assert sandbox.sandbox_policy("") == "strict"
    assert sandbox.sandbox_policy("weak") == sandbox.sandbox_policy("allow-weak") == "weak"
    assert sandbox.sandbox_policy("wek") == "strict"  # a typo never weakens the sandbox


def test_a_secret_inside_the_allowlist_is_refused(code_dir, monkeypatch):
    # A data directory inside the checkout being run (`torchreview serve` started there): never bound into view.
    (code_dir / ".torchreview-data").mkdir()
    monkeypatch.setenv("TORCHREVIEW_DATA_DIR", str(code_dir / ".torchreview-data"))
    with pytest.raises(SandboxRefused, match=".torchreview-data"):
        run_python("print('ran')", code_dir)
    monkeypatch.setenv("TORCHREVIEW_DATA_DIR", str(code_dir.parent / "elsewhere"))
    assert run_python("print('ran')", code_dir).stdout == "ran\n"


def test_best_backend_sees_only_the_allowlist(code_dir):
    result = run_python("""
        import os
        print(sorted(os.listdir("/")))
        print(sorted(os.listdir("/etc")))
        print(sorted(os.listdir(os.environ["PYTHONPATH"].split(":")[-1])))
    """, code_dir)
    assert result.returncode == 0, result.stderr
    root, etc, package_parent = result.stdout.splitlines()
    assert "'var'" not in root and "'run'" not in root and "'home'" not in root
    assert etc == str(sorted(["group", "passwd", *(n for n in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d")
                                                   if os.path.lexists("/etc/" + n))]))
    # the checkout around the package stays invisible; only the Python environment may live there too
    # (a `.venv` inside the checkout, as scripts/test.sh makes one)
    parent = Path(gpu_runner.__file__).resolve().parents[1]
    environment = {Path(p).resolve().relative_to(parent).parts[0] for p in {sys.prefix, sys.base_prefix}
                   if Path(p).resolve().is_relative_to(parent)}
    assert set(ast.literal_eval(package_parent)) == {"gpu_runner"} | environment


def test_available_layers_is_probed_once():
    first = sandbox.available_layers()
    assert set(first) == set(LAYER_NAMES)
    assert sandbox._capabilities() is sandbox._capabilities()
    assert sandbox.available_layers() == first


def test_no_network(backend, code_dir):
    # A server the parent listens on: reachable from the host's network namespace, not from a new one.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        result = run_python(f"""
            import socket
            def attempt(host, port):
                try:
                    socket.create_connection((host, port), timeout=2).close()
                    return "connected"
                except OSError as exc:
                    return type(exc).__name__
            try:
                socket.getaddrinfo("example.com", 443)
                print("resolved")
            except OSError:
                print("no-dns")
            print(attempt("127.0.0.1", {port}))
            print(attempt("1.1.1.1", 53))
        """, code_dir)
    assert result.returncode == 0, result.stderr
    resolved, loopback, internet = result.stdout.split()
    isolated = result.layers["network"]
    assert_reported(result, "network", isolated)
    assert (loopback == "connected") is not isolated, result.stdout
    if isolated:
        assert resolved == "no-dns" and internet != "connected", result.stdout


def test_environment_is_cleared(backend, code_dir, monkeypatch):
    monkeypatch.setenv("GITHUB_PRIVATE_KEY", "secret")
    monkeypatch.setenv("GITHUB_TOKEN", "secret-token")
    result = run_python("""
        import json, os
        print(json.dumps(dict(os.environ)))
    """, code_dir, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "secret" not in result.stdout
    child_env = json.loads(result.stdout)
    assert "GITHUB_PRIVATE_KEY" not in child_env and "GITHUB_TOKEN" not in child_env
    assert child_env["OMP_NUM_THREADS"] == "1"
    assert child_env["PYTHONDONTWRITEBYTECODE"] == "1" and child_env["PYTHONUNBUFFERED"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in child_env  # only for gpu=True
    assert result.layers["clean_env"]


def test_cuda_visible_devices_only_with_gpu(code_dir):  # noqa: D103
    program = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"
    assert run_python(program, code_dir, env={"CUDA_VISIBLE_DEVICES": "0"}).stdout == "unset\n"
    assert run_python(program, code_dir, env={"CUDA_VISIBLE_DEVICES": "0"}, gpu=True).stdout == "0\n"


def test_code_is_read_only_and_tmp_is_private(backend, code_dir):
    marker = f"torchreview-sandbox-test-{uuid.uuid4().hex}"
    try:
        result = run_python(f"""
            import os, sys, model
            print(model.ANSWER)
            try:
                with open(sys.argv[1], "w") as f:
                    f.write("pwned")
                print("code-written")
            except OSError:
                print("code-read-only")
            with open(os.path.join("/tmp", "{marker}"), "w") as f:
                f.write("x")
            print(os.getuid())
        """, code_dir, args=[str(code_dir / "x.py")])
        assert result.returncode == 0, result.stderr
        answer, code_outcome, uid = result.stdout.split()
        assert answer == "42"  # the code (on PYTHONPATH) is importable
        assert not (code_dir / "x.py").exists()  # the original is never touched, on any backend
        assert_reported(result, "readonly_code", code_outcome == "code-read-only")
        assert_reported(result, "private_tmp", not Path("/tmp", marker).exists())
        # nobody in a user namespace, or the run's own uid from the pool when the runner is root
        run_uids = range(sandbox.RUN_UID_BASE, sandbox.RUN_UID_BASE + sandbox.RUN_UID_COUNT)
        assert_reported(result, "uid", int(uid) == sandbox.CHILD_UID or int(uid) in run_uids)
    finally:
        Path("/tmp", marker).unlink(missing_ok=True)


def test_stdin_is_passed(code_dir):
    result = run_python("import sys; print(sys.stdin.read().upper())", code_dir, stdin=b"hello")
    assert result.stdout == "HELLO\n"


def test_timeout_kills_the_whole_process_tree_on_every_backend(code_dir, monkeypatch):
    # Grandchildren write a marker after 3 s: one in the child's session, one that escapes it with
    # setsid(). Whether the child hangs (timeout) or exits at once (orphaning them), no marker may
    # appear. An "early" marker, written at once, proves the markers would be seen.
    markers = Path(tempfile.mkdtemp(prefix="torchreview-markers-"))
    markers.chmod(0o777)  # the child may run as nobody
    # The only writable place under bubblewrap is its private /tmp; share the markers directory for this test.
    bwrap_command = sandbox._bwrap_command

    def with_markers(*args, **kwargs):
        command = bwrap_command(*args, **kwargs)
        at = command.index("--remount-ro")
        return command[:at] + ["--bind", str(markers), str(markers)] + command[at:]

    monkeypatch.setattr(sandbox, "_bwrap_command", with_markers)
    program = """
        import os, sys, time
        marker_dir, tag, exit_at_once = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
        def mark(name):
            open(os.path.join(marker_dir, tag + name), "w").close()
        def grandchild(name, new_session):
            if os.fork() == 0:
                if new_session:
                    os.setsid()
                time.sleep(3)
                mark(name)
                os._exit(0)
        mark("-early")
        grandchild("-same-session", False)
        grandchild("-own-session", True)
        print("started", flush=True)
        if not exit_at_once:
            time.sleep(60)
    """
    timeout_s = 0.8
    expected = []
    try:
        for name in BACKENDS:
            caps = capabilities(name)
            monkeypatch.setattr(sandbox, "_capabilities", lambda: caps)
            for exit_at_once in (False, True):
                tag = f"{name}-{'exits' if exit_at_once else 'hangs'}"
                last_start = time.monotonic()
                result = run_python(program, code_dir, args=[str(markers), tag, "1" if exit_at_once else "0"],
                                    limits=SandboxLimits(timeout_s=timeout_s))
                assert result.stdout == "started\n", (tag, result.stderr)
                assert result.timed_out is not exit_at_once, tag
                assert result.wall_seconds < timeout_s + 1.5, (tag, result.wall_seconds)  # it would take 60 s
                if exit_at_once:
                    assert result.returncode == 0
                else:
                    assert result.returncode not in (0, None)
                assert not any("survived" in w for w in result.warnings), result.warnings
                expected.append(tag + "-early")
        time.sleep(max(0.0, last_start + timeout_s + 4.0 - time.monotonic()))
        assert sorted(os.listdir(markers)) == sorted(expected)
    finally:
        shutil.rmtree(markers)


def test_memory_limit(backend, code_dir):
    result = run_python("""
        try:
            block = bytearray(512 << 20)
            print("allocated")
        except MemoryError:
            print("MemoryError")
            raise SystemExit(3)
    """, code_dir, limits=SandboxLimits(memory_bytes=256 << 20))
    assert result.stdout == "MemoryError\n", result.stderr
    assert result.returncode == 3


def test_cpu_limit(code_dir):
    result = run_python("while True: pass", code_dir, limits=SandboxLimits(cpu_seconds=1, timeout_s=20))
    assert not result.timed_out
    assert result.returncode != 0
    assert result.wall_seconds < 10


def test_torch_works_under_the_default_limits(code_dir):
    # RLIMIT_DATA, not RLIMIT_AS: torch reserves far more virtual memory at import than it uses.
    result = run_python("""
        import torch
        x = torch.ones(64, 64)
        print(int((x @ x).sum().item()))
    """, code_dir, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == str(64 * 64 * 64)


def test_output_is_capped(backend, code_dir):
    limits = SandboxLimits(output_bytes=1 << 20)
    result = run_python("""
        import sys
        sys.stdout.write("x" * (5 << 20))
        sys.stderr.write("done")
    """, code_dir, limits=limits)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.encode()) == limits.output_bytes
    assert result.output_truncated
    assert result.stderr == "done"


def test_output_is_decoded_leniently(code_dir):
    result = run_python("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe')", code_dir)
    assert result.stdout == "ok \ufffd\ufffd"
    assert not result.output_truncated


def test_max_rss_reflects_the_child(backend, code_dir):
    """Measured from a fresh interpreter: a child's high-water mark starts at its parent's resident size when
    forked (and exec keeps it), so a test worker that once grew past 1 GiB would be measured, not the child."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(PROJECT_ROOT)!r})
        from gpu_runner import sandbox
        from tests.test_sandbox import capabilities, run_python
        caps = capabilities({backend!r})
        sandbox._capabilities = lambda: caps
        result = run_python('block = b"x" * (50 << 20)  # written, so resident\\nprint(len(block))\\n',
                            Path({str(code_dir)!r}))
        print(result.returncode, result.max_rss_bytes, repr(result.stderr))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    returncode, max_rss, stderr = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert returncode == "0", stderr
    assert 50 << 20 < int(max_rss) < 1 << 30, max_rss


def test_missing_code_dir_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        run_sandboxed([sys.executable, "-c", "pass"], code_dir=tmp_path / "missing")


def test_a_gpu_run_gets_room_for_the_cuda_drivers_host_mappings(code_dir):
    """The CUDA driver maps private writable host memory for each kernel image it loads; RLIMIT_DATA counts it, so
    a GPU run's data limit is smoke.memory's share plus gpu_driver_bytes (a CPU run's is not raised)."""
    limits = SandboxLimits(memory_bytes=1 << 30, gpu_driver_bytes=2 << 30)
    script = """
        import resource
        print(resource.getrlimit(resource.RLIMIT_DATA)[0])
    """
    cpu = run_python(script, code_dir, limits=limits)
    gpu = run_python(script, code_dir, limits=limits, gpu=True)
    assert cpu.returncode == 0 and gpu.returncode == 0, (cpu.stderr, gpu.stderr)
    assert int(cpu.stdout) == limits.data_bytes
    assert int(gpu.stdout) == limits.data_bytes + (2 << 30)
