"""A ``/review`` command is answered once, even when its job runs again after the PR's head moved.

A worker killed after answering, before its ack, gets the job redelivered; by then a push may have
moved the head. The job runs in this process against the emulator, with both stores a deployment has.
"""
from __future__ import annotations

import uuid

import pytest

from bot.github_client import GitHubClients
from bot.jobs import CommandJob
from bot.pipeline import command_head_key, run_command
from bot.settings import Settings
from bot.store import RedisStore, SqliteStore
from tests.conftest import WEBHOOK_SECRET, new_repo

# TR810 (a stable rule: its high finding fails the check; preview rules never do)
TRAIN = 'import torch\n\nstate = torch.symeig(a)\n'


@pytest.fixture(params=["redis", "data-dir"])
def store(request, tmp_path):
    if request.param == "redis":
        request.getfixturevalue("redis_client")  # flushed: no other test's write budget for installation 1
        return RedisStore(request.getfixturevalue("redis_url"))
    return SqliteStore(tmp_path / "data" / "state.sqlite")


@pytest.fixture
def command(emulator, app_key, store, tmp_path):
    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret=WEBHOOK_SECRET,
                        api_url=emulator.url, data_dir=tmp_path / "data", github_write_interval=0)
    clients = GitHubClients(settings)
    repo, name = new_repo(emulator.state, {})
    pr = emulator.state.open_pull_request(repo, {"train.py": TRAIN}, user="alice")
    job = CommandJob(installation_id=1, repository=name, pull_number=pr.number, delivery=str(uuid.uuid4()),
                     comment_id=None, command="/review", requested_by="octo-maintainer")
    return {"state": emulator.state, "pr": pr, "job": job, "clients": clients,
            "run": lambda: run_command(job, clients, store)}


def answers(state, pr, delivery: str, *heads: str) -> list:
    return [run for head in heads for run in state.check_runs_for(head, name="torchreview")
            if run.external_id == delivery]


def test_a_retry_after_a_push_finds_its_answer_instead_of_answering_again(command):
    state, pr, job = command["state"], command["pr"], command["job"]
    first_head = pr.head_sha
    command["run"]()
    (run,) = answers(state, pr, job.delivery, first_head)
    assert run.status == "completed" and run.conclusion == "failure"

    second_head = state.push(pr, {"train.py": TRAIN + "\nx = 1\n"})
    outcome = command["run"]()  # the redelivered job
    assert outcome.startswith("superseded")
    assert answers(state, pr, job.delivery, first_head, second_head) == [run]
    assert run.conclusion == "failure"  # a completed answer is left as it was


def test_a_retry_that_never_answered_answers_on_the_head_as_it_is_now(command, store):
    state, pr, job = command["state"], command["pr"], command["job"]
    first_head = pr.head_sha
    # the first attempt pinned the head it saw, then died before creating its check run
    assert store.keep_first(command_head_key(job.installation_id, job.delivery), first_head, 60) == first_head
    second_head = state.push(pr, {"train.py": TRAIN + "\nx = 1\n"})
    command["run"]()
    (run,) = answers(state, pr, job.delivery, first_head, second_head)
    assert run.head_sha == second_head and run.status == "completed"
    assert store.get(command_head_key(job.installation_id, job.delivery)) == second_head

    command["run"]()  # and again: still that one answer
    assert answers(state, pr, job.delivery, first_head, second_head) == [run]


def test_a_plain_retry_reuses_its_check_run(command):
    state, pr, job = command["state"], command["pr"], command["job"]
    command["run"]()
    command["run"]()
    assert len(answers(state, pr, job.delivery, pr.head_sha)) == 1


def test_the_first_value_is_kept(store):
    key = f"torchreview:test:{uuid.uuid4()}"
    assert store.keep_first(key, "a", 60) == "a"
    assert store.keep_first(key, "b", 60) == "a"
    assert store.get(key) == "a"


def test_a_push_landing_while_the_review_posts_leaves_the_run_neutral(command, monkeypatch):
    """The verdict is for the head it judged: a push between the last head check and the completing
    write makes the run neutral (pointing at the newer commit), not a stale failure."""
    from bot.pipeline import ReviewRun

    state, pr, job = command["state"], command["pr"], command["job"]
    first_head = pr.head_sha
    post_review = ReviewRun.post_review
    pushed = []

    def push_while_posting(self, plan, event):
        posted = post_review(self, plan, event)
        pushed.append(state.push(pr, {"train.py": TRAIN + "\nx = 1\n"}))
        return posted

    monkeypatch.setattr(ReviewRun, "post_review", push_while_posting)
    command["run"]()
    (run,) = answers(state, pr, job.delivery, first_head)
    assert pushed and run.status == "completed" and run.conclusion == "neutral"
    assert pushed[0][:7] in run.output_summary


def test_a_retry_after_a_failed_attempt_and_a_push_answers_on_the_new_head(command, monkeypatch):
    """An attempt that created its run and failed before completing it (a 502, a rate limit) did not
    answer: its retry closes that run and reviews the head as it is now."""
    state, pr, job = command["state"], command["pr"], command["job"]
    unfinished = _unfinished_run(command, monkeypatch)
    second_head = state.push(pr, {"train.py": TRAIN + "\nx = 1\n"})
    command["run"]()  # the retry
    assert unfinished.status == "completed" and unfinished.conclusion == "neutral"
    (answer,) = answers(state, pr, job.delivery, second_head)
    assert answer.status == "completed" and answer.conclusion == "failure"


def _unfinished_run(command, monkeypatch):
    """An attempt that created its check run and failed before completing it."""
    from bot.pipeline import ReviewRun

    post_review = ReviewRun.post_review

    def fail_once(self, plan, event):
        monkeypatch.setattr(ReviewRun, "post_review", post_review)
        raise ConnectionError("GitHub went away")

    monkeypatch.setattr(ReviewRun, "post_review", fail_once)
    with pytest.raises(ConnectionError):
        command["run"]()
    (unfinished,) = answers(command["state"], command["pr"], command["job"].delivery, command["pr"].head_sha)
    assert unfinished.status == "in_progress"
    return unfinished


def test_a_duplicate_attempt_waits_for_the_one_still_answering(command, store, monkeypatch):
    """Redelivered after the visibility timeout while the first attempt still runs: the duplicate must not
    decide "never answered" (closing the first attempt's run, re-pinning to the new head) while the first
    holds the PR's lock and is about to answer; it waits, then finds that answer."""
    from bot.pipeline import LockBusy, ReviewRun

    state, pr, job = command["state"], command["pr"], command["job"]
    first_head = pr.head_sha
    post_review = ReviewRun.post_review
    seen = {}

    def duplicate_arrives(self, plan, event):
        posted = post_review(self, plan, event)
        state.push(pr, {"train.py": TRAIN + "\nx = 1\n"})
        with pytest.raises(LockBusy):
            command["run"]()  # the duplicate, while this attempt holds the lock
        seen["runs"] = [(run.status, run.head_sha) for run in answers(state, pr, job.delivery, first_head)]
        seen["pin"] = store.get(command_head_key(job.installation_id, job.delivery))
        return posted

    monkeypatch.setattr(ReviewRun, "post_review", duplicate_arrives)
    command["run"]()
    assert seen == {"runs": [("in_progress", first_head)], "pin": first_head}
    monkeypatch.setattr(ReviewRun, "post_review", post_review)
    assert command["run"]().startswith("superseded")  # the duplicate, retried once the lock is free
    (answer,) = answers(state, pr, job.delivery, first_head, pr.head_sha)
    assert answer.head_sha == first_head and answer.status == "completed"


@pytest.mark.parametrize("pushed", [False, True])
def test_a_job_failed_for_good_fails_its_run_unless_a_push_superseded_it(command, store, monkeypatch, pushed):
    from bot.jobs import ReviewJob
    from bot.pipeline import fail_check_run

    state, pr, job = command["state"], command["pr"], command["job"]
    first_head = pr.head_sha
    unfinished = _unfinished_run(command, monkeypatch)
    if pushed:
        second_head = state.push(pr, {"train.py": TRAIN + "\nx = 1\n"})
    failed = ReviewJob(installation_id=1, repository=job.repository, pull_number=pr.number, head_sha=first_head,
                       reason="pull_request.synchronize", delivery=job.delivery)
    fail_check_run(failed, command["clients"], store, "GithubException: 500")
    assert unfinished.status == "completed"
    if pushed:
        assert unfinished.conclusion == "neutral" and second_head[:7] in unfinished.output_summary
    else:
        assert unfinished.conclusion == "failure" and "500" in unfinished.output_summary
