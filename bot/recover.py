"""No lost events: redeliver the App's webhook deliveries that failed.

GitHub never retries a delivery the App did not accept (down, deploying, Redis away: a 5xx or no answer);
it keeps the attempts for 3 days and lets the App redeliver them through its REST API, authenticated as
the App (a JWT). The sweep lists the attempts of a recent window, groups them by event (``guid``, the
X-GitHub-Delivery header every redelivery keeps) and redelivers each event that has no successful
attempt, oldest first.

Idempotent, with the webhook's own dedupe (``bot.jobs.delivery_key``): an event the App enqueued (its
answer was lost) is not redelivered; one redelivered is not asked again while its redelivery may still
be on the way (``REDELIVERY_GRACE``); one that succeeded later, under a redelivery, is done; and a
redelivery that arrives twice is answered "duplicate" by the webhook, so a PR is never reviewed twice.

Run by Celery beat in a worker (``torchreview worker --beat``; ``torchreview serve`` does it on one
machine) and by ``torchreview recover --since 24h`` (cron, a Kubernetes CronJob).
"""
from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterator, Optional

log = logging.getLogger("torchreview.recover")

RETENTION = timedelta(days=3)  # GitHub keeps an App's deliveries this long; older ones cannot be redelivered
# a redelivery asked for is given this long to arrive (GitHub sends it shortly after its 202) before it is
# asked again; the webhook's dedupe makes a second copy harmless anyway
REDELIVERY_GRACE = 600
MAX_REDELIVERIES = 5  # failed redeliveries of one event in the window: the App refuses it for good, stop
SWEEP_LOCK = "torchreview:recover:sweep"
SWEEP_LOCK_TTL = 120
LAST_SUCCESS_KEY = "torchreview:recover:last-success"  # when a sweep last went through (unix seconds)
RECOVERED_KEY = "torchreview:recover:redelivered"  # redeliveries asked for, ever (/metrics reads it)
KEEP = 10 * 365 * 24 * 3600  # the two keys above are kept for good
OVERLAP = timedelta(hours=1)  # the scheduled sweep looks back this far before its last success

_DURATION = re.compile(r"(\d+)([wdhms])")
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


class DurationError(ValueError):
    pass


def parse_duration(text: str) -> timedelta:
    """``24h``, ``90m``, ``2d``, ``1h30m``: a positive window no longer than GitHub keeps deliveries."""
    value = text.strip().lower()
    parts = _DURATION.findall(value)
    if not value or "".join(n + u for n, u in parts) != value:
        raise DurationError(f"{text!r} is not a duration: use a number and a unit, e.g. 24h, 90m, 2d or 1h30m "
                            "(units: w, d, h, m, s)")
    window = timedelta(seconds=sum(int(n) * _UNIT_SECONDS[u] for n, u in parts))
    if window <= timedelta(0):
        raise DurationError(f"{text!r} is an empty window: it must be longer than 0")
    if window > RETENTION:
        raise DurationError(f"{text!r} is longer than GitHub keeps deliveries (3 days): use at most 72h")
    return window


@dataclass
class SweepReport:
    examined: int = 0  # events (guids) in the window
    redelivered: list[str] = field(default_factory=list)
    succeeded: int = 0  # an attempt went through: nothing to do
    processed: int = 0  # the App enqueued it although GitHub recorded a failure (its answer was lost)
    in_flight: int = 0  # redelivered recently by a sweep; given REDELIVERY_GRACE to arrive
    gave_up: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: bool = False  # another sweep was running

    def summary(self) -> str:
        if self.skipped:
            return "another sweep is running; nothing done"
        return (f"{self.examined} event(s) in the window: {len(self.redelivered)} redelivered, {self.succeeded} "
                f"delivered, {self.processed} already processed, {self.in_flight} redelivery in flight, "
                f"{len(self.gave_up)} given up after {MAX_REDELIVERIES} redeliveries, {len(self.errors)} error(s)")


def succeeded(attempt) -> bool:
    return attempt.status_code is not None and 200 <= attempt.status_code < 300


def attempts_since(requester, since: datetime, per_page: int = 100) -> Iterator:
    """The App's delivery attempts, newest first, back to ``since`` (PyGithub follows the cursor links).

    PyGithub has no method for the App's hook deliveries (only repository/organization hooks), so this goes
    through its Requester of the App's GithubIntegration: the App's JWT, its retries and error types."""
    from github.HookDelivery import HookDeliverySummary
    from github.PaginatedList import PaginatedList

    for attempt in PaginatedList(HookDeliverySummary, requester, "/app/hook/deliveries", {"per_page": per_page}):
        if attempt.delivered_at is not None and attempt.delivered_at < since:
            return
        yield attempt


def sweep(requester, store, since: datetime) -> SweepReport:
    """Redeliver every event of ``[since, now]`` with no successful attempt (see the module's docstring)."""
    from bot.store import held_lock

    report = SweepReport()
    with held_lock(store, SWEEP_LOCK, SWEEP_LOCK_TTL) as token:
        if token is None:
            report.skipped = True
            return report
        events: "OrderedDict[str, list]" = OrderedDict()
        for attempt in attempts_since(requester, since):
            events.setdefault(attempt.guid, []).append(attempt)
        report.examined = len(events)
        for guid, attempts in reversed(events.items()):  # oldest event first: a PR's events stay in order
            _recover(requester, store, guid, attempts, report)
        store.put(LAST_SUCCESS_KEY, repr(time.time()), KEEP)
    return report


def _recover(requester, store, guid: str, attempts: list, report: SweepReport) -> None:
    from github import GithubException

    from bot.jobs import ENQUEUED, delivery_key

    if any(succeeded(a) for a in attempts):
        report.succeeded += 1
        return
    if store.get(delivery_key(guid)) == ENQUEUED:
        report.processed += 1
        return
    if sum(1 for a in attempts if a.redelivery) >= MAX_REDELIVERIES:
        log.error("delivery %s (%s): %d redeliveries failed (last: %s); not redelivering it again", guid,
                  attempts[0].event, MAX_REDELIVERIES, attempts[0].status)
        report.gave_up.append(guid)
        return
    claim = f"torchreview:recover:redelivered:{guid}"
    if not store.claim(claim, REDELIVERY_GRACE):
        report.in_flight += 1
        return
    newest = attempts[0]
    try:
        requester.requestJsonAndCheck("POST", f"/app/hook/deliveries/{newest.id}/attempts")
    except GithubException as exc:
        store.release(claim)  # not redelivered: the next sweep tries again
        log.warning("could not redeliver %s (attempt %s): %s %s", guid, newest.id, exc.status, exc.data)
        report.errors.append(guid)
        return
    store.count(RECOVERED_KEY, KEEP)
    log.info("redelivered %s (%s.%s, last attempt %s: %s)", guid, newest.event, newest.action, newest.id,
             newest.status)
    report.redelivered.append(guid)


def scheduled_since(store, now: Optional[datetime] = None) -> datetime:
    """The window of a scheduled sweep: back to an hour before the last sweep that went through (so an
    outage of the whole App is covered when it comes back), at least an hour, at most GitHub's 3 days."""
    now = now or datetime.now(timezone.utc)
    raw = store.get(LAST_SUCCESS_KEY)
    try:
        last = datetime.fromtimestamp(float(raw), timezone.utc) if raw else None
    except ValueError:
        last = None
    since = (last - OVERLAP) if last is not None else now - RETENTION
    return max(now - RETENTION, min(since, now - OVERLAP))


class SweepMetrics:
    """What the sweeps did, from the shared store: a `recover` run by cron counts as much as the beat's."""

    def __init__(self, store) -> None:
        self.store = store

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            recovered, last = self.store.get(RECOVERED_KEY), self.store.get(LAST_SUCCESS_KEY)
        except Exception as exc:  # noqa: BLE001 - the store away: the scrape still answers
            log.warning("delivery sweep metrics: the store did not answer: %s", exc)
            return
        yield CounterMetricFamily("torchreview_deliveries_recovered", "Failed webhook deliveries redelivered by the "
                                  "sweep (bot/recover.py)", value=float(recovered or 0))
        if last is not None:
            yield GaugeMetricFamily("torchreview_delivery_sweep_last_success_timestamp_seconds",
                                    "When a delivery sweep last went through (unix seconds)", value=float(last))
