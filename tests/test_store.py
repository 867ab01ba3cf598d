"""Shared state on real Redis and on the embedded SQLite store: the same semantics."""
from __future__ import annotations

import pytest

from bot.store import RedisStore, SqliteStore, WriteBudget


@pytest.fixture(params=["redis", "sqlite"])
def store(request, tmp_path):
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        request.getfixturevalue("redis_client")  # flushed
        return RedisStore(url)
    return SqliteStore(tmp_path / "state.sqlite")


def test_claim_is_first_come_only(store):
    assert store.claim("delivery-1", 60)
    assert not store.claim("delivery-1", 60)
    assert store.exists("delivery-1")
    store.release("delivery-1")
    assert not store.exists("delivery-1") and store.claim("delivery-1", 60)


def test_lock_only_the_holder_unlocks(store):
    token = store.acquire("pr-1", 60)
    assert token and store.acquire("pr-1", 60) is None
    store.unlock("pr-1", "someone-else")
    assert store.acquire("pr-1", 60) is None
    store.unlock("pr-1", token)
    assert store.acquire("pr-1", 60)


def test_write_budget_waits_for_the_next_minute_across_workers(store):
    now = [600.0]  # minute 10
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    first = WriteBudget(store, 7, per_minute=3, sleep=sleep, clock=lambda: now[0])
    second = WriteBudget(store, 7, per_minute=3, sleep=sleep, clock=lambda: now[0])  # another worker
    for budget in (first, second, first):
        budget.spend()
    assert slept == []
    second.spend()  # the 4th content-creating request this minute for installation 7
    assert slept == [60.0] and now[0] == 660.0
    WriteBudget(store, 8, per_minute=3, sleep=sleep, clock=lambda: now[0]).spend()  # other installations: own budget
    assert slept == [60.0]


def test_put_and_get(store):
    assert store.get("head") is None
    store.put("head", "abc", 60)
    store.put("head", "def", 60)  # overwrites
    assert store.get("head") == "def"


def test_write_budget_without_sleep_asks_to_be_requeued(store):
    from bot.store import WriteBudgetSpent

    budget = WriteBudget(store, 9, per_minute=1, clock=lambda: 615.0)
    budget.spend()
    try:
        budget.spend()
    except WriteBudgetSpent as spent:
        assert spent.delay == 45.0
    else:
        raise AssertionError("the second write of the minute must be refused")
