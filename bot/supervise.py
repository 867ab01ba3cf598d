"""`torchreview serve`'s children kept running: one that dies is started again after a back-off, and
one that keeps dying soon after each start makes serve give up with a non-zero exit (a supervisor above
it, systemd or Docker's restart policy, then sees the failure instead of a server that answers but
never reviews)."""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

log = logging.getLogger("torchreview.serve")

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0  # a child that ran this long before dying starts over with a clean record
MAX_QUICK_FAILURES = 5  # deaths in a row, each before STABLE_AFTER: serve exits
POLL_INTERVAL = 0.5


class GaveUp(Exception):
    """A child kept dying soon after each start."""


@dataclass
class Child:
    name: str
    command: list[str]
    env: dict
    on_exit: Optional[Callable[[], None]] = None  # cleans up after a dead one (its health file)
    process: Optional[subprocess.Popen] = None
    started_at: float = 0.0
    quick_failures: int = 0
    restart_at: Optional[float] = None  # set while it waits for its back-off

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, env=self.env)
        self.started_at = time.monotonic()
        self.restart_at = None


@dataclass
class Supervisor:
    children: list[Child] = field(default_factory=list)
    say: Callable[[str], None] = lambda message: print(f"torchreview: {message}", file=sys.stderr, flush=True)

    def add(self, name: str, command: list[str], env: dict, on_exit: Optional[Callable[[], None]] = None) -> Child:
        child = Child(name, command, env, on_exit)
        child.start()
        self.children.append(child)
        return child

    def run(self) -> None:
        """Watch the children until stopped (a signal); raises GaveUp when one cannot stay up."""
        while True:
            self.check(time.monotonic())
            time.sleep(POLL_INTERVAL)

    def check(self, now: float) -> None:
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self.say(f"restarting {child.name}")
                    child.start()
                continue
            code = child.process.poll()
            if code is None:
                continue
            if child.on_exit is not None:
                child.on_exit()
            ran = now - child.started_at
            child.quick_failures = child.quick_failures + 1 if ran < STABLE_AFTER else 1
            if child.quick_failures >= MAX_QUICK_FAILURES:
                raise GaveUp(f"{child.name} exited {code} {child.quick_failures} times in a row, each within "
                             f"{STABLE_AFTER:.0f}s of its start; giving up")
            delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (child.quick_failures - 1))
            self.say(f"{child.name} exited {code} after {ran:.0f}s; restarting it in {delay:.0f}s")
            child.restart_at = now + delay

    def stop(self, timeout: float = 15) -> None:
        running = [c.process for c in self.children if c.process is not None and c.restart_at is None]
        for process in running:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
