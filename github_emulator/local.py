"""Small helpers for running the App locally against the emulator (demo, tests, benchmarks)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``predicate`` until it returns something truthy; TimeoutError naming ``what`` otherwise."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class ProcessGroup:
    """A command in a session of its own, its output in a log file: killed whole (SIGKILL to the group, like a
    machine lost under it) or stopped (SIGTERM, then SIGKILL after ``grace`` seconds). Also a context manager that
    stops it however the block ends, so that a caller whose setup fails after the start leaves nothing running.
    Both act on the whole group even when its first process has already exited (a server's orphaned workers)."""

    def __init__(self, argv: list[str], log_path: Path, *, env: Optional[dict] = None, cwd: Optional[Path] = None,
                 grace: float = 15.0) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.grace = grace
        try:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except BaseException:
            self.log.close()
            raise

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._wait_group_gone(10)  # the other members die as soon as the kernel gets to them

    def _wait_group_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        try:
            self._signal(signal.SIGTERM)
            deadline = time.monotonic() + self.grace
            try:
                self.proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                pass
            self._wait_group_gone(deadline - time.monotonic())
        finally:
            self.kill()  # whatever of the group is left
            self.log.close()

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass  # the whole group has exited

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True
