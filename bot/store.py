"""Small shared state: delivery de-duplication and per-PR locks.

Redis in production (``SET NX`` with a TTL, shared by every web process and worker); a SQLite
file in the embedded single-machine mode, with the same semantics.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Protocol


class Store(Protocol):
    def claim(self, key: str, ttl: int) -> bool:
        """Set ``key`` if absent; True when this caller set it (first delivery), False otherwise."""

    def claim_all(self, keys: list[str], ttl: int) -> Optional[int]:
        """Set every key of ``keys`` if none is set (None), else set nothing: the index of the first set one."""

    def release(self, key: str) -> None:
        ...

    def exists(self, key: str) -> bool:
        ...

    def acquire(self, key: str, ttl: int) -> Optional[str]:
        """A lock token when ``key`` was free (held for at most ``ttl`` s), else None."""

    def unlock(self, key: str, token: str) -> None:
        ...

    def extend(self, key: str, token: str, ttl: int) -> bool:
        """Hold the lock ``ttl`` s more if ``token`` still holds it; False when it was lost."""

    def count(self, key: str, ttl: int) -> int:
        """Increment a counter that expires ``ttl`` s after its first increment; the new value."""

    def take_slot(self, key: str, limit: int, window: float, now: float) -> Optional[float]:
        """Record one use at ``now`` if fewer than ``limit`` were recorded in the ``window`` s before it
        (None); else the seconds until the oldest of them leaves the window. Atomic across processes."""

    def put(self, key: str, value: str, ttl: int) -> None:
        """Set ``key`` to ``value`` for ``ttl`` s (overwriting)."""

    def keep_first(self, key: str, value: str, ttl: int) -> str:
        """Set ``key`` to ``value`` for ``ttl`` s unless it is set; the value it holds (the first one wins)."""

    def put_all(self, keys: list[str], value: str, ttl: int) -> None:
        """``put`` each of ``keys`` (in one round trip where the store has them)."""

    def keep_latest(self, key: str, value: str, at: float, ttl: int) -> bool:
        """Set ``key`` to ``value``, stamped ``at``, unless it holds a value stamped later; whether it was set."""

    def get(self, key: str) -> Optional[str]:
        ...

    def add_feedback(self, record: dict) -> bool:
        """Record one reviewer's verdict on one comment (``record["id"]`` names it); False if already known."""

    def feedback(self) -> list[dict]:
        """Every recorded verdict, oldest first."""

    def add_event(self, record: dict) -> bool:
        """Record what became of one of the App's comments (posted, fixed...; ``record["id"]``); False if known."""

    def events(self) -> list[dict]:
        """Every recorded comment event, oldest first."""


class RedisStore:
    _UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
    _EXTEND = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('expire', KEYS[1], ARGV[2]) "
               "else return 0 end")

    def __init__(self, url: str) -> None:
        import redis
        from redis.backoff import ExponentialWithJitterBackoff
        from redis.retry import Retry

        # Reconnect through a restart of Redis (a deploy: a second or two away), not only a dropped socket.
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5,
                                           retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 12))

    def claim(self, key: str, ttl: int) -> bool:
        return bool(self.client.set(key, "1", nx=True, ex=ttl))

    _CLAIM_ALL = """
for i, key in ipairs(KEYS) do
  if redis.call('exists', key) == 1 then return i - 1 end
end
for _, key in ipairs(KEYS) do redis.call('set', key, '1', 'EX', ARGV[1]) end
return -1
"""

    def claim_all(self, keys: list[str], ttl: int) -> Optional[int]:
        held = int(self.client.eval(self._CLAIM_ALL, len(keys), *keys, int(ttl)))
        return None if held < 0 else held

    def release(self, key: str) -> None:
        self.client.delete(key)

    def exists(self, key: str) -> bool:
        return bool(self.client.exists(key))

    def acquire(self, key: str, ttl: int) -> Optional[str]:
        token = uuid.uuid4().hex
        return token if self.client.set(key, token, nx=True, ex=ttl) else None

    def unlock(self, key: str, token: str) -> None:
        self.client.eval(self._UNLOCK, 1, key, token)  # only the holder may unlock

    def extend(self, key: str, token: str, ttl: int) -> bool:
        return bool(self.client.eval(self._EXTEND, 1, key, token, int(ttl)))

    def count(self, key: str, ttl: int) -> int:
        pipe = self.client.pipeline()
        pipe.set(key, 0, nx=True, ex=ttl)
        pipe.incr(key)
        return int(pipe.execute()[1])

    _TAKE_SLOT = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('zremrangebyscore', KEYS[1], '-inf', now - window)
if redis.call('zcard', KEYS[1]) < limit then
  redis.call('zadd', KEYS[1], now, ARGV[4])
  redis.call('expire', KEYS[1], math.ceil(window) + 1)
  return nil
end
local oldest = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
return tostring(tonumber(oldest[2]) + window - now)
"""

    def take_slot(self, key: str, limit: int, window: float, now: float) -> Optional[float]:
        wait = self.client.eval(self._TAKE_SLOT, 1, key, repr(now), repr(window), limit, uuid.uuid4().hex)
        return None if wait is None else float(wait)

    def put(self, key: str, value: str, ttl: int) -> None:
        self.client.set(key, value, ex=ttl)

    # Scripts, not pipelines: one round trip, atomic, and no pipeline object (costly to build in redis-py).
    _KEEP_FIRST = "redis.call('set', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) return redis.call('get', KEYS[1])"
    _PUT_ALL = "for _, key in ipairs(KEYS) do redis.call('set', key, ARGV[1], 'EX', ARGV[2]) end"

    def keep_first(self, key: str, value: str, ttl: int) -> str:
        return self.client.eval(self._KEEP_FIRST, 1, key, value, int(ttl)).decode()

    def put_all(self, keys: list[str], value: str, ttl: int) -> None:
        self.client.eval(self._PUT_ALL, len(keys), *keys, value, int(ttl))

    # the value is kept as "<at> <value>"
    _KEEP_LATEST = """
local held = redis.call('get', KEYS[1])
if held then
  local at = tonumber(string.match(held, '^(%S+) '))
  if at and at > tonumber(ARGV[2]) then return 0 end
end
redis.call('set', KEYS[1], ARGV[2] .. ' ' .. ARGV[1], 'EX', ARGV[3])
return 1
"""

    def keep_latest(self, key: str, value: str, at: float, ttl: int) -> bool:
        return bool(self.client.eval(self._KEEP_LATEST, 1, key, value, repr(float(at)), int(ttl)))

    def get(self, key: str) -> Optional[str]:
        value = self.client.get(key)
        return value.decode() if value is not None else None

    FEEDBACK = "torchreview:feedback"
    EVENTS = "torchreview:comment-events"

    def add_feedback(self, record: dict) -> bool:
        return self._append_once(self.FEEDBACK, record)

    def feedback(self) -> list[dict]:
        return self._records(self.FEEDBACK)

    def add_event(self, record: dict) -> bool:
        return self._append_once(self.EVENTS, record)

    def events(self) -> list[dict]:
        return self._records(self.EVENTS)

    def _append_once(self, log: str, record: dict) -> bool:
        if not self.client.hsetnx(log + ":seen", record["id"], 1):
            return False  # kept for good: it is the record of what users said and what became of our comments
        self.client.rpush(log, json.dumps(record, sort_keys=True))
        return True

    def _records(self, log: str) -> list[dict]:
        return [json.loads(item) for item in self.client.lrange(log, 0, -1)]


class SqliteStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self._local = threading.local()
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS keys (key TEXT PRIMARY KEY, value TEXT, expires REAL)")
            db.execute("CREATE TABLE IF NOT EXISTS feedback (id TEXT PRIMARY KEY, record TEXT, at REAL)")
            db.execute("CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, record TEXT, at REAL)")
            db.execute("CREATE TABLE IF NOT EXISTS slots (key TEXT, at REAL)")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            self._local.db = db
        yield db

    def _set_nx(self, key: str, value: str, ttl: int) -> bool:
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM keys WHERE key = ? AND expires < ?", (key, now))
                inserted = db.execute("INSERT OR IGNORE INTO keys VALUES (?, ?, ?)", (key, value, now + ttl)).rowcount
                db.execute("COMMIT")
            except Exception:
                db.execute("ROLLBACK")
                raise
        return inserted == 1

    def claim(self, key: str, ttl: int) -> bool:
        return self._set_nx(key, "1", ttl)

    def claim_all(self, keys: list[str], ttl: int) -> Optional[int]:
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                held = [db.execute("SELECT 1 FROM keys WHERE key = ? AND expires >= ?", (key, now)).fetchone()
                        for key in keys]
                first = next((i for i, row in enumerate(held) if row is not None), None)
                if first is None:
                    db.executemany("INSERT OR REPLACE INTO keys VALUES (?, '1', ?)", [(key, now + ttl) for key in keys])
                db.execute("COMMIT")
            except Exception:
                db.execute("ROLLBACK")
                raise
        return first

    def add_feedback(self, record: dict) -> bool:
        return self._insert_once("feedback", record)

    def feedback(self) -> list[dict]:
        return self._records("feedback")

    def add_event(self, record: dict) -> bool:
        return self._insert_once("events", record)

    def events(self) -> list[dict]:
        return self._records("events")

    def _insert_once(self, table: str, record: dict) -> bool:  # table: one of the two names above, never input
        with self._db() as db:
            return db.execute(f"INSERT OR IGNORE INTO {table} VALUES (?, ?, ?)",
                              (record["id"], json.dumps(record, sort_keys=True), time.time())).rowcount == 1

    def _records(self, table: str) -> list[dict]:
        with self._db() as db:
            return [json.loads(row[0]) for row in db.execute(f"SELECT record FROM {table} ORDER BY at, id")]

    def release(self, key: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM keys WHERE key = ?", (key,))

    def exists(self, key: str) -> bool:
        with self._db() as db:
            row = db.execute("SELECT 1 FROM keys WHERE key = ? AND expires >= ?", (key, time.time())).fetchone()
        return row is not None

    def acquire(self, key: str, ttl: int) -> Optional[str]:
        token = uuid.uuid4().hex
        return token if self._set_nx(key, token, ttl) else None

    def unlock(self, key: str, token: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM keys WHERE key = ? AND value = ?", (key, token))

    def extend(self, key: str, token: str, ttl: int) -> bool:
        now = time.time()
        with self._db() as db:
            return db.execute("UPDATE keys SET expires = ? WHERE key = ? AND value = ? AND expires >= ?",
                              (now + ttl, key, token, now)).rowcount == 1

    def count(self, key: str, ttl: int) -> int:
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM keys WHERE key = ? AND expires < ?", (key, now))
                db.execute("INSERT OR IGNORE INTO keys VALUES (?, '0', ?)", (key, now + ttl))
                db.execute("UPDATE keys SET value = CAST(value AS INTEGER) + 1 WHERE key = ?", (key,))
                value = db.execute("SELECT value FROM keys WHERE key = ?", (key,)).fetchone()[0]
                db.execute("COMMIT")
            except Exception:
                db.execute("ROLLBACK")
                raise
        return int(value)

    def take_slot(self, key: str, limit: int, window: float, now: float) -> Optional[float]:
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM slots WHERE key = ? AND at <= ?", (key, now - window))
                times = [row[0] for row in db.execute("SELECT at FROM slots WHERE key = ? ORDER BY at", (key,))]
                if len(times) < limit:
                    db.execute("INSERT INTO slots VALUES (?, ?)", (key, now))
                db.execute("COMMIT")
            except Exception:
                db.execute("ROLLBACK")
                raise
        return None if len(times) < limit else times[0] + window - now

    def put(self, key: str, value: str, ttl: int) -> None:
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?, ?)", (key, value, time.time() + ttl))

    def keep_first(self, key: str, value: str, ttl: int) -> str:
        if self._set_nx(key, value, ttl):
            return value
        held = self.get(key)
        return value if held is None else held  # expired in between: nobody else's value to keep

    def put_all(self, keys: list[str], value: str, ttl: int) -> None:
        with self._db() as db:
            db.executemany("INSERT OR REPLACE INTO keys VALUES (?, ?, ?)", [(key, value, time.time() + ttl) for key in keys])

    def keep_latest(self, key: str, value: str, at: float, ttl: int) -> bool:
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT value FROM keys WHERE key = ? AND expires >= ?", (key, now)).fetchone()
                held_at = _stamp(row[0]) if row else None
                newer = held_at is None or held_at <= at
                if newer:
                    db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?, ?)", (key, f"{at!r} {value}", now + ttl))
                db.execute("COMMIT")
            except Exception:
                db.execute("ROLLBACK")
                raise
        return newer

    def get(self, key: str) -> Optional[str]:
        with self._db() as db:
            row = db.execute("SELECT value FROM keys WHERE key = ? AND expires >= ?", (key, time.time())).fetchone()
        return None if row is None else str(row[0])


def stamped(raw: Optional[str]) -> Optional[tuple[float, str]]:
    """A ``keep_latest`` value read back with ``get``: (stamp, value), or None."""
    at = _stamp(raw)
    return None if at is None else (at, raw.split(" ", 1)[1])


def _stamp(raw: Optional[str]) -> Optional[float]:
    head, space, _ = (raw or "").partition(" ")
    try:
        return float(head) if space else None
    except ValueError:
        return None


@contextmanager
def held_lock(store: "Store", key: str, ttl: int) -> Iterator[Optional[str]]:
    """Hold ``key`` while the block runs (None: someone else holds it), renewing it every ``ttl / 3`` s.

    A short time to live, renewed by the living holder: a worker killed mid-job (a lost node, an OOM kill)
    leaves the lock for at most ``ttl`` s, instead of blocking every later job on that key for as long as
    the longest job could ever take."""
    token = store.acquire(key, ttl)
    if token is None:
        yield None
        return
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            try:
                if not store.extend(key, token, ttl):
                    return
            except Exception:  # noqa: BLE001 - a Redis hiccup: the next renewal tries again, well within ttl
                continue

    renewer = threading.Thread(target=renew, name=f"renew {key}", daemon=True)
    renewer.start()
    try:
        yield token
    finally:
        stop.set()
        renewer.join()
        store.unlock(key, token)


class WriteBudgetSpent(Exception):
    """This minute's write budget is used up: re-queue the job ``delay`` s later (never sleep in a worker)."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"GitHub write budget spent for this minute; retry in {delay:.0f}s")
        self.delay = delay


class WriteBudget:
    """At most ``per_minute`` content-creating GitHub requests per installation, across all workers.

    GitHub's secondary rate limits start at about 80 content-creating requests a minute; staying under
    them is cheaper than being throttled. When the budget is used, ``spend()`` raises WriteBudgetSpent
    (the task re-queues itself with a countdown); only with an explicit ``sleep`` does it wait.
    """

    def __init__(self, store: "Store", installation_id: int, per_minute: int = 80,
                 sleep=None, clock=time.time) -> None:
        self.store, self.installation_id, self.per_minute = store, installation_id, per_minute
        self.sleep, self.clock = sleep, clock

    WINDOW = 60.0

    def spend(self) -> None:
        # A sliding window: with a counter per calendar minute, 80 writes at the end of one minute and 80
        # at the start of the next made 160 within 60 s.
        while True:
            wait = self.store.take_slot(f"torchreview:writes:{self.installation_id}", self.per_minute, self.WINDOW,
                                        self.clock())
            if wait is None:
                return
            delay = max(0.05, wait)
            if self.sleep is None:
                raise WriteBudgetSpent(delay)
            self.sleep(delay)


def results_cache(store: "Store"):
    """The analysis results cache beside ``store``: shared through Redis by every worker, or a folder of
    the data directory in the embedded mode; None for another kind of store."""
    from analyzers.cache import RedisResultStore, ResultCache

    if isinstance(store, RedisStore):
        return ResultCache(RedisResultStore(store.client))
    if isinstance(store, SqliteStore):
        return ResultCache.in_directory(Path(store.path).parent / "results-cache")
    return None


def make_store(redis_url: Optional[str], data_dir: Path) -> Store:
    return RedisStore(redis_url) if redis_url else SqliteStore(data_dir / "state.sqlite")
