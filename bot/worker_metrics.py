"""A Celery worker's Prometheus endpoint: one HTTP port per worker, serving all its pool processes.

Reviews are counted in the pool children, which have no port of their own; so the worker's main
process puts the whole pool in prometheus-client's multiprocess mode (a ``PROMETHEUS_MULTIPROC_DIR``
that the children inherit) and serves the sum on ``TORCHREVIEW_WORKER_METRICS_PORT`` (default 9191,
``0``: no port, e.g. when ``torchreview serve`` shows the embedded workers' metrics on its /metrics).

Nothing here imports prometheus_client at module level: the directory must be set before the first
metric exists in the process.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile

from celery.signals import worker_init, worker_process_shutdown, worker_ready, worker_shutdown

log = logging.getLogger("torchreview.metrics")

PORT_ENV = "TORCHREVIEW_WORKER_METRICS_PORT"
DEFAULT_PORT = 9191
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_state: dict = {}


def metrics_port() -> int:
    from bot.settings import port_number

    return port_number(os.environ, PORT_ENV, str(DEFAULT_PORT))


def clear_multiproc_dir(path: str) -> None:
    """prometheus-client's rule: the directory is emptied when the processes that share it start."""
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.unlink(os.path.join(path, name))


@worker_init.connect
def _multiprocess_pool(**_kwargs) -> None:
    """In the worker's main process, before the pool forks: give the pool one metrics directory."""
    if not os.environ.get(MULTIPROC_ENV):  # set by `torchreview serve` (embedded) or by the operator
        path = tempfile.mkdtemp(prefix="torchreview-worker-metrics-")
        os.environ[MULTIPROC_ENV] = path
        _state["owned_dir"] = path
    values = sys.modules.get("prometheus_client.values")
    if values is not None and values.ValueClass is values.MutexValue:
        # prometheus_client was imported before the directory was set: metrics built from here on
        # are shared; any built earlier would not be.
        values.ValueClass = values.MultiProcessValue()
        if "bot.metrics" in sys.modules:
            log.warning("bot.metrics was imported before the worker started: its metrics are per process")


@worker_ready.connect
def _serve(**_kwargs) -> None:
    port = metrics_port()
    if not port:
        return
    from prometheus_client import start_http_server

    from bot.metrics import registry

    try:
        server, _thread = start_http_server(port, registry=registry())
    except OSError as exc:
        # Reviews matter more than their metrics: keep working, but say so loudly.
        log.error("worker metrics: cannot listen on port %d (%s); set %s to a free port", port, exc, PORT_ENV)
        return
    _state["server"] = server
    log.info("worker metrics on :%d/metrics", port)


@worker_process_shutdown.connect
def _pool_child_exit(pid=None, **_kwargs) -> None:
    from bot.metrics import mark_process_dead

    mark_process_dead(pid or os.getpid())


@worker_shutdown.connect
def _stop(**_kwargs) -> None:
    server = _state.pop("server", None)
    if server is not None:
        server.shutdown()
    owned = _state.pop("owned_dir", None)
    if owned:
        shutil.rmtree(owned, ignore_errors=True)
