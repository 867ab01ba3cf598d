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

    now = [615.0]
    budget = WriteBudget(store, 9, per_minute=1, clock=lambda: now[0])
    budget.spend()
    now[0] = 630.0
    try:
        budget.spend()
    except WriteBudgetSpent as spent:
        assert spent.delay == 45.0  # when the write at 615 leaves the window
    else:
        raise AssertionError("the second write of the minute must be refused")


def test_feedback_is_recorded_once_per_comment_user_and_kind(redis_url, tmp_path):
    import redis

    from bot.store import RedisStore, SqliteStore

    redis.Redis.from_url(redis_url).delete(RedisStore.FEEDBACK, RedisStore.FEEDBACK + ":seen")
    for store in (RedisStore(redis_url), SqliteStore(tmp_path / "state.sqlite")):
        record = {"id": "o/r#7:TR601:alice:thumbs-down", "repository": "o/r", "comment": 7, "rule": "TR601",
                  "kind": "thumbs-down", "user": "alice", "reason": ""}
        assert store.add_feedback(record) is True
        assert store.add_feedback(dict(record)) is False  # read again at the next review: not twice
        assert store.add_feedback(dict(record, id="o/r#7:TR601:bob:thumbs-down", user="bob")) is True
        assert [r["user"] for r in store.feedback()] == ["alice", "bob"]


def test_only_the_holder_extends_a_lock(store):
    token = store.acquire("pr-2", 60)
    assert store.extend("pr-2", token, 120)
    assert not store.extend("pr-2", "someone-else", 120)
    store.unlock("pr-2", token)
    assert not store.extend("pr-2", token, 120)  # gone: nothing to extend


def test_a_held_lock_is_renewed_and_a_dead_holders_lapses(redis_url, redis_client):
    """held_lock renews a short-lived lock while its block runs, so a killed worker's lock frees itself
    within the time to live instead of blocking the PR for as long as a job could ever take."""
    from bot.store import held_lock
    from tests.conftest import wait_for

    store = RedisStore(redis_url)
    with held_lock(store, "pr-3", 3) as token:
        assert token and store.acquire("pr-3", 3) is None
        lowest = [redis_client.pttl("pr-3")]

        def renewed() -> bool:  # the time to live runs down, then jumps back up (every ttl / 3)
            left = redis_client.pttl("pr-3")
            lowest[0] = min(lowest[0], left)
            return left > lowest[0] + 200

        wait_for(renewed, 20, "the lock's renewal")
    assert redis_client.exists("pr-3") == 0  # released at the end of the block
    with held_lock(store, "pr-3", 60) as token:
        with held_lock(store, "pr-3", 60) as other:
            assert token and other is None  # held: the second job is told so (LockBusy), never blocked
    dead = store.acquire("pr-4", 1)  # a holder that was SIGKILLed renews nothing
    assert dead
    wait_for(lambda: store.acquire("pr-4", 60), 10, "the dead holder's lock to lapse")


def test_the_write_budget_holds_in_any_60_seconds_not_per_calendar_minute(store):
    """80 writes late in one minute and 80 early in the next were 160 within 60 s under a per-minute counter;
    GitHub's secondary limit counts any 60 s."""
    from bot.store import WriteBudgetSpent

    now = [659.0]  # late in minute 10
    budget = WriteBudget(store, 11, per_minute=80, clock=lambda: now[0])
    for _ in range(80):
        budget.spend()
    now[0] = 661.0  # early in minute 11
    with pytest.raises(WriteBudgetSpent) as spent:
        budget.spend()
    assert spent.value.delay == pytest.approx(58.0)
    now[0] = 719.5  # the first 80 have left the window
    budget.spend()


def test_claim_all_takes_every_key_or_none(store):
    assert store.claim_all(["d-1", "body-1"], 60) is None
    assert store.exists("d-1") and store.exists("body-1")
    assert store.claim_all(["d-2", "body-1"], 60) == 1  # the body was seen under another delivery id
    assert not store.exists("d-2")  # nothing half-claimed
    assert store.claim_all(["d-1", "body-3"], 60) == 0 and not store.exists("body-3")
    store.release("d-1")
    store.release("body-1")
    assert store.claim_all(["d-1", "body-1"], 60) is None


def test_put_all_overwrites_every_key(store):
    store.claim_all(["d-1", "body-1"], 60)
    store.put_all(["d-1", "body-1"], "enqueued", 60)
    assert store.get("d-1") == store.get("body-1") == "enqueued"


def test_keep_latest_never_lets_an_older_stamp_win(store):
    from bot.store import stamped

    assert store.keep_latest("head", "bbb", 200.0, 60)
    assert not store.keep_latest("head", "aaa", 100.0, 60)  # a late delivery of an older push
    assert stamped(store.get("head")) == (200.0, "bbb")
    assert store.keep_latest("head", "ccc", 200.0, 60)  # the same second: the later delivery wins
    assert store.keep_latest("head", "ddd", 300.5, 60)
    assert stamped(store.get("head")) == (300.5, "ddd")
    store.put("head", '{"sha": "old-format"}', 60)  # unstamped: replaced
    assert store.keep_latest("head", "eee", 1.0, 60)
    assert stamped(store.get("head")) == (1.0, "eee")
