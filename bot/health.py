"""Which of `torchreview serve`'s workers are up, for the web's ``/healthz``.

``serve`` names the workers it runs (``TORCHREVIEW_REQUIRED_WORKERS``) and gives each a name and a
shared directory (``TORCHREVIEW_WORKERS_DIR``). A worker writes ``<name>.pid`` there once it consumes
(Celery's ``worker_ready``) and removes it on a clean shutdown; the web counts a worker as up while its
file names a live process, so a killed worker is missing at once, whoever notices it first. Workers
started any other way (compose, Kubernetes) have no name and write nothing; their own probes cover them.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from celery.signals import worker_ready, worker_shutdown

WORKERS_DIR_ENV = "TORCHREVIEW_WORKERS_DIR"
WORKER_NAME_ENV = "TORCHREVIEW_WORKER_NAME"
REQUIRED_WORKERS_ENV = "TORCHREVIEW_REQUIRED_WORKERS"


def pid_file(directory: os.PathLike | str, name: str) -> Path:
    return Path(directory) / f"{name}.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: the pid was reused
        return False
    try:  # a killed worker its supervisor has not reaped yet is a zombie, not a worker
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all there is


def running_pid(directory: os.PathLike | str, name: str) -> Optional[int]:
    """The pid of worker ``name`` if it has announced itself and is still running, else None."""
    try:
        pid = int(pid_file(directory, name).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def missing_workers(env: Optional[Mapping[str, str]] = None) -> list[str]:
    """The required workers that are not running and consuming (empty when serve runs none)."""
    env = os.environ if env is None else env
    required = [name for name in env.get(REQUIRED_WORKERS_ENV, "").split(",") if name]
    directory = env.get(WORKERS_DIR_ENV, "")
    if not required:
        return []
    if not directory:
        return required
    return [name for name in required if running_pid(directory, name) is None]


def _own_file() -> Optional[Path]:
    directory, name = os.environ.get(WORKERS_DIR_ENV), os.environ.get(WORKER_NAME_ENV)
    return pid_file(directory, name) if directory and name else None


@worker_ready.connect
def _announce(**_kwargs) -> None:
    path = _own_file()
    if path is not None:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(str(os.getpid()))
        temporary.replace(path)  # the web never reads half a pid


@worker_shutdown.connect
def _withdraw(**_kwargs) -> None:
    path = _own_file()
    if path is not None:
        try:
            if path.read_text().strip() == str(os.getpid()):
                path.unlink()
        except OSError:
            pass
