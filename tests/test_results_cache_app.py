"""The App's workers share the results cache by blob SHA: a re-review after a push analyzes only what changed.

The review job runs in this process (so its Prometheus counters can be read) against the GitHub emulator,
with the two stores a deployment has: Redis (``REDIS_URL``) and the embedded data directory.
"""
from __future__ import annotations

import uuid

import pytest

from bot import metrics
from bot.github_client import GitHubClients
from bot.pipeline import run_review
from bot.settings import Settings
from bot.store import RedisStore, SqliteStore
from bot.jobs import ReviewJob
from tests.conftest import WEBHOOK_SECRET, completed_run, new_repo

TRAIN = "import torch\n\n\ndef resume(path):\n    return torch.load(path)\n"
# a training step that never zeroes its gradients: its finding consults no other file (a torch.load would make
# the scripts beside it part of the result's key: they may save what weights_only=True refuses)
MODEL = ("import torch\n\n\ndef fit(model, loader, optimizer):\n    for x, y in loader:\n"
         "        loss = torch.nn.functional.mse_loss(model(x), y)\n        loss.backward()\n"
         "        optimizer.step()\n")


def cache_counts() -> tuple[float, float]:
    hit = metrics.ANALYSIS_CACHE.labels(result="hit")._value.get()
    miss = metrics.ANALYSIS_CACHE.labels(result="miss")._value.get()
    return hit, miss


@pytest.fixture(params=["redis", "data-dir"])
def store(request, tmp_path):
    if request.param == "redis":
        import redis

        url = request.getfixturevalue("redis_url")
        for key in redis.Redis.from_url(url).scan_iter("torchreview:results:*"):
            redis.Redis.from_url(url).delete(key)
        return RedisStore(url)
    return SqliteStore(tmp_path / "data" / "state.sqlite")


def test_a_second_review_of_unchanged_files_comes_from_the_cache(emulator, app_key, store, tmp_path):
    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret=WEBHOOK_SECRET,
                        api_url=emulator.url, data_dir=tmp_path / "data", github_write_interval=0)
    clients = GitHubClients(settings)
    state = emulator.state
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\n"})  # TR601 and TR101 are preview rules
    pr = state.open_pull_request(repo, {"train.py": TRAIN, "model.py": MODEL}, user="alice")

    def review(head: str) -> str:
        job = ReviewJob(installation_id=1, repository=name, pull_number=pr.number, head_sha=head,
                            reason="pull_request.synchronize", delivery=str(uuid.uuid4()))
        return run_review(job, clients, store)

    before = cache_counts()
    review(pr.head_sha)
    first = completed_run(state, pr.head_sha)
    after_first = cache_counts()
    assert (after_first[0] - before[0], after_first[1] - before[1]) == (0, 2)  # both analyzed

    # A push that changes train.py only: model.py's blob is the same, so its result is reused.
    head = state.push(pr, {"train.py": TRAIN.replace("torch.load(path)", "torch.load(path, weights_only=True)")})
    review(head)
    second = completed_run(state, head)
    after_second = cache_counts()
    assert (after_second[0] - after_first[0], after_second[1] - after_first[1]) == (1, 1)
    # model.py's finding still stands (a preview rule's: it is listed, and never fails the check)
    assert first.conclusion == "success" and second.conclusion == "success"
    assert "model.py" in second.output_summary

    # The same head again (a "Re-run review"): nothing is analyzed.
    review(head)
    after_third = cache_counts()
    assert (after_third[0] - after_second[0], after_third[1] - after_second[1]) == (2, 0)
