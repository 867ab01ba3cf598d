"""gunicorn hooks and worker class for the webhook (``gunicorn -c python:bot.gunicorn_conf``, see
``bot.cli.web_command``).

Each gunicorn worker is a process with its own counters; in prometheus-client's multiprocess mode they
all write to one directory and /metrics adds them up, so every scrape sees the same totals whichever
worker answers it.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time

from gunicorn.workers.gthread import ThreadWorker

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_owned: list[str] = []


def on_starting(server) -> None:
    """In the master, before any worker exists (and so before any metric is built)."""
    if not os.environ.get(MULTIPROC_ENV):  # `torchreview serve` sets (and empties) it; bare gunicorn does not
        path = tempfile.mkdtemp(prefix="torchreview-web-metrics-")
        os.environ[MULTIPROC_ENV] = path
        _owned.append(path)


def child_exit(server, worker) -> None:
    """A worker died or was replaced: drop its live-gauge files (its counts stay in the totals)."""
    from bot.metrics import mark_process_dead

    mark_process_dead(worker.pid)


def on_exit(server) -> None:
    for path in _owned:
        shutil.rmtree(path, ignore_errors=True)


READ_DEADLINE_VARIABLE = "TORCHREVIEW_WEB_READ_DEADLINE_S"
DEFAULT_READ_DEADLINE_S = 10.0  # GitHub gives up on a delivery after 10 s: a request slower than that is no delivery


def read_deadline_s() -> float:
    try:
        value = float(os.environ.get(READ_DEADLINE_VARIABLE) or DEFAULT_READ_DEADLINE_S)
    except ValueError:
        return DEFAULT_READ_DEADLINE_S
    return value if 0 < value < float("inf") else DEFAULT_READ_DEADLINE_S


class DeadlineThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, where a connection holds its thread for at most ``read_deadline_s()``.

    gthread waits for a silent connection without a thread, but once bytes arrive, the thread reads the
    headers and the body with no time limit: 16 clients sending a byte every few seconds held every thread of
    a default ``torchreview serve`` and no delivery got through. Here a watchdog shuts the reading side of a
    connection past its deadline, counted from when its request was queued for a thread: a blocked read
    returns end-of-file, the request fails and its thread is free again, and a connection that waited its
    whole deadline in the queue gives its thread back at once. So a delivery waits one deadline at most,
    however many slow clients came first. (A slow client can still hold a thread that long: in front of the
    web there belongs a proxy that buffers whole requests, deploy/README.md.)
    """

    def init_process(self) -> None:
        self._deadlines: dict = {}  # connection -> when its reading side is shut
        self._deadlines_lock = threading.Lock()
        threading.Thread(target=self._watch, name="read-deadlines", daemon=True).start()
        super().init_process()  # runs the worker's loop: never returns

    def enqueue_req(self, conn) -> None:
        with self._deadlines_lock:
            self._deadlines.setdefault(conn, time.monotonic() + read_deadline_s())
        super().enqueue_req(conn)

    def handle(self, conn):
        try:
            return super().handle(conn)
        finally:
            with self._deadlines_lock:
                self._deadlines.pop(conn, None)

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            with self._deadlines_lock:
                late = [conn for conn, deadline in self._deadlines.items() if deadline <= now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                try:
                    conn.sock.shutdown(socket.SHUT_RD)  # the answer can still be written
                except OSError:
                    pass  # closed meanwhile
