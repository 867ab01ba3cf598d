"""At least once through a Redis restart: a job that must be re-queued (a GitHub 5xx, a rate limit, a busy lock)
while Redis, its broker, is away is not dropped. Real parts: a private redis-server with the deploy's persistence
(stopped and started again on the same port, as a deploy restarts it), the webhook over real HTTP, a Celery worker
process, PyGithub against the emulator; the fault is put at one exact point by holding one GitHub request."""
from __future__ import annotations

import shutil
import threading

import pytest

from github_emulator.local import ProcessGroup, free_port
from tests.conftest import (START_TIMEOUT_S, WEBHOOK_SECRET, Worker, completed_run, deliver, new_repo, pr_payload,
                            wait_for, worker_env)
from tests.test_app_e2e import HEAD_TRAIN, PREVIEW

# The deploy's persistence (deploy/docker-compose.yml, bench/load.py's REDIS_PERSISTENCE): a restart replays it.
PERSISTENCE = ["--appendonly", "yes", "--appendfsync", "everysec"]


class RestartableRedis:
    def __init__(self, workdir) -> None:
        self.port, self.workdir = free_port(), workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.server = None
        self.generation = 0
        self.start()

    def start(self) -> None:
        import redis

        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed; scripts/test.sh installs it (apt-get install redis-server)")
        self.generation += 1
        self.server = ProcessGroup([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                    *PERSISTENCE, "--dir", str(self.workdir)],
                                   self.workdir / f"redis-{self.generation}.log")
        client = redis.Redis(port=self.port, socket_timeout=5)

        def answers():
            try:
                return client.ping()
            except redis.RedisError:
                return False  # not listening yet, or still loading its append-only file

        wait_for(answers, START_TIMEOUT_S, "redis-server")

    def stop(self) -> None:
        self.server.stop()  # SIGTERM: Redis writes its append-only file out, then exits


@pytest.fixture
def outage_stack(emulator, app_key, tmp_path):
    from werkzeug.serving import make_server

    from bot.settings import Settings
    from bot.webhook import create_app

    redis_server = RestartableRedis(tmp_path)
    env = {**worker_env(emulator, app_key, redis_server.url, tmp_path), "TORCHREVIEW_VISIBILITY_TIMEOUT": "60"}
    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret=WEBHOOK_SECRET,
                        redis_url=redis_server.url, data_dir=tmp_path, api_url=emulator.url)
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack = {"url": f"http://127.0.0.1:{server.server_port}{settings.webhook_path}", "env": env,
             "state": emulator.state, "redis": redis_server}
    try:
        stack["worker"] = Worker(env, concurrency=1)
        yield stack
    finally:
        if "worker" in stack:
            stack["worker"].stop()
        server.shutdown()
        redis_server.stop()


def _log(stack) -> str:
    return stack["worker"].log_path.read_text(errors="replace")[-4000:]


# (what GitHub answers, the request it answers so): the PR's first read comes before the job holds any lock in
# Redis, so nothing in between rides out the restart on the store's reconnects; the check run's creation is inside
# the PR's lock, whose release does.
FAULTS = {"rate limit on the PR's first read": ("GET", "/repos/{name}/pulls/{number}", 403),
          "502 on the check run's creation": ("POST", "/repos/{name}/check-runs", 502)}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_job_re_queued_while_redis_restarts_is_not_lost(outage_stack, fault):
    """One GitHub request of the job is held; Redis stops meanwhile; GitHub then answers it with an error the job
    re-queues itself for, while Redis is still away. Celery's retry could not publish the new message then, and
    rejected the one it held without requeueing it: the head was never reviewed (bench/load.py's storm lost one
    PR's latest head that way, once in a while). Redis comes back a few seconds later; the head must be reviewed."""
    stack, state = outage_stack, outage_stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    method, template, status = FAULTS[fault]
    path = template.format(name=name, number=pr.number)
    held = state.faults.hold(method, path, seconds=2.0)
    if status == 403:
        state.faults.secondary_rate_limit(method, path, times=1, retry_after=1)
    else:
        state.faults.fail(method, path, status=status, times=1)
    try:
        assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
        wait_for(lambda: held.hits == 1, 60, "the job's check-run request, held")
        stack["redis"].stop()  # within the hold: the error comes back while Redis is away
        threading.Event().wait(3.5)  # past the hold, and longer than a publish's own retries (under a second)
        stack["redis"].start()
        run = completed_run(state, pr.head_sha, timeout=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nworker log:\n{_log(stack)}") from None
    finally:
        state.faults.clear()
    assert run.conclusion == "failure", _log(stack)
    assert len(state.reviews_for(pr)) == 1
    assert len(state.check_runs_for(pr.head_sha, name="torchreview")) == 1
