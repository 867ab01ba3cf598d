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
    machine lost under it) or stopped (SIGTERM, then SIGKILL after ``grace`` seconds)."""

    def __init__(self, argv: list[str], log_path: Path, *, env: Optional[dict] = None, cwd: Optional[Path] = None,
                 grace: float = 15.0) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.grace = grace
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
