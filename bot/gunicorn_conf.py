"""gunicorn hooks for the webhook (``gunicorn -c python:bot.gunicorn_conf``, see ``bot.cli.web_command``).

Each gunicorn worker is a process with its own counters; in prometheus-client's multiprocess mode they
all write to one directory and /metrics adds them up, so every scrape sees the same totals whichever
worker answers it.
"""
from __future__ import annotations

import os
import shutil
import tempfile

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
