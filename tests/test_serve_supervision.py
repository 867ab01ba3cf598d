"""One machine that cannot lose a worker: `torchreview serve` on the embedded broker (kombu on SQLite).

Real processes throughout: serve with its gunicorn and Celery children, deliveries over HTTP, the
GitHub emulator; the broker race is checked on a real SQLite file with real kombu connections.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from bot import health
from bot.jobs import GPU_QUEUE, QUEUES, REVIEW_QUEUE, declare_queues
from bot.settings import Settings
from bot.supervise import GaveUp, Supervisor
from github_emulator.local import ProcessGroup, free_port
from github_emulator.webhooks import pull_request_payload
from tests.conftest import (ROOT, START_TIMEOUT_S, WEBHOOK_SECRET, answer, completed_run, install_on_octo_org, signed_headers,
                            wait_for)


def _declare(data_dir: str) -> str:
    declare_queues(Settings(app_id=None, private_key=None, webhook_secret=None, data_dir=Path(data_dir)))
    return "ok"


def test_queues_declared_first_are_never_inserted_again(tmp_path):
    """The cause of the lost worker: kombu inserts a queue row on first use, so the web's first send and a
    starting worker raced to insert ``reviews``. Declared first, nobody inserts one again: a trigger that
    refuses any further insert proves it, while real kombu declares, sends and receives on both queues."""
    with multiprocessing.get_context("spawn").Pool(3) as pool:  # declaring commands started together take turns
        assert pool.map(_declare, [str(tmp_path)] * 3) == ["ok"] * 3
    database = tmp_path / "broker.sqlite"
    with sqlite3.connect(database) as db:
        assert sorted(name for (name,) in db.execute("SELECT name FROM kombu_queue")) == sorted(QUEUES)
        db.execute("CREATE TRIGGER no_second_insert BEFORE INSERT ON kombu_queue "
                   "BEGIN SELECT RAISE(ABORT, 'a queue row was inserted after the declaration'); END")
    from kombu import Connection, Exchange, Queue

    with Connection(f"sqla+sqlite:///{database}") as connection:
        channel = connection.channel()
        for name in (REVIEW_QUEUE, GPU_QUEUE):
            Queue(name, Exchange(name), routing_key=name, channel=channel).declare()  # what a worker does
            with connection.SimpleQueue(name) as queue:
                queue.put({"job": name})  # what the web's send does
                message = queue.get(timeout=5)
                assert message.payload == {"job": name}
                message.ack()


def test_redis_needs_no_declaration(tmp_path):
    declare_queues(Settings(app_id=None, private_key=None, webhook_secret=None, redis_url="redis://127.0.0.1:1/0",
                            data_dir=tmp_path))
    assert list(tmp_path.iterdir()) == []


# ---- the supervisor, on real child processes -----------------------------------------------------------


def _sleeper() -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_child_that_dies_is_started_again(monkeypatch):
    monkeypatch.setattr("bot.supervise.FIRST_BACKOFF", 0.2)
    exits = []
    supervisor = Supervisor(say=lambda message: None)
    try:
        child = supervisor.add("sleeper", _sleeper(), dict(os.environ), on_exit=lambda: exits.append(1))
        first = child.process.pid
        os.kill(first, signal.SIGKILL)
        child.process.wait(timeout=10)
        supervisor.check(time.monotonic())
        assert exits == [1] and child.restart_at is not None
        supervisor.check(child.restart_at)
        assert child.process.pid != first and child.process.poll() is None
    finally:
        supervisor.stop()
    assert child.process.poll() is not None


def test_a_child_that_keeps_dying_makes_serve_give_up(monkeypatch):
    monkeypatch.setattr("bot.supervise.FIRST_BACKOFF", 0.05)
    said = []
    supervisor = Supervisor(say=said.append)
    try:
        supervisor.add("broken", [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
        with pytest.raises(GaveUp, match=r"broken exited 3 5 times in a row"):
            supervisor.run()
    finally:
        supervisor.stop()
    assert sum("restarting broken" == line for line in said) == 4


def test_stopping_ends_every_child():
    supervisor = Supervisor(say=lambda message: None)
    children = [supervisor.add(f"c{i}", _sleeper(), dict(os.environ)) for i in range(2)]
    supervisor.stop(timeout=5)
    assert all(child.process.poll() is not None for child in children)


def test_healthz_lists_the_workers_that_are_not_running(tmp_path):
    env = {health.REQUIRED_WORKERS_ENV: "reviews,gpu", health.WORKERS_DIR_ENV: str(tmp_path)}
    assert health.missing_workers(env) == ["reviews", "gpu"]
    health.pid_file(tmp_path, "reviews").write_text(str(os.getpid()))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    health.pid_file(tmp_path, "gpu").write_text(gone)  # a pid whose process has exited
    assert health.missing_workers(env) == ["gpu"]
    assert health.missing_workers({}) == []  # serve with REDIS_URL runs no worker of its own


# ---- `torchreview serve` end to end --------------------------------------------------------------------


@pytest.fixture
def embedded_serve(emulator, app_key, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PROMETHEUS_", "REDIS_"))}
    env.update({"GITHUB_APP_ID": "4242", "GITHUB_PRIVATE_KEY": app_key[0], "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
                "GITHUB_API_URL": emulator.url, "TORCHREVIEW_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
                "TORCHREVIEW_GITHUB_WRITE_INTERVAL": "0", "LOG_LEVEL": "WARNING"})
    with ProcessGroup([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--web-workers", "1", "--concurrency", "1"], tmp_path / "serve.log", env=env, cwd=ROOT,
                      grace=30) as serve:  # stopped whole, a pool child of its session included
        yield {"base": f"http://127.0.0.1:{port}", "group": serve, "workers": tmp_path / "workers",
               "log": serve.log_path}


def _health(serve) -> int | None:
    response = answer(serve["group"], serve["base"] + "/healthz")
    return None if response is None else response.status_code


def _review_a_pr(emulator, serve) -> None:
    state = emulator.state
    install_on_octo_org(state)
    repo = state.add_repo(f"octo-org/serve-{uuid.uuid4().hex[:6]}", files={"README.md": "# s\n"})
    pr = state.open_pull_request(repo, {"train.py": 'import torch\n\nm = torch.load("m.pt")\n'})
    body = json.dumps(pull_request_payload("opened", pr)).encode()
    response = requests.post(serve["base"] + "/api/github/webhooks", data=body,
                             headers=signed_headers(body, "pull_request"), timeout=10)
    assert response.status_code == 202, response.text
    completed_run(state, pr.head_sha, timeout=120)


def test_a_killed_worker_is_missed_by_healthz_then_restarted_and_reviews_again(emulator, embedded_serve):
    serve = embedded_serve
    wait_for(lambda: _health(serve) == 200, START_TIMEOUT_S, "serve and its workers")
    _review_a_pr(emulator, serve)

    killed = int(health.pid_file(serve["workers"], "reviews").read_text())
    pool = psutil.Process(killed).children(recursive=True)
    os.kill(killed, signal.SIGKILL)  # the worker lost under serve, its pool left behind
    # /healthz says so at once: the restarted worker cannot be consuming within its first second
    wait_for(lambda: _health(serve) == 503, 10, "/healthz to miss the worker")
    body = requests.get(serve["base"] + "/healthz", timeout=5).json()
    assert body["missing_workers"] == ["reviews"]

    wait_for(lambda: _health(serve) == 200, 120, "the restarted worker")
    assert int(health.pid_file(serve["workers"], "reviews").read_text()) != killed
    assert "reviews exited -9" in serve["log"].read_text()
    _review_a_pr(emulator, serve)  # a delivery after the restart is reviewed
    # the dead worker's pool children go away by themselves
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in pool), 30,
             "the killed worker's pool to exit")
