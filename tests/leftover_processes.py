"""Run a command (the test suite) and fail when a process it started is still alive after it has exited.

    python -m tests.leftover_processes [--grace SECONDS] -- COMMAND [ARG...]

This process makes itself a child subreaper (Linux, ``prctl(PR_SET_CHILD_SUBREAPER)``): a process the command
starts, however deep and in whatever session or process group it put itself (``start_new_session``, a
double-forked daemon), is re-parented to it rather than to init when its own parent exits. Once the command has
exited and ``grace`` seconds have passed, whatever still descends from this process is exactly what the command
left running: it is listed, killed, and the exit status is non-zero (the command's own when that failed too).
A marker in the environment would miss the processes started with an environment of their own (the smoke
runner's child gets only what it needs).

Elsewhere than on Linux the command is only run: the check needs the subreaper and /proc.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")


def descendants(root: int) -> list[Leftover]:
    """The live (not zombie) processes below ``root``, parents before their children."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state not in ("Z", "X"):
            children.setdefault(int(ppid), []).append(int(entry.name))
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(Leftover(pid, _command_line(pid)))
        queue.extend(children.get(pid, []))
    return found


def _command_line(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:300] or "?"


def _reap_exited_children() -> None:
    """Collects the exit status of every child that has exited (orphans re-parented to us among them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_for(command_pid: int) -> int:
    """The command's exit code, reaping whatever else ends meanwhile."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == command_pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it


def _pass_on(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it has just exited


def run(command: list[str], grace: float) -> int:
    if not sys.platform.startswith("linux"):
        os.execvp(command[0], command)
    become_subreaper()
    pid = os.posix_spawnp(command[0], command, os.environ)
    # Ctrl-C reaches the whole foreground group, the command included; a SIGTERM sent to us is passed on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: _pass_on(pid, received))
    code = _wait_for(pid)
    deadline = time.monotonic() + grace  # for what the command has just asked to stop
    while True:
        _reap_exited_children()
        left = descendants(os.getpid())
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not left:
        return code
    print(f"\n{len(left)} process(es) started by `{' '.join(command)}` still running {grace:g}s after it exited "
          "(a fixture or test that does not stop what it starts); killed:", file=sys.stderr)
    for leftover in left:
        print(f"  pid {leftover.pid}: {leftover.command}", file=sys.stderr)
        try:
            os.kill(leftover.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended meanwhile
        except PermissionError:
            print(f"  (pid {leftover.pid} is another user's: not killed)", file=sys.stderr)
    deadline = time.monotonic() + 10
    while descendants(os.getpid()) and time.monotonic() < deadline:
        _reap_exited_children()
        time.sleep(0.1)
    _reap_exited_children()
    return code or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.leftover_processes", description=__doc__.split("\n")[0])
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds the command's processes get to finish exiting after it (default 10)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    return run(command, args.grace)


if __name__ == "__main__":
    sys.exit(main())
