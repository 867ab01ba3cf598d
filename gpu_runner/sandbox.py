"""Run untrusted pull-request code in a child process that can reach nothing but what it is given.

The smoke trainer imports and runs a PR's model code, which is as untrusted as code gets. The required
layers, all provided by bubblewrap (``bwrap``):

* ``network``: its own network namespace (only a loopback nobody listens on; abstract unix sockets are
  per namespace too);
* ``pid_namespace``: its own PID namespace and a fresh ``/proc`` of it: no other process is visible,
  and the wall-clock timeout kills the whole tree;
* ``uid``: as root, a uid of the run's own from a pool (``RUN_UID_BASE``; setpriv, no capabilities, no
  groups), so that one run's processes never count against another's process limit; otherwise ``nobody``
  in a user namespace of its own, with every capability dropped, its process limit applied inside that
  namespace (where only this run's processes count);
* ``filesystem``: a fresh root that holds an ALLOWLIST, never the host's ``/``: the system and Python
  directories (``/usr``, the interpreter's prefixes, the venv) and the code read-only, a minimal
  ``/dev``, size-capped private ``/tmp`` and ``/dev/shm``; nothing of ``/etc`` but the loader's cache and
  a two-line ``passwd``; no home, ``/run``, ``/var``, data or key directory. The runner refuses when a
  path it knows to be secret (``secret_paths``) lies inside something it would bind;
* ``seccomp``: a deny-list (``gpu_runner.syscall_filter``): no ptrace, no nested namespaces, no mount,
  keyring, bpf, perf...;
* ``rlimits``: one memory budget (``RLIMIT_DATA`` plus the tmpfs sizes add up to ``memory_bytes``; the
  filter denies the mappings RLIMIT_DATA does not count, the stack's hard limit is small, ``/dev`` is
  read-only), CPU seconds, file size, processes (``RLIMIT_NPROC``), no core dumps;
* ``clean_env``: an environment built from nothing.

FAIL CLOSED: when a required layer is unavailable, ``run_sandboxed`` raises ``SandboxRefused`` naming
what is missing and what the operator must enable. Only an explicit opt-in by the operator,
``TORCHREVIEW_SANDBOX=weak`` (for a trusted single-user machine), lets it run with what is left
(``unshare``/``setpriv``, or a plain subprocess), with every missing layer listed in the result's
``warnings``. The setting is the operator's (an environment variable of the runner), never a
repository's: a repository must not be able to weaken the sandbox its own code runs in.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import pwd
import random
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
from typing import Callable, Iterator, Optional, Sequence

from gpu_runner import syscall_filter

log = logging.getLogger(__name__)

# The uid/gid the child runs as (inside its user namespace, or for real when the runner is root).
CHILD_UID = 65534
CHILD_GID = 65534
# A root runner gives each run its own uid (and gid) from this pool instead of nobody: the kernel charges
# RLIMIT_NPROC per uid, and a hostile run holding its whole process limit made a concurrent run of the same
# uid fail with EAGAIN. Far above the usual system, user and subordinate (/etc/subuid) ranges.
RUN_UID_BASE = 1_500_000_000
RUN_UID_COUNT = 4096

LAYER_NAMES = ("network", "pid_namespace", "uid", "filesystem", "readonly_code", "private_tmp", "seccomp",
               "rlimits", "clean_env")
# Without any of these the runner refuses, unless the operator opted into a weak sandbox.
REQUIRED_LAYERS = ("network", "pid_namespace", "uid", "filesystem", "seccomp", "rlimits", "clean_env")

POLICY_VARIABLE = "TORCHREVIEW_SANDBOX"
SECRET_PATHS_VARIABLE = "TORCHREVIEW_SECRET_PATHS"
RESULT_FD_VARIABLE = "TORCHREVIEW_RESULT_FD"  # the child's end of the result channel
CODE_DIR_VARIABLE = "TORCHREVIEW_CODE_DIR"  # where the child finds the code (a copy in weak modes)

REMEDY = ("install bubblewrap (`apt-get install bubblewrap`) and let it create namespaces: run the executor "
          "as root, or allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; "
          "kernel.unprivileged_userns_clone=1 where it exists; on Ubuntu 23.10+ "
          "kernel.apparmor_restrict_unprivileged_userns=0); in a container, the seccomp profile "
          "deploy/seccomp/torchreview-executor.json and an unconfined AppArmor profile (deploy/README.md)")
WEAK_OPT_IN = (f"on a trusted single-user machine only, {POLICY_VARIABLE}=weak runs PR code with the layers "
               "that are left")

_PROBE_TIMEOUT_S = 20.0
_POLL_INTERVAL_S = 0.02
_READ_CHUNK = 64 << 10
_RUN_TAG_VARIABLE = "TORCHREVIEW_SANDBOX_RUN"  # only set where there is no PID namespace
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
_GPU_SYSFS = ("/sys/bus", "/sys/class", "/sys/dev", "/sys/devices")
# Sets RLIMIT_NPROC inside the sandbox's user namespace, then runs the child: the kernel counts a process
# against the limit of its own namespace's uid, and against the limit its namespace was created under one
# level up (bubblewrap's), where every run of the runner's uid counts. So bubblewrap keeps the runner's
# limit and the run's own applies here, to this run's processes only.
_NPROC_SHIM = ("import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); "
               "os.execvp(sys.argv[2], sys.argv[2:])")


def _passwd(uid: int) -> str:
    return f"root:x:0:0:root:/:/usr/sbin/nologin\nnobody:x:{uid}:{uid}:nobody:/tmp:/usr/sbin/nologin\n"


def _group(gid: int) -> str:
    return f"root:x:0:\nnogroup:x:{gid}:\n"


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 300.0  # wall clock; kills the whole process tree
    # The child's whole budget: RLIMIT_DATA gets what the private /tmp and /dev/shm do not.
    # (RLIMIT_DATA, NOT RLIMIT_AS: torch's virtual reservations would break RLIMIT_AS.)
    memory_bytes: int = 4 << 30
    cpu_seconds: int = 900  # RLIMIT_CPU
    file_size_bytes: int = 64 << 20  # RLIMIT_FSIZE
    processes: int = 512  # RLIMIT_NPROC (threads count too)
    output_bytes: int = 1 << 20  # cap on captured stdout and on stderr each
    result_bytes: int = 4 << 20  # cap on the result channel
    # A GPU run's RLIMIT_DATA gets this much more: the CUDA driver and its libraries (cuBLAS, cuDNN) map private
    # writable host memory for every kernel image they load, lazily, as the models first use them, which over a job
    # of many targets outgrew a 4 GiB budget on an H200 while the same job on CPU fit (bench/smoke_real.py
    # --device cuda). Most of it is address space never touched; the container's memory limit bounds the rest.
    gpu_driver_bytes: int = 8 << 30

    @property
    def tmp_bytes(self) -> int:
        return max(self.memory_bytes // 4, 1 << 20)

    @property
    def shm_bytes(self) -> int:
        return max(self.memory_bytes // 16, 1 << 20)

    @property
    def data_bytes(self) -> int:
        return max(self.memory_bytes - self.tmp_bytes - self.shm_bytes, 16 << 20)


@dataclass
class SandboxResult:
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    wall_seconds: float
    max_rss_bytes: int  # the child's high-water mark (os.wait4 rusage, which covers reaped descendants)
    layers: dict[str, bool]  # LAYER_NAMES -> applied
    warnings: list[str] = field(default_factory=list)
    channel: bytes = b""  # what the child wrote to the result channel (result_channel=True)
    mode: str = ""  # "bubblewrap+setpriv", "bubblewrap+userns", "weak: unshare", "weak: plain"


class SandboxRefused(RuntimeError):
    """A required layer is unavailable and the operator has not opted into a weak sandbox."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("refused to run pull-request code: " + "; ".join(self.problems) + f". ({WEAK_OPT_IN}.)")


def sandbox_policy(value: Optional[str] = None) -> str:
    """``strict`` (the default: refuse without every required layer) or ``weak`` (the operator's opt-in)."""
    raw = os.environ.get(POLICY_VARIABLE, "") if value is None else value
    text = raw.strip().lower()
    if text in ("weak", "allow-weak"):
        return "weak"
    if text not in ("", "strict", "required"):
        log.error("sandbox: %s=%r is not strict or weak; using strict", POLICY_VARIABLE, raw)
    return "strict"


# --------------------------------------------------------------------------------------------------
# What this machine offers
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Capabilities:
    """The outcome of probing: which backend to use, how, and which layers it provides."""

    backend: str  # "bubblewrap" | "unshare" | "plain"
    layers: dict[str, bool]
    warnings: tuple[str, ...]  # what a weak mode lacks (in the report, loudly)
    problems: tuple[str, ...] = ()  # why required layers are missing, with the remedy (for refusals)
    # The child runs as CHILD_UID in the kernel's eyes (setpriv as root), not only in a user namespace.
    dedicated_uid: bool = False
    fresh_proc: bool = True  # bubblewrap could mount a procfs of the child's PID namespace
    bwrap_user_namespace: bool = False  # non-root: nobody in a user namespace of its own
    unshare_args: tuple[str, ...] = ()  # weak fallback: "unshare --net --pid ..." prefix

    @property
    def mode(self) -> str:
        if self.backend == "bubblewrap":
            return "bubblewrap+" + ("setpriv" if self.dedicated_uid else "userns")
        return "weak: " + self.backend


_capabilities_lock = threading.Lock()
_cached_capabilities: Optional[_Capabilities] = None


def available_layers() -> dict[str, bool]:
    """Which isolation layers ``run_sandboxed`` applies on this machine (probed once per process)."""
    return dict(_capabilities().layers)


def check_sandbox(policy: Optional[str] = None) -> list[str]:
    """Why the runner would refuse to run PR code here ([] when it would run); for start-up checks."""
    caps = _capabilities()
    if sandbox_policy(policy) == "weak":
        return []
    package = Path(__file__).resolve().parent  # what the runner binds (gpu_runner.runner.PACKAGE_DIR)
    return list(caps.problems) + _secret_problems(_visible_sources(caps, code_dir=None, python_paths=(),
                                                                   packages=(package,), gpu=False))


def _capabilities() -> _Capabilities:
    global _cached_capabilities
    with _capabilities_lock:
        if _cached_capabilities is None:
            _cached_capabilities = _probe()
            for problem in _cached_capabilities.problems:
                log.warning("sandbox: %s", problem)
        return _cached_capabilities


def _seccomp_state() -> tuple[bool, str]:
    try:
        syscall_filter.compiled_filter()
        return True, ""
    except syscall_filter.FilterUnavailable as exc:
        return False, str(exc)


def _probe(*, allow_bubblewrap: bool = True, allow_unshare: bool = True,
           allow_uid_switch: bool = True) -> _Capabilities:
    """Find the strongest working backend. The ``allow_*`` switches let tests exercise the fallbacks."""
    is_root = os.geteuid() == 0
    can_switch_uid = allow_uid_switch and is_root and shutil.which("setpriv") is not None
    bwrap_failure = "bubblewrap is not installed"
    if not allow_bubblewrap:
        bwrap_failure = "bubblewrap is disabled"
    elif shutil.which("bwrap"):
        outcome = _probe_bubblewrap(can_switch_uid=can_switch_uid)
        if isinstance(outcome, _Capabilities):
            return outcome
        bwrap_failure = outcome
    return _probe_without_bubblewrap(bwrap_failure, is_root=is_root, can_switch_uid=can_switch_uid,
                                     allow_unshare=allow_unshare)


def _probe_bubblewrap(*, can_switch_uid: bool) -> "_Capabilities | str":
    """A bubblewrap backend that really runs this interpreter, or why bubblewrap cannot be used."""
    errors = []
    # Root prefers a real uid switch (setpriv inside); otherwise nobody inside a user namespace.
    attempts = [(True, False), (False, True)] if can_switch_uid else [(False, True)]
    # A fresh procfs is refused in some containers (a masked /proc): then the child gets no /proc at all,
    # never the host's.
    for fresh_proc in (True, False):
        for dedicated_uid, user_namespace in attempts:
            caps = _Capabilities("bubblewrap", dict.fromkeys(LAYER_NAMES, True), (), dedicated_uid=dedicated_uid,
                                 fresh_proc=fresh_proc, bwrap_user_namespace=user_namespace)
            error = _try_sandboxed_interpreter(caps)
            if error is None:
                return _describe_bubblewrap(caps)
            errors.append(f"{'setpriv' if dedicated_uid else 'user namespace'}"
                          f"{'' if fresh_proc else ', no /proc'}: {error}")
    return "bubblewrap cannot create its sandbox here (" + "; ".join(errors) + ")"


def _describe_bubblewrap(caps: _Capabilities) -> _Capabilities:
    layers = dict.fromkeys(LAYER_NAMES, True)
    warnings, problems = [], []
    seccomp_ok, seccomp_error = _seccomp_state()
    if not seccomp_ok:
        layers["seccomp"] = False
        problems.append(f"seccomp: {seccomp_error}")
        warnings.append(f"no seccomp filter: {seccomp_error}; the child may ptrace, create namespaces, use bpf...")
    if not caps.dedicated_uid and os.geteuid() == 0:
        # nobody in a user namespace of root's maps to root outside: a kernel escape would be root.
        layers["uid"] = False
        problems.append("uid: the runner is root but setpriv could not switch the child to nobody (install "
                        "util-linux's setpriv), so the child would be root outside its user namespace")
        warnings.append("uid: the child is nobody only inside a user namespace; outside it is root")
    if not caps.fresh_proc:
        warnings.append("no /proc in the sandbox: bubblewrap cannot mount a procfs here (a masked /proc: Docker "
                        "`--security-opt systempaths=unconfined`, Kubernetes `procMount: Unmasked`)")
    return _Capabilities("bubblewrap", layers, tuple(warnings), tuple(problems), dedicated_uid=caps.dedicated_uid,
                         fresh_proc=caps.fresh_proc, bwrap_user_namespace=caps.bwrap_user_namespace)


def _probe_without_bubblewrap(bwrap_failure: str, *, is_root: bool, can_switch_uid: bool,
                              allow_unshare: bool) -> _Capabilities:
    layers = dict.fromkeys(LAYER_NAMES, True)
    warnings = []
    problems = [f"filesystem: {bwrap_failure}, and nothing else can give the child a filesystem view without "
                f"the runner's files; {REMEDY}"]
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
                        "the child can reach the network, loopback and unix sockets included")
        problems.append(f"network: no network namespace ({net_error})")
    if pid_error is not None:
        layers["pid_namespace"] = False
        warnings.append(f"no PID namespace: {bwrap_failure}; unshare --pid failed ({pid_error}); the child sees "
                        "the runner's processes, and the timeout kills its session, process tree and the processes "
                        "carrying its environment tag instead, which a descendant that calls setsid() and rewrites "
                        "its environment can escape")
        problems.append(f"pid_namespace: no PID namespace ({pid_error})")
    dedicated_uid = False
    if can_switch_uid:
        uid_error = _try_command([*_setpriv_args(), *_interpreter_check()])
        dedicated_uid = uid_error is None
    else:
        uid_error = "the runner is not root" if not is_root else "setpriv is not available"
    me = _user_name(os.geteuid())
    if not dedicated_uid:
        layers["uid"] = False
        layers["readonly_code"] = False
        warnings.append(f"no dedicated uid: setpriv to uid {CHILD_UID} failed ({uid_error}); the child runs as "
                        f"{me}, can read what {me} can read and signal {me}'s processes")
        warnings.append("code not read-only: the child runs on a copy of the code, marked read-only, but as "
                        f"{me} it can make it writable again (the original stays intact)")
        problems.append(f"uid: the child would run as {me} ({uid_error})")
    layers["filesystem"] = False
    layers["private_tmp"] = False
    warnings.append(f"no filesystem allowlist: {bwrap_failure}; the child sees the whole filesystem with "
                    f"{'nobody' if dedicated_uid else me}'s permissions, the host's /tmp included (HOME and TMPDIR "
                    "point to a fresh 0700 directory of its own)")
    seccomp_ok, seccomp_error = _seccomp_state()
    if not seccomp_ok:
        layers["seccomp"] = False
        warnings.append(f"no seccomp filter: {seccomp_error}")
        problems.append(f"seccomp: {seccomp_error}")
    if is_root and not dedicated_uid:
        layers["rlimits"] = False  # root ignores RLIMIT_NPROC
        warnings.append("rlimits: the child runs as root, which RLIMIT_NPROC does not limit")
        problems.append("rlimits: no process limit for a child running as root")
    return _Capabilities("unshare" if unshare_args else "plain", layers, tuple(warnings), tuple(problems),
                         dedicated_uid=dedicated_uid, unshare_args=tuple(unshare_args))


def _try_sandboxed_interpreter(caps: _Capabilities) -> Optional[str]:
    """None when this interpreter starts inside the sandbox ``caps`` describes, else the error."""
    with tempfile.TemporaryDirectory(prefix="torchreview-probe-") as scratch:
        scratch_dir = Path(scratch)
        scratch_dir.chmod(0o755)
        code_dir = scratch_dir / "code"
        code_dir.mkdir(mode=0o755)
        command = _bwrap_command(_interpreter_check(), caps=caps, code_dir=code_dir, mounted_code=code_dir,
                                 python_paths=(), packages=(), limits=SandboxLimits(), gpu=False,
                                 scratch=scratch_dir, seccomp_fd=None, cwd="/tmp")
        return _try_command(command)


def _interpreter_check() -> list[str]:
    # Exits non-zero unless this interpreter's Python version starts.
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
# What the child may see
# --------------------------------------------------------------------------------------------------


def secret_paths() -> list[Path]:
    """Paths the child must never see: the App's key, the data dir (embedded broker), the runner's home
    (~/.ssh...), runtime sockets, and whatever the operator lists in TORCHREVIEW_SECRET_PATHS."""
    found = [Path("/run"), Path("/var"), Path("/etc"), Path("/root"), Path("/home")]
    for variable in ("GITHUB_PRIVATE_KEY_PATH", "HOME", "XDG_RUNTIME_DIR"):
        if os.environ.get(variable):
            found.append(Path(os.environ[variable]))
    found.append(Path(os.environ.get("TORCHREVIEW_DATA_DIR") or ".torchreview-data"))
    found.extend(Path(p) for p in os.environ.get(SECRET_PATHS_VARIABLE, "").split(os.pathsep) if p)
    # Only what exists can be read (the worker creates its data dir at start, before any smoke run).
    return [Path(os.path.abspath(p)) for p in found if os.path.lexists(p)]


def _visible_sources(caps: _Capabilities, *, code_dir: Optional[Path], python_paths: Sequence[Path],
                     packages: Sequence[Path], gpu: bool) -> list[Path]:
    """Every host path the child can read (bubblewrap binds); the whole filesystem otherwise."""
    if caps.backend != "bubblewrap":
        return [Path("/")]
    sources = [source for source, _ in _binds(code_dir, code_dir, python_paths, packages)]
    return sources + ([Path(d) for d in _GPU_SYSFS if os.path.isdir(d)] if gpu else [])


def _secret_problems(sources: Sequence[Path]) -> list[str]:
    problems = []
    for secret in secret_paths():
        for source in sources:
            if source != Path("/") and _is_within(secret, source):
                problems.append(f"filesystem: {secret} (secret) would be visible to the child through {source}; "
                                f"move it out (or the Python environment / code away from it)")
    return problems


def _python_roots() -> list[Path]:
    """The interpreter's prefixes and every site-packages on its path (a .pth file may add one elsewhere)."""
    roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots.add(Path(os.path.realpath(sys.executable)).parent.parent)
    roots.update(Path(p).resolve() for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages"))
    return sorted(roots, key=_depth)


def _binds(code_dir: Optional[Path], mounted_code: Optional[Path], python_paths: Sequence[Path],
           packages: Sequence[Path]) -> list[tuple[Path, Path]]:
    """(host source, path in the sandbox) of every read-only bind, shallowest first, without redundancy."""
    binds: list[tuple[Path, Path]] = []
    for directory in _SYSTEM_DIRS:
        path = Path(directory)
        if path.is_dir() and not path.is_symlink():
            binds.append((path, path))
    for name in _LOADER_FILES:
        if os.path.lexists(name):
            binds.append((Path(name), Path(name)))
    wanted = [p for p in _python_roots() + [Path(p).resolve() for p in python_paths] if os.path.exists(p)]
    wanted += [Path(p).resolve() for p in packages]
    for path in sorted(wanted, key=_depth):
        if not any(_is_within(path, target) for _, target in binds):
            binds.append((path, path))
    if code_dir is not None and mounted_code is not None:
        binds.append((mounted_code, code_dir))
    return sorted(binds, key=lambda b: _depth(b[1]))


# --------------------------------------------------------------------------------------------------
# Building the child's command
# --------------------------------------------------------------------------------------------------


def _setpriv_args(uid: int = CHILD_UID) -> list[str]:
    # Drop to ``uid`` with no supplementary groups, no capabilities (not even inheritable or in the
    # bounding set) and no way to regain privileges through setuid binaries.
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


def _bwrap_command(argv: Sequence[str], *, caps: _Capabilities, code_dir: Path, mounted_code: Path,
                   python_paths: Sequence[Path], packages: Sequence[Path], limits: SandboxLimits, gpu: bool,
                   scratch: Path, seccomp_fd: Optional[int], cwd: str, child_uid: int = CHILD_UID) -> list[str]:
    """``bwrap ... argv``: a fresh root holding only the allowlist, no network, its own PID namespace.
    ``child_uid``: the run's uid when the runner is root (setpriv)."""
    # --as-pid-1: the command itself is the namespace's init, so bwrap waits for it directly and the
    # rusage (max RSS) reaches our wait4, and nothing inside can SIGKILL it. When it exits, the kernel
    # kills whatever else runs in the namespace.
    command = ["bwrap", "--die-with-parent", "--unshare-net", "--unshare-pid", "--as-pid-1", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--new-session", "--hostname", "sandbox"]
    if caps.bwrap_user_namespace:
        command += ["--unshare-user", "--uid", str(CHILD_UID), "--gid", str(CHILD_GID), "--disable-userns"]
    # Symlinked system dirs (merged /usr) are recreated as symlinks; the rest comes from the allowlist.
    for directory in _SYSTEM_DIRS:
        if os.path.islink(directory):
            command += ["--symlink", os.readlink(directory), directory]
    # /tmp and /dev/shm are RAM: their sizes come out of the memory budget (see SandboxLimits).
    command += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    command += ["--perms", "0755", "--tmpfs", "/dev"]
    # A minimal /dev: no /dev/zero (MAP_SHARED of it is shared memory outside the budget), no tty.
    for device in ("/dev/null", "/dev/full", "/dev/random", "/dev/urandom"):
        command += ["--dev-bind", device, device]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        command += ["--symlink", target, f"/dev/{name}"]
    command += ["--perms", "1777", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm"]
    if gpu:
        for device in sorted(glob.glob("/dev/nvidia*")):
            command += ["--dev-bind", device, device]
        # The driver and NVML look up the devices in sysfs (hardware descriptions, nothing secret).
        command += ["--perms", "0755", "--dir", "/sys"]
        for directory in _GPU_SYSFS:
            if os.path.isdir(directory):
                command += ["--ro-bind", directory, directory]
    if caps.fresh_proc:
        command += ["--proc", "/proc"]
    command += ["--perms", "0755", "--dir", "/etc"]  # else bwrap makes it 0700: unreadable for nobody
    for name, text in (("passwd", _passwd(child_uid)), ("group", _group(child_uid))):
        path = scratch / name
        path.write_text(text)
        path.chmod(0o444)
        command += ["--ro-bind", str(path), f"/etc/{name}"]
    created = {Path("/"), Path("/tmp"), Path("/dev"), Path("/etc")}
    for source, target in _binds(code_dir, mounted_code, python_paths, packages):
        # Parents a bind needs are created world-traversable (bwrap would make them 0700 for nobody).
        for parent in reversed(target.parents):
            if parent not in created:
                command += ["--perms", "0755", "--dir", str(parent)]
                created.add(parent)
        command += ["--ro-bind", str(source), str(target)]
        created.add(target)
    # The skeleton (/, and the directories made for the binds) and /dev are tmpfs mounts the child would own
    # in a user namespace, without a size cap (RAM outside the budget): read-only, only /tmp and /dev/shm
    # stay writable.
    command += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", cwd]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    if caps.bwrap_user_namespace:
        command += [sys.executable, "-I", "-c", _NPROC_SHIM, str(limits.processes)]
    if caps.dedicated_uid:
        command += _setpriv_args(child_uid)
    return command + list(argv)


def _child_can(path: Path, bits: int, uid: int) -> bool:
    """Whether ``uid`` (its gid the same number) has ``bits`` (e.g. 0o1 = x) on ``path``, by its mode bits."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid == uid:
        return st.st_mode & (bits << 6) == bits << 6
    if st.st_gid == uid:
        return st.st_mode & (bits << 3) == bits << 3
    return st.st_mode & bits == bits


def _tree_readable_by_child(root: Path, uid: int) -> bool:
    for directory, subdirs, files in os.walk(root):
        if not _child_can(Path(directory), 0o5, uid):
            return False
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink() and not _child_can(path, 0o4, uid):
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
           "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}
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


# The stack is not data either: its soft limit stays the usual 8 MiB (glibc sizes thread stacks by it, and
# those count as data), and the child may raise it to no more than this.
STACK_HARD_BYTES = 64 << 20
_STACK_SOFT_BYTES = 8 << 20
# Open files, sockets and pipes: each socket may queue a few hundred KiB of kernel memory that no limit of
# the child's counts (containers often allow a million descriptors). Training needs a few dozen.
MAX_OPEN_FILES = 4096


def _rlimits(limits: SandboxLimits, *, gpu: bool = False) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) for the child. RLIMIT_NPROC in every mode: as nobody it counts the sandbox's
    processes (in a user namespace, those of its nobody, and all of the runner uid's processes one level up)."""
    data = limits.data_bytes + (limits.gpu_driver_bytes if gpu else 0)
    return [(resource.RLIMIT_DATA, data, data),
            (resource.RLIMIT_STACK, _STACK_SOFT_BYTES, STACK_HARD_BYTES),
            (resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
            (resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES),
            (resource.RLIMIT_NPROC, limits.processes, limits.processes)]


def _prlimit_args(rlimits: list[tuple[int, int, int]]) -> list[str]:
    names = {resource.RLIMIT_DATA: "--data", resource.RLIMIT_STACK: "--stack", resource.RLIMIT_CPU: "--cpu",
             resource.RLIMIT_FSIZE: "--fsize", resource.RLIMIT_CORE: "--core", resource.RLIMIT_NOFILE: "--nofile",
             resource.RLIMIT_NPROC: "--nproc"}
    return ["prlimit", *(f"{names[which]}={soft}:{hard}" for which, soft, hard in rlimits), "--"]


def _set_rlimits_callback(rlimits: list[tuple[int, int, int]]) -> Callable[[], None]:
    def set_rlimits() -> None:  # runs in the forked child, before exec
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))
    return set_rlimits


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def run_sandboxed(argv: list[str], *, code_dir: Path, limits: SandboxLimits = SandboxLimits(),
                  env: Optional[dict[str, str]] = None, python_paths: Sequence[Path] = (),
                  packages: Sequence[Path] = (), stdin: Optional[bytes] = None, gpu: bool = False,
                  result_channel: bool = False, private_cwd: bool = False,
                  policy: Optional[str] = None) -> SandboxResult:
    """Run ``argv`` in the sandbox and collect the outcome; raise ``SandboxRefused`` rather than run weakly.

    ``python_paths`` become the child's PYTHONPATH (each bound read-only); ``packages`` are package
    directories bound alone, their parent on PYTHONPATH (the rest of that parent stays invisible). ``env``
    adds variables to an otherwise empty environment. ``result_channel``: a pipe whose write end the
    child finds in $TORCHREVIEW_RESULT_FD; what it writes there is ``SandboxResult.channel``, apart from
    stdout. The child starts in ``code_dir``, or in an empty private directory with ``private_cwd`` (so
    that ``python -m`` cannot import the code's own modules before the caller means it to). The child
    finds the code (a copy in weak modes) in $TORCHREVIEW_CODE_DIR. ``policy``: ``strict``/``weak``,
    default from $TORCHREVIEW_SANDBOX.
    """
    code_dir = Path(code_dir).resolve()
    if not code_dir.is_dir():
        raise ValueError(f"code_dir {code_dir} is not a directory")
    caps = _capabilities()
    python_paths = [Path(p).resolve() for p in python_paths]
    packages = [Path(p).resolve() for p in packages]
    import_paths = list(dict.fromkeys(python_paths + [p.parent for p in packages]))
    weak = sandbox_policy(policy) == "weak"
    problems = list(caps.problems) + _secret_problems(_visible_sources(
        caps, code_dir=code_dir, python_paths=python_paths, packages=packages, gpu=gpu))
    if problems and not weak:
        raise SandboxRefused(problems)
    warnings = list(caps.warnings)
    if problems:
        warnings.insert(0, f"WEAK SANDBOX ({POLICY_VARIABLE}=weak, {caps.mode}): the operator allowed running PR code "
                           "without: " + "; ".join(problems))
    seccomp_program = syscall_filter.compiled_filter(gpu=gpu) if caps.layers["seccomp"] else None
    if gpu:
        warnings.append("gpu: shared memory (memfd, shared anonymous mappings) is allowed for the CUDA driver and is "
                        f"not counted in smoke.memory, and the data limit is {limits.gpu_driver_bytes >> 30} GiB higher "
                        "for the driver's host mappings; the container's memory limit bounds both")
    rlimits = _rlimits(limits, gpu=gpu)
    if caps.backend == "bubblewrap" and caps.bwrap_user_namespace:  # applied inside its namespace instead
        rlimits = [limit for limit in rlimits if limit[0] != resource.RLIMIT_NPROC]
    pass_fds: list[int] = []  # closed here once the child holds them (see _run_and_collect)
    result_read = result_write = seccomp_read = None
    with _run_uid(caps.dedicated_uid) as child_uid, \
            tempfile.TemporaryDirectory(prefix="torchreview-sandbox-") as scratch_name:
        scratch = Path(scratch_name)
        scratch.chmod(0o755)  # the child (nobody) must reach the code copy inside
        try:
            if seccomp_program is not None:
                seccomp_read = _pipe_with(seccomp_program)
                pass_fds.append(seccomp_read)
            if caps.backend == "bubblewrap":
                mounted_code = code_dir
                if caps.dedicated_uid and not _tree_readable_by_child(code_dir, child_uid):
                    mounted_code = _read_only_copy(code_dir, scratch / "code")
                command = _bwrap_command(argv, caps=caps, code_dir=code_dir, mounted_code=mounted_code,
                                         python_paths=python_paths, packages=packages, limits=limits, gpu=gpu,
                                         scratch=scratch, seccomp_fd=seccomp_read,
                                         cwd="/tmp" if private_cwd else str(code_dir), child_uid=child_uid)
                child_env = _child_env(env, python_paths=import_paths, home="/tmp", gpu=gpu)
                child_env[CODE_DIR_VARIABLE] = str(code_dir)
                cwd = None  # bwrap --chdir
            else:
                command, child_env, cwd = _fallback_command(argv, caps=caps, code_dir=code_dir, scratch=scratch,
                                                            python_paths=import_paths, env=env, gpu=gpu,
                                                            seccomp_fd=seccomp_read, private_cwd=private_cwd,
                                                            child_uid=child_uid)
            if result_channel:
                result_read, result_write = os.pipe()
                pass_fds.append(result_write)
                child_env[RESULT_FD_VARIABLE] = str(result_write)
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
                                      preexec=preexec, run_tag=tag, pass_fds=pass_fds, result_read=result_read)
        finally:
            for fd in pass_fds + ([result_read] if result_read is not None else []):
                os.close(fd)
            _make_removable(scratch)
    result.layers = dict(caps.layers)
    result.mode = caps.mode
    result.warnings = warnings + result.warnings
    for warning in result.warnings[len(warnings):]:
        log.warning("sandbox: %s", warning)
    if problems:
        log.warning("sandbox: %s", warnings[0])
    return result


@contextlib.contextmanager
def _run_uid(dedicated: bool) -> Iterator[int]:
    """The uid this run's child gets: one of the pool's, held (a lock file) until the run is over, when the
    runner switches uids itself; else nobody (in a user namespace of the run's own)."""
    if not dedicated:
        yield CHILD_UID
        return
    locks = Path(tempfile.gettempdir()) / "torchreview-sandbox-uids"
    locks.mkdir(mode=0o700, exist_ok=True)
    info = locks.lstat()
    if not locks.is_dir() or locks.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise RuntimeError(f"sandbox: {locks} is not a private directory of uid {os.geteuid()}; remove it")
    start = random.randrange(RUN_UID_COUNT)
    for offset in range(RUN_UID_COUNT):
        uid = RUN_UID_BASE + (start + offset) % RUN_UID_COUNT
        fd = os.open(locks / str(uid), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # the run's processes are all dead by now (its PID namespace, or the tree kill)
        return
    raise RuntimeError(f"sandbox: all {RUN_UID_COUNT} run uids are in use")


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe holding ``data`` (small: the BPF program fits the pipe buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def _fallback_command(argv: Sequence[str], *, caps: _Capabilities, code_dir: Path, scratch: Path,
                      python_paths: Sequence[Path], env: Optional[dict[str, str]], gpu: bool,
                      seccomp_fd: Optional[int], private_cwd: bool,
                      child_uid: int) -> tuple[list[str], dict[str, str], str]:
    """Weak modes: a read-only copy of the code, a private HOME/TMPDIR, unshare, setpriv, the filter."""
    code_copy = _read_only_copy(code_dir, scratch / "code")

    def relocate(value: str) -> str:
        return str(code_copy) + value[len(str(code_dir)):] if _is_within(Path(value), code_dir) else value

    home = scratch / "home"
    home.mkdir(mode=0o700)
    if caps.dedicated_uid:
        os.chown(home, child_uid, child_uid)
    child_env = _child_env(env, python_paths=[Path(relocate(str(p))) for p in python_paths], home=str(home),
                           gpu=gpu)
    child_env["TMPDIR"] = str(home)
    child_env[CODE_DIR_VARIABLE] = str(code_copy)
    command = list(caps.unshare_args)
    if seccomp_fd is not None:
        # After unshare, which needs calls the filter denies; before setpriv (which needs none of them), so
        # that the loader still runs as the runner's uid.
        command += [sys.executable, "-I", "-c", syscall_filter.LOADER, str(seccomp_fd)]
    command += _setpriv_args(child_uid) if caps.dedicated_uid else []
    command += [relocate(arg) if arg.startswith(str(code_dir)) else arg for arg in argv]
    return command, child_env, str(home if private_cwd else code_copy)


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

    def data(self) -> bytes:
        return b"".join(self.chunks)

    def text(self) -> str:
        return self.data().decode(errors="replace")


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
                     limits: SandboxLimits, preexec: Optional[Callable[[], None]], run_tag: Optional[str],
                     pass_fds: Optional[list[int]] = None, result_read: Optional[int] = None) -> SandboxResult:
    started = time.monotonic()
    # start_new_session: the child leads its own session and process group, so one killpg reaches the
    # whole tree (the fallback when there is no PID namespace) and the runner's terminal never does.
    proc = subprocess.Popen(command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=preexec, close_fds=True, pass_fds=tuple(pass_fds or ()))
    readers = [_CappedReader(proc.stdout, limits.output_bytes), _CappedReader(proc.stderr, limits.output_bytes)]
    # Only the child holds these now; the result channel sees EOF when the child's whole tree is gone.
    while pass_fds:  # the caller's list: what is popped here is not closed twice
        os.close(pass_fds.pop())
    channel = None
    if result_read is not None:
        channel = _CappedReader(os.fdopen(result_read, "rb", buffering=0, closefd=False), limits.result_bytes)
        readers.append(channel)
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
                         timed_out=timed_out, output_truncated=any(r.truncated for r in readers[:2]),
                         wall_seconds=wall_seconds, max_rss_bytes=usage.ru_maxrss * 1024, layers={},
                         warnings=warnings, channel=b"" if channel is None or channel.truncated else channel.data())


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
