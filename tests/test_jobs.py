"""Job descriptions (bot.jobs): what goes on the queue comes back the same, and bot/ has no import circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bot.jobs import CommandJob, ReviewJob, SmokeJob, job_from_dict
from tests.conftest import install_on_octo_org

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("job", [
    ReviewJob(installation_id=1, repository="o/r", pull_number=2, head_sha="a" * 40, reason="pull_request.opened",
              delivery="d1", pr_updated_at="2026-01-01T10:00:00Z"),
    CommandJob(installation_id=1, repository="o/r", pull_number=2, delivery="d2", comment_id=9,
               command="/review smoke", requested_by="x", comment_created_at="2026-01-01T10:00:00Z",
               head_sha="b" * 40),
    SmokeJob(installation_id=1, repository="o/r", pull_number=2, head_sha="c" * 40, reason="command.smoke",
             delivery="d3", requested_by="x", comment_id=9),
])
def test_jobs_survive_the_queue(job):
    assert job_from_dict(job.to_dict()) == job


def test_jobs_queued_before_kinds_still_load():
    legacy = {"installation_id": 1, "repository": "o/r", "pull_number": 2, "head_sha": "c" * 40, "delivery": "d",
              "requested_by": None, "comment_id": None, "author_association": None, "command": None}
    assert isinstance(job_from_dict({**legacy, "reason": "smoke.auto"}), SmokeJob)
    assert isinstance(job_from_dict({**legacy, "reason": "pull_request.opened"}), ReviewJob)
    command = job_from_dict({**legacy, "reason": "command", "head_sha": None, "command": "/review smoke"})
    assert isinstance(command, CommandJob) and command.head_sha is None  # unpinned: the worker asks for a sha


def test_a_smoke_job_always_names_its_commit():
    for unpinned in ("", "abcdef1", "A" * 40, "c" * 41):  # a prefix could name a commit pushed after the authorization
        with pytest.raises(ValueError, match="full 40-hex SHA"):
            SmokeJob(installation_id=1, repository="o/r", pull_number=2, head_sha=unpinned, reason="smoke.auto",
                     delivery="d")


def _bot_imports() -> dict[str, set[str]]:
    """Every import of a bot module by a bot module, at module level or inside functions."""
    graph = {}
    for path in sorted((ROOT / "bot").glob("*.py")):
        name = f"bot.{path.stem}"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "bot":
                deps.update(f"bot.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bot."):
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith("bot."))
        graph[name] = deps - {name}
    return graph


def test_bot_has_no_import_circle():
    graph = _bot_imports()
    assert "bot.tasks" not in graph["bot.webhook"] and "bot.tasks" not in graph["bot.pipeline"]
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in graph.get(node, ()):
            assert state.get(dep) != "open", " -> ".join(path + [dep])
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])


def test_rate_limits_are_waits_and_5xx_are_failures():
    """GitHub naming the wait (secondary or primary rate limit) is not a failure of the job: the task
    re-queues without using up its failures; a 5xx (after the in-place retries of reads) is one."""
    from github import GithubException

    from bot.github_client import classify

    secondary = GithubException(403, {"message": "You have exceeded a secondary rate limit."}, {"Retry-After": "7"})
    assert classify(secondary, 0).rate_limited and classify(secondary, 0).delay == 7
    assert classify(GithubException(429, {"message": "slow down"}, {"Retry-After": "3"}), 0).rate_limited
    bad_gateway = classify(GithubException(502, {"message": "Server Error"}, {}), 0)
    assert bad_gateway is not None and not bad_gateway.rate_limited
    assert classify(GithubException(403, {"message": "Resource not accessible by integration"}, {}), 0) is None


def test_redis_away_is_transient_for_a_job():
    """A Redis restart mid-job re-queues it (it used to fail for good, and its check run stayed open)."""
    import redis

    from bot.tasks import _transient

    assert _transient(redis.ConnectionError("Connection refused"), 0) is not None
    assert _transient(redis.TimeoutError("Timeout reading"), 3).delay > 0
    assert _transient(ValueError("a bug"), 0) is None


def test_no_retry_waits_past_the_visibility_timeout(monkeypatch):
    """A retry's countdown is spent unacknowledged in a worker; past the visibility timeout Redis would hand
    the same job to a second worker while the first still waits on it."""
    from bot.jobs import longest_countdown

    monkeypatch.setenv("TORCHREVIEW_VISIBILITY_TIMEOUT", "30")
    assert longest_countdown() == 24
    monkeypatch.setenv("TORCHREVIEW_VISIBILITY_TIMEOUT", "900")
    assert longest_countdown() >= 300  # the back-off's cap fits under the default


def test_github_reads_answered_5xx_are_retried_in_place_writes_are_not(emulator, app_key):
    from github import GithubException

    from bot.github_client import GitHubClients
    from bot.settings import Settings

    state = emulator.state
    install_on_octo_org(state)
    repo = state.add_repo(f"octo-org/retries-{id(state)}", files={"README.md": "# r\n"})
    clients = GitHubClients(Settings(app_id=4242, private_key=app_key[0], webhook_secret=None, api_url=emulator.url))
    gh = clients.for_installation(1)
    state.faults.fail("GET", f"/repos/{repo.full_name}", status=502, times=2)
    assert gh.get_repo(repo.full_name).full_name == repo.full_name  # two 502s, then the answer
    state.faults.fail("POST", f"/repos/{repo.full_name}/check-runs", status=502, times=1)
    with pytest.raises(GithubException) as failed:
        gh.get_repo(repo.full_name).create_check_run(name="x", head_sha=repo.branches["main"])
    assert failed.value.status == 502  # not repeated: the task decides, idempotently
    state.faults.clear()


def _push(store, sha: str, at: str) -> None:
    from bot.jobs import remember_head

    remember_head(store, ReviewJob(installation_id=1, repository="o/r", pull_number=2, head_sha=sha,
                                   reason="pull_request.synchronize", delivery=sha, pr_updated_at=at))


def _smoke_comment(store, at: str) -> CommandJob:
    from bot.jobs import pin_command

    return pin_command(store, CommandJob(installation_id=1, repository="o/r", pull_number=2, delivery="d",
                                         comment_id=9, command="/review smoke", requested_by="x",
                                         comment_created_at=at))


def test_review_smoke_is_pinned_to_the_newest_head_pushed_before_the_comment(tmp_path):
    from bot.store import SqliteStore

    store = SqliteStore(tmp_path / "state.sqlite")
    assert _smoke_comment(store, "2026-01-01T10:00:00Z").head_sha is None  # no push known
    _push(store, "b" * 40, "2026-01-01T10:05:00Z")
    _push(store, "a" * 40, "2026-01-01T10:01:00Z")  # an older push delivered late: ignored
    assert _smoke_comment(store, "2026-01-01T10:06:00Z").head_sha == "b" * 40
    assert _smoke_comment(store, "2026-01-01T10:05:00Z").head_sha == "b" * 40  # same second: before
    assert _smoke_comment(store, "2026-01-01T10:04:59Z").head_sha is None  # pushed after the comment
    assert _smoke_comment(store, "2026-01-01T10:06:00").head_sha == "b" * 40  # no zone: UTC, no error


def test_a_head_recorded_by_an_earlier_version_is_still_read(tmp_path):
    import json

    from bot.jobs import HEAD_TTL
    from bot.store import SqliteStore

    store = SqliteStore(tmp_path / "state.sqlite")
    store.put("torchreview:head:o/r#2", json.dumps({"sha": "c" * 40, "at": "2026-01-01T10:00:00+00:00"}), HEAD_TTL)
    assert _smoke_comment(store, "2026-01-01T10:00:30Z").head_sha == "c" * 40
    _push(store, "d" * 40, "2026-01-01T10:01:00Z")  # the next push replaces it in the new form
    assert _smoke_comment(store, "2026-01-01T10:02:00Z").head_sha == "d" * 40


def test_a_retry_the_broker_refuses_puts_the_job_back_instead_of_dropping_it():
    """Celery publishes a retry as a new message, then acknowledges the held one; when the publish fails (Redis
    away longer than the publish's own retries) it rejects the held one without requeueing: the job was gone.
    tests/test_broker_outage.py shows it end to end."""
    from celery.exceptions import Reject
    from kombu.exceptions import OperationalError

    from bot.tasks import RETRY_PUBLISH_POLICY, _again

    class Refused:
        def __init__(self):
            self.options = None

        def retry(self, **options):
            self.options = options
            raise Reject(OperationalError("Error 111 connecting. Connection refused."), requeue=False)

    task = Refused()
    with pytest.raises(Reject) as put_back:
        _again(task, {"kind": "review", "repository": "o/r", "pull_number": 2}, 0, 5, 3, "rate_limit")
    assert put_back.value.requeue is True
    # and the publish itself rides out a restart of Redis (seconds), not Celery's half second
    policy = task.options["retry_policy"]
    assert policy is RETRY_PUBLISH_POLICY and policy["max_retries"] * policy["interval_max"] >= 5


def test_the_broker_away_when_a_job_enqueues_another_is_transient():
    """A review enqueueing its smoke job, a base push enqueueing reviews: kombu's error for a broker it could not
    reach is Redis away for a moment, not a job failed for good."""
    from kombu.exceptions import OperationalError

    from bot.tasks import _transient

    transient = _transient(OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), 0)
    assert transient is not None and transient.reason == "redis" and not transient.rate_limited


def test_redis_away_when_a_job_starts_re_queues_it():
    """The job's running mark is its first Redis write: Redis away past the store's reconnects there failed the
    task, and a failed task is acknowledged, so the job was gone."""
    import redis

    from bot.tasks import _mark_started

    class Away:
        def get(self, key):
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    class Task:
        class request:
            id, retries = "t1", 3

        def retry(self, **options):
            self.options = options
            raise RuntimeError("re-queued")

    task = Task()
    with pytest.raises(RuntimeError, match="re-queued"):
        _mark_started(task, Away(), {"kind": "review"}, 2)
    assert task.options["kwargs"] == {"failures": 2} and task.options["max_retries"] == 4
