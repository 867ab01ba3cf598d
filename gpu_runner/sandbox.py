"""Run untrusted pull-request code in a child process behind every isolation layer this machine offers.

The smoke trainer imports and runs a PR's model code, which is as untrusted as code gets. The child gets:

* a cleared environment (no tokens, no private key),
* no network (its own network namespace: only loopback, and nothing listens there),
* its own unprivileged uid (``nobody``),
* the code directory read-only and a private, size-capped ``/tmp``,
* rlimits on data memory, CPU time, file size, process count and core dumps,
* a wall-clock timeout that kills the whole process tree (its own PID namespace, plus session kill
  and a check for survivors),
* capped stdout/stderr.

The preferred backend is bubblewrap (``bwrap``). Without it, ``unshare``/``setpriv`` provide what they
can, and a plain subprocess in its own session is the last resort. Each layer that is missing is
reported in ``SandboxResult.layers``/``warnings`` (and logged), never skipped silently.
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

log = logging.getLogger(__name__)

# The uid/gid the child runs as when the runner is root; nobody owns nothing worth protecting.
CHILD_UID = 65534
CHILD_GID = 65534

LAYER_NAMES = ("network", "pid_namespace", "uid", "readonly_code", "private_tmp", "rlimits", "clean_env")

_PROBE_TIMEOUT_S = 20.0
_POLL_INTERVAL_S = 0.02
_READ_CHUNK = 64 << 10
_RUN_TAG_VARIABLE = "TORCHREVIEW_SANDBOX_RUN"  # only set where there is no PID namespace


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 300.0  # wall clock; kills the whole process tree
    memory_bytes: int = 4 << 30  # RLIMIT_DATA (NOT RLIMIT_AS: it breaks torch's virtual reservations)
    cpu_seconds: int = 900  # RLIMIT_CPU
    file_size_bytes: int = 64 << 20  # RLIMIT_FSIZE
    processes: int = 512  # RLIMIT_NPROC (per uid: only meaningful with a dedicated uid)
    output_bytes: int = 1 << 20  # cap on captured stdout and on stderr each


@dataclass
class SandboxResult:
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    wall_seconds: float
    max_rss_bytes: int  # the child's high-water mark (os.wait4 rusage, which covers reaped descendants)
    layers: dict[str, bool]  # network, pid_namespace, uid, readonly_code, private_tmp, rlimits, clean_env
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# What this machine offers
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Capabilities:
    """The outcome of probing: which backend to use, how, and which layers it provides."""

    backend: str  # "bubblewrap" | "unshare" | "plain"
    layers: dict[str, bool]
    warnings: tuple[str, ...]
    # The child runs as CHILD_UID in the kernel's eyes (not just inside a user namespace), so
    # root-only files stay unreadable and RLIMIT_NPROC counts only sandboxed processes.
    dedicated_uid: bool = False
    bwrap_proc_args: tuple[str, ...] = ("--proc", "/proc")
    # Non-root runners get their uid through a bwrap user namespace instead of setpriv.
    bwrap_user_namespace: bool = False
    unshare_args: tuple[str, ...] = ()  # fallback: "unshare --net --pid ..." prefix


_capabilities_lock = threading.Lock()
_cached_capabilities: Optional[_Capabilities] = None


def available_layers() -> dict[str, bool]:
    """Which isolation layers ``run_sandboxed`` applies on this machine (probed once per process)."""
    return dict(_capabilities().layers)


def _capabilities() -> _Capabilities:
    global _cached_capabilities
    with _capabilities_lock:
        if _cached_capabilities is None:
            _cached_capabilities = _probe()
            for warning in _cached_capabilities.warnings:
                log.warning("sandbox: %s", warning)
        return _cached_capabilities


def _probe(*, allow_bubblewrap: bool = True, allow_unshare: bool = True,
           allow_uid_switch: bool = True) -> _Capabilities:
    """Find the strongest working backend. The ``allow_*`` switches let tests exercise the fallbacks."""
    is_root = os.geteuid() == 0
    can_switch_uid = allow_uid_switch and is_root and shutil.which("setpriv") is not None
    bwrap_failure = "bubblewrap is not installed (apt-get install bubblewrap)"
    if not allow_bubblewrap:
        bwrap_failure = "bubblewrap is disabled"
    elif shutil.which("bwrap"):
        outcome = _probe_bubblewrap(is_root=is_root, can_switch_uid=can_switch_uid)
        if isinstance(outcome, _Capabilities):
            return outcome
        bwrap_failure = outcome
    return _probe_without_bubblewrap(bwrap_failure, is_root=is_root, can_switch_uid=can_switch_uid,
                                     allow_unshare=allow_unshare)


def _probe_bubblewrap(*, is_root: bool, can_switch_uid: bool) -> "_Capabilities | str":
    """A bubblewrap backend that really runs this interpreter, or why bubblewrap cannot be used."""
    errors = []
    # A fresh procfs is refused in some containers (a masked /proc); the host's, read-only, still works.
    for proc_args in (("--proc", "/proc"), ("--ro-bind", "/proc", "/proc")):
        # Root prefers a real uid switch (setpriv inside); otherwise nobody inside a user namespace.
        attempts = [(True, False), (False, True)] if can_switch_uid else [(False, True)]
        for dedicated_uid, user_namespace in attempts:
            caps = _Capabilities("bubblewrap", {}, (), dedicated_uid=dedicated_uid, bwrap_proc_args=proc_args,
                                 bwrap_user_namespace=user_namespace)
            error = _try_sandboxed_interpreter(caps)
            if error is None:
                return _describe_bubblewrap(caps, is_root=is_root, can_switch_uid=can_switch_uid,
                                            errors=errors)
            errors.append(f"{' '.join(proc_args)}, {'setpriv' if dedicated_uid else 'user namespace'}: {error}")
    return "bubblewrap cannot create its sandbox here (" + "; ".join(errors) + ")"


def _describe_bubblewrap(caps: _Capabilities, *, is_root: bool, can_switch_uid: bool,
                         errors: list[str]) -> _Capabilities:
    layers = dict.fromkeys(LAYER_NAMES, True)
    warnings = []
    if caps.bwrap_proc_args[0] != "--proc":
        warnings.append("no private /proc: bubblewrap cannot mount procfs here; the host's /proc is bound "
                        "read-only (the child sees the host's process list, not their environments)")
    if not caps.dedicated_uid:
        outside = "root" if is_root else _user_name(os.geteuid())
        why = ("setpriv could not switch to it inside bubblewrap (" + "; ".join(errors) + ")" if can_switch_uid
               else "the runner is not root, so it cannot switch uid")
        warnings.append(f"uid: the child is nobody only inside a user namespace, where it maps to {outside} "
                        f"outside; {why}. Files {outside} can read stay readable to the child, and "
                        "RLIMIT_NPROC is not applied (it would count the runner's own processes)")
    return _Capabilities("bubblewrap", layers, tuple(warnings), dedicated_uid=caps.dedicated_uid,
                         bwrap_proc_args=caps.bwrap_proc_args, bwrap_user_namespace=caps.bwrap_user_namespace)


def _probe_without_bubblewrap(bwrap_failure: str, *, is_root: bool, can_switch_uid: bool,
                              allow_unshare: bool) -> _Capabilities:
    layers = dict.fromkeys(LAYER_NAMES, True)
    warnings = []
    # Non-root needs a user namespace to own the new network/PID namespaces.
    user_ns = () if is_root else ("--user", "--map-root-user")
    unshare_args: list[str] = []
    net_error = pid_error = "unshare is not available" if allow_unshare else "unshare is disabled"
    if allow_unshare and shutil.which("unshare"):
        net_error = _try_command(["unshare", *user_ns, "--net", "true"])
        if net_error is None:
            unshare_args += ["--net"]
        # --kill-child: when unshare (the namespace's parent) dies, its child, the namespace's init, dies,
        # and the kernel kills everything else in the namespace.
        pid_args = ["--pid", "--fork", "--kill-child", "--mount-proc"]
        pid_error = _try_command(["unshare", *user_ns, *pid_args, "true"])
        if pid_error is None:
            unshare_args += pid_args
        if unshare_args:
            unshare_args = ["unshare", *user_ns, *unshare_args]
    if net_error is not None:
        layers["network"] = False
        warnings.append(f"no network namespace: {bwrap_failure}; unshare --net failed ({net_error}); "
                        "the child can reach the network")
    if pid_error is not None:
        layers["pid_namespace"] = False
        warnings.append(f"no PID namespace: {bwrap_failure}; unshare --pid failed ({pid_error}); the timeout "
                        "kills the child's session, process tree and the processes carrying its environment tag "
                        "instead, which a descendant that calls setsid() and rewrites its environment can escape")
    dedicated_uid = False
    if can_switch_uid:
        uid_error = _try_command([*_setpriv_args(), *_interpreter_check()])
        dedicated_uid = uid_error is None
    else:
        uid_error = "the runner is not root" if not is_root else "setpriv is not available"
    if not dedicated_uid:
        layers["uid"] = False
        layers["readonly_code"] = False
        me = _user_name(os.geteuid())
        warnings.append(f"no dedicated uid: {bwrap_failure}; setpriv to uid {CHILD_UID} failed ({uid_error}); "
                        f"the child runs as {me}, can read what {me} can read, and RLIMIT_NPROC is not applied")
        warnings.append(f"code not read-only: the child runs on a copy of the code, marked read-only, but as "
                        f"{me} it can make it writable again (the original stays intact)")
    layers["private_tmp"] = False
    warnings.append(f"no private /tmp: {bwrap_failure}; HOME and TMPDIR point to a fresh 0700 directory of "
                    "the child's, but /tmp itself is the host's")
    return _Capabilities("unshare" if unshare_args else "plain", layers, tuple(warnings),
                         dedicated_uid=dedicated_uid, unshare_args=tuple(unshare_args))


def _try_sandboxed_interpreter(caps: _Capabilities) -> Optional[str]:
    """None when this interpreter starts inside the sandbox ``caps`` describes, else the error."""
    with tempfile.TemporaryDirectory(prefix="torchreview-probe-") as scratch:
        code_dir = Path(scratch)
        code_dir.chmod(0o755)
        command = _bwrap_command(_interpreter_check(), caps=caps, code_dir=code_dir,
                                 mounted_code=code_dir, python_paths=(), limits=SandboxLimits(), gpu=False)
        return _try_command(command)


def _interpreter_check() -> list[str]:
    # Exits non-zero unless this interpreter's Python version starts. (Without access to a pyenv prefix
    # the dynamic loader may silently pick the system's libpython instead; the same minor version
    # keeps the venv's compiled packages working, so that much is accepted.)
    return [sys.executable, "-c", f"import sys; sys.exit(sys.version_info[:2] != {tuple(sys.version_info[:2])})"]


def _try_command(command: list[str]) -> Optional[str]:
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_TIMEOUT_S,
                              env=_base_env(python_paths=(), home="/tmp"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    message = done.stderr.decode(errors="replace").strip().splitlines()
    return message[-1] if message else f"exit status {done.returncode}"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# --------------------------------------------------------------------------------------------------
# Building the child's command
# --------------------------------------------------------------------------------------------------


def _setpriv_args() -> list[str]:
    # Drop to nobody with no supplementary groups, no capabilities (not even inheritable or in the
    # bounding set) and no way to regain privileges through setuid binaries.
    return ["setpriv", f"--reuid={CHILD_UID}", f"--regid={CHILD_GID}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


def _bwrap_command(argv: Sequence[str], *, caps: _Capabilities, code_dir: Path, mounted_code: Path,
                   python_paths: Sequence[Path], limits: SandboxLimits, gpu: bool) -> list[str]:
    """``bwrap ... argv``: the host's filesystem read-only, private /tmp, /proc and /dev, no network.

    ``mounted_code`` is bound read-only at ``code_dir`` (a world-readable copy when the child's uid
    could not read the original).
    """
    # --as-pid-1: the command itself is the namespace's init, so bwrap waits for it directly and the
    # rusage (max RSS) reaches our wait4; with bwrap's own init in between it would be lost. When the
    # command exits, the kernel still kills whatever else runs in the namespace.
    command = ["bwrap", "--die-with-parent", "--unshare-net", "--unshare-pid", "--as-pid-1", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try"]
    if caps.bwrap_user_namespace:
        command += ["--unshare-user", "--uid", str(CHILD_UID), "--gid", str(CHILD_GID)]
        if _bwrap_supports("--disable-userns"):  # bubblewrap >= 0.8: no nested user namespaces
            command += ["--disable-userns"]
    # tmpfs lives in RAM outside RLIMIT_DATA, so it gets a size cap of its own (bubblewrap >= 0.7).
    size = ["--size", str(limits.memory_bytes)] if _bwrap_supports("--size") else []
    command += ["--ro-bind", "/", "/", *caps.bwrap_proc_args, "--dev", "/dev",
                "--perms", "1777", *size, "--tmpfs", "/tmp", "--perms", "1777", *size, "--tmpfs", "/dev/shm"]
    if gpu:
        for device in sorted(glob.glob("/dev/nvidia*")):
            command += ["--dev-bind", device, device]
    command += _visible_paths_args(code_dir, mounted_code, python_paths, dedicated_uid=caps.dedicated_uid)
    command += ["--chdir", str(code_dir)]
    if caps.dedicated_uid:
        command += _setpriv_args()
    return command + list(argv)


@functools.lru_cache(maxsize=None)
def _bwrap_supports(option: str) -> bool:
    try:
        done = subprocess.run(["bwrap", "--help"], capture_output=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option.encode() in done.stdout + done.stderr


def _visible_paths_args(code_dir: Path, mounted_code: Path, python_paths: Sequence[Path], *,
                        dedicated_uid: bool) -> list[str]:
    """bwrap arguments that make the interpreter, the python paths and the code reachable by the child.

    Two things hide them: the private /tmp (paths under it must be bound again), and, for a dedicated
    uid, a directory nobody may not traverse (a pyenv interpreter under /root, a 0700 temp dir).
    Such a directory is replaced by an empty tmpfs (hiding the rest of it, which is the point) and the
    paths the child needs are bound back inside it, read-only.
    """
    interpreter_roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                     sys.base_exec_prefix)}
    # (A missing path would make bwrap refuse to start; Python just skips it on sys.path.)
    needed = sorted((p for p in interpreter_roots | {Path(p).resolve() for p in python_paths} if p.exists()),
                    key=_depth)
    tmpfs_roots = [Path("/tmp"), Path("/dev/shm")]
    if dedicated_uid:
        for path in needed + [code_dir]:
            blocked = _first_untraversable_ancestor(path)
            if blocked is not None and not any(_is_within(blocked, root) for root in tmpfs_roots):
                tmpfs_roots.append(blocked)
    args: list[str] = []
    for root in sorted(set(tmpfs_roots) - {Path("/tmp"), Path("/dev/shm")}, key=_depth):
        args += ["--perms", "0755", "--tmpfs", str(root)]
    binds: list[tuple[Path, Path]] = [(p, p) for p in needed if any(_is_within(p, r) for r in tmpfs_roots)]
    binds.append((mounted_code, code_dir))
    bound: list[Path] = []
    created: set[Path] = set()
    for source, target in sorted(binds, key=lambda b: _depth(b[1])):
        # Directories between a tmpfs and the bind target do not exist there yet; bwrap would create
        # them 0700 (unreachable for nobody), so create them world-traversable first.
        for directory in reversed(target.parents):
            covering = _deepest_covering(directory, tmpfs_roots, bound)
            if covering is not None and covering[1] == "tmpfs" and directory not in created \
                    and directory != covering[0]:
                args += ["--perms", "0755", "--dir", str(directory)]
                created.add(directory)
        args += ["--ro-bind", str(source), str(target)]
        bound.append(target)
    return args


def _deepest_covering(path: Path, tmpfs_roots: list[Path], bound: list[Path]) -> Optional[tuple[Path, str]]:
    """The innermost mount (tmpfs or bind) that ``path`` lies in, or None for the host's /."""
    mounts = [(r, "tmpfs") for r in tmpfs_roots] + [(b, "bind") for b in bound]
    covering = [m for m in mounts if _is_within(path, m[0])]
    return max(covering, key=lambda m: _depth(m[0])) if covering else None


def _first_untraversable_ancestor(path: Path) -> Optional[Path]:
    for directory in reversed(path.parents):
        if not _child_can(directory, 0o1):
            return directory
    return None


def _child_can(path: Path, bits: int) -> bool:
    """Whether CHILD_UID/CHILD_GID has ``bits`` (e.g. 0o1 = x) on ``path``, by its mode bits."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid == CHILD_UID:
        return st.st_mode & (bits << 6) == bits << 6
    if st.st_gid == CHILD_GID:
        return st.st_mode & (bits << 3) == bits << 3
    return st.st_mode & bits == bits


def _tree_readable_by_child(root: Path) -> bool:
    for directory, subdirs, files in os.walk(root):
        if not _child_can(Path(directory), 0o5):
            return False
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink() and not _child_can(path, 0o4):
                return False
    return True


def _depth(path: Path) -> int:
    return len(path.parts)


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _base_env(*, python_paths: Sequence[Path], home: str) -> dict[str, str]:
    # Built from scratch, never copied from os.environ: the runner's environment holds the GitHub
    # App's private key and tokens.
    path = os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/sbin", "/usr/local/bin",
                                          "/usr/sbin", "/usr/bin", "/sbin", "/bin"]))
    env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1"}
    if python_paths:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in python_paths)
    return env


def _child_env(env: Optional[dict[str, str]], *, python_paths: Sequence[Path], home: str,
               gpu: bool) -> dict[str, str]:
    child_env = _base_env(python_paths=python_paths, home=home)
    extra = dict(env or {})
    gpus = extra.pop("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    child_env.update(extra)
    if gpu and gpus is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = gpus
    return child_env


def _rlimits(limits: SandboxLimits, *, dedicated_uid: bool) -> list[tuple[int, int]]:
    rlimits = [(resource.RLIMIT_DATA, limits.memory_bytes), (resource.RLIMIT_CPU, limits.cpu_seconds),
               (resource.RLIMIT_FSIZE, limits.file_size_bytes), (resource.RLIMIT_CORE, 0)]
    if dedicated_uid:
        # RLIMIT_NPROC counts every process of the uid; with the runner's own uid it would break the runner.
        rlimits.append((resource.RLIMIT_NPROC, limits.processes))
    return rlimits


def _prlimit_args(rlimits: list[tuple[int, int]]) -> list[str]:
    names = {resource.RLIMIT_DATA: "--data", resource.RLIMIT_CPU: "--cpu", resource.RLIMIT_FSIZE: "--fsize",
             resource.RLIMIT_CORE: "--core", resource.RLIMIT_NPROC: "--nproc"}
    return ["prlimit", *(f"{names[which]}={value}:{value}" for which, value in rlimits), "--"]


def _set_rlimits_callback(rlimits: list[tuple[int, int]]) -> Callable[[], None]:
    def set_rlimits() -> None:  # runs in the forked child, before exec
        for which, value in rlimits:
            resource.setrlimit(which, (value, value))
    return set_rlimits


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def run_sandboxed(argv: list[str], *, code_dir: Path, limits: SandboxLimits = SandboxLimits(),
                  env: Optional[dict[str, str]] = None, python_paths: Sequence[Path] = (),
                  stdin: Optional[bytes] = None, gpu: bool = False) -> SandboxResult:
    """Run ``argv`` (with ``code_dir`` as its working directory) in the sandbox and collect the outcome.

    ``python_paths`` become the child's PYTHONPATH; ``env`` adds variables (OMP_NUM_THREADS...) to an
    otherwise empty environment. Without bubblewrap the child runs on a copy of ``code_dir``: paths
    under it in ``argv`` and ``python_paths`` are rewritten to the copy.
    """
    code_dir = Path(code_dir).resolve()
    if not code_dir.is_dir():
        raise ValueError(f"code_dir {code_dir} is not a directory")
    caps = _capabilities()
    python_paths = [Path(p).resolve() for p in python_paths]
    warnings = list(caps.warnings)  # logged once, when probed
    rlimits = _rlimits(limits, dedicated_uid=caps.dedicated_uid)
    with tempfile.TemporaryDirectory(prefix="torchreview-sandbox-") as scratch_name:
        scratch = Path(scratch_name)
        scratch.chmod(0o755)  # the child (nobody) must reach the code copy inside
        try:
            if caps.backend == "bubblewrap":
                mounted_code = code_dir
                if caps.dedicated_uid and not _tree_readable_by_child(code_dir):
                    mounted_code = _read_only_copy(code_dir, scratch / "code")
                command = _bwrap_command(argv, caps=caps, code_dir=code_dir, mounted_code=mounted_code,
                                         python_paths=python_paths, limits=limits, gpu=gpu)
                child_env = _child_env(env, python_paths=python_paths, home="/tmp", gpu=gpu)
                cwd = None  # bwrap --chdir
            else:
                command, child_env, cwd = _fallback_command(argv, caps=caps, code_dir=code_dir, scratch=scratch,
                                                            python_paths=python_paths, env=env, gpu=gpu)
            tag = None
            if not caps.layers["pid_namespace"]:
                # Without a PID namespace, an orphan that left the session is only recognisable by this.
                tag = uuid.uuid4().hex
                child_env[_RUN_TAG_VARIABLE] = tag
            if shutil.which("prlimit"):
                command = _prlimit_args(rlimits) + command
                preexec = None
            else:
                preexec = _set_rlimits_callback(rlimits)
            result = _run_and_collect(command, env=child_env, cwd=cwd, stdin=stdin, limits=limits,
                                      preexec=preexec, run_tag=tag)
        finally:
            _make_removable(scratch)
    result.layers = dict(caps.layers)
    result.warnings = warnings + result.warnings
    for warning in result.warnings[len(warnings):]:
        log.warning("sandbox: %s", warning)
    return result


def _fallback_command(argv: Sequence[str], *, caps: _Capabilities, code_dir: Path, scratch: Path,
                      python_paths: Sequence[Path], env: Optional[dict[str, str]],
                      gpu: bool) -> tuple[list[str], dict[str, str], str]:
    """Without bubblewrap: a read-only copy of the code, a private HOME/TMPDIR, unshare and setpriv."""
    code_copy = _read_only_copy(code_dir, scratch / "code")

    def relocate(value: str) -> str:
        return str(code_copy) + value[len(str(code_dir)):] if _is_within(Path(value), code_dir) else value

    home = scratch / "home"
    home.mkdir(mode=0o700)
    if caps.dedicated_uid:
        os.chown(home, CHILD_UID, CHILD_GID)
    child_env = _child_env(env, python_paths=[Path(relocate(str(p))) for p in python_paths], home=str(home),
                           gpu=gpu)
    child_env["TMPDIR"] = str(home)
    command = list(caps.unshare_args) + (_setpriv_args() if caps.dedicated_uid else [])
    command += [relocate(arg) if arg.startswith(str(code_dir)) else arg for arg in argv]
    return command, child_env, str(code_copy)


def _read_only_copy(source: Path, destination: Path) -> Path:
    """A copy of ``source`` that everyone may read and nobody but root may write."""
    shutil.copytree(source, destination, symlinks=True)
    for directory, subdirs, files in os.walk(destination, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o555 if mode & 0o111 else 0o444)
        os.chmod(directory, 0o555)
    return destination


def _make_removable(root: Path) -> None:
    # Read-only copies (and files a non-root child made read-only) would stop rmtree for non-root runners.
    for directory, subdirs, files in os.walk(root):
        for name in subdirs:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                try:
                    os.chmod(path, 0o700)
                except OSError:
                    pass


class _CappedReader(threading.Thread):
    """Drains a pipe, keeping at most ``cap`` bytes; the rest is read and dropped so the child never blocks."""

    def __init__(self, pipe, cap: int):
        super().__init__(daemon=True)
        self.pipe, self.cap = pipe, cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def run(self) -> None:
        fd = self.pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except OSError:
                break
            if not chunk:
                break
            room = self.cap - self.kept
            if len(chunk) > room:
                self.truncated = True
                chunk = chunk[:max(room, 0)]
            if chunk:
                self.chunks.append(chunk)
                self.kept += len(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


def _feed_stdin(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the child did not want it all
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _run_and_collect(command: list[str], *, env: dict[str, str], cwd: Optional[str], stdin: Optional[bytes],
                     limits: SandboxLimits, preexec: Optional[Callable[[], None]],
                     run_tag: Optional[str]) -> SandboxResult:
    started = time.monotonic()
    # start_new_session: the child leads its own session and process group, so one killpg reaches the
    # whole tree (the fallback when there is no PID namespace) and the runner's terminal never does.
    proc = subprocess.Popen(command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=preexec, close_fds=True)
    readers = [_CappedReader(proc.stdout, limits.output_bytes), _CappedReader(proc.stderr, limits.output_bytes)]
    for reader in readers:
        reader.start()
    if stdin is not None:
        threading.Thread(target=_feed_stdin, args=(proc.stdin, stdin), daemon=True).start()

    timed_out = _wait_for_exit_or_deadline(proc.pid, started + limits.timeout_s)
    # The leader is a zombie now (or still running, on timeout): either way its pid, and so the
    # process group id and session id, cannot be reused until we reap it below.
    survivors = _kill_process_tree(proc.pid, run_tag)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall_seconds = time.monotonic() - started

    warnings = []
    if survivors:
        warnings.append(f"processes {sorted(survivors)} of the sandboxed child survived SIGKILL")
    for reader in readers:
        reader.join(timeout=5)
        if reader.is_alive():
            warnings.append("a sandboxed process kept the output pipe open after the kill; output may be incomplete")
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    return SandboxResult(returncode=proc.returncode, stdout=readers[0].text(), stderr=readers[1].text(),
                         timed_out=timed_out, output_truncated=any(r.truncated for r in readers),
                         wall_seconds=wall_seconds, max_rss_bytes=usage.ru_maxrss * 1024, layers={},
                         warnings=warnings)


def _wait_for_exit_or_deadline(pid: int, deadline: float) -> bool:
    """Wait without reaping (WNOWAIT) until ``pid`` exits (False) or the deadline passes (True)."""
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(_POLL_INTERVAL_S)


def _kill_process_tree(leader: int, run_tag: Optional[str]) -> set[int]:
    """SIGKILL everything the child started; return the pids that are still alive afterwards.

    With a PID namespace, killing the leader (bwrap or unshare) tears the namespace down. Without one,
    descendants are found by session id (kept across fork and daemonizing, unless they call setsid),
    by the parent chain, and by ``run_tag`` in their environment (which survives setsid and orphaning).
    """

    def members() -> set[tuple[int, int]]:
        return _session_members(leader) | (_tagged(run_tag) if run_tag else set())

    targets = members() | _descendants(leader)
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _kill_all(targets)
    deadline = time.monotonic() + 2.0
    while True:
        alive = {p for p in targets | members() if p[0] != leader and _is_alive(*p)}
        if not alive or time.monotonic() > deadline:
            return {pid for pid, _ in alive}
        _kill_all(alive)
        time.sleep(0.05)


def _kill_all(processes: set[tuple[int, int]]) -> None:
    for pid, start_time in processes:
        if _is_alive(pid, start_time):  # the start time guards against a recycled pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _proc_stats() -> dict[int, tuple[str, int, int, int]]:
    """pid -> (state, ppid, session, start time) for every process, from /proc/<pid>/stat."""
    stats = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()  # the command name may contain spaces and parentheses
        stats[int(entry)] = (fields[0], int(fields[1]), int(fields[3]), int(fields[19]))
    return stats


def _session_members(session: int) -> set[tuple[int, int]]:
    return {(pid, s[3]) for pid, s in _proc_stats().items() if s[2] == session and s[0] not in "ZX"}


def _tagged(run_tag: str) -> set[tuple[int, int]]:
    needle = f"{_RUN_TAG_VARIABLE}={run_tag}".encode()
    found = set()
    for pid, s in _proc_stats().items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add((pid, s[3]))
        except OSError:
            continue
    return found


def _descendants(root: int) -> set[tuple[int, int]]:
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, s in stats.items():
        children.setdefault(s[1], []).append(pid)
    found, frontier = set(), [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.add((child, stats[child][3]))
            frontier.append(child)
    return found


def _is_alive(pid: int, start_time: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return False
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0] not in "ZX" and int(fields[19]) == start_time
