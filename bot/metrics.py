"""Prometheus metrics for the webhook and the workers.

Both run several processes (gunicorn workers, Celery pool children), each with its own counters. With
``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is first imported, every process writes
its values to files there and a scrape adds them up (prometheus-client's multiprocess mode):
``torchreview serve`` sets it for gunicorn, and each Celery worker for its pool (``bot.worker_metrics``).
"""
from __future__ import annotations

import logging
import os
from typing import Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
log = logging.getLogger("torchreview.metrics")

# The ``event`` label takes only these values: unsigned deliveries are counted too (as 401s) and
# anyone can send any X-GitHub-Event, so a free-text label would let them add series without bound.
EVENT_LABELS = ("pull_request", "issue_comment", "check_run", "check_suite", "push", "ping", "none", "other")

WEBHOOKS = Counter("torchreview_webhooks_total", "Webhook deliveries answered", ["event", "status"])
WEBHOOK_SECONDS = Histogram("torchreview_webhook_seconds", "Time to answer a webhook delivery",
                            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
REVIEWS = Counter("torchreview_reviews_total", "Review jobs finished", ["outcome"])
FEEDBACK = Counter("torchreview_feedback_total", "Reviewers' verdicts on the bot's comments (👎, /review false-positive)",
                   ["rule", "kind"])
REVIEW_SECONDS = Histogram("torchreview_review_seconds", "Time to review one pull request head",
                           buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300))
# Files of a review whose analysis came from the results cache (hit) or was computed (miss).
ANALYSIS_CACHE = Counter("torchreview_analysis_cache_total", "Changed files analyzed, by results-cache outcome",
                         ["result"])

# Jobs put back on their queue, by why (bot.tasks): GitHub's rate limit, its 5xx, the network, Redis, or
# waiting for the write budget / the job ahead on the same PR. Climbing: something is wrong upstream.
JOB_RETRIES = Counter("torchreview_job_retries_total", "Jobs re-queued to try again later, by job kind and reason",
                      ["kind", "reason"])
RETRY_REASONS = ("rate_limit", "github_5xx", "network", "redis", "write_budget", "lock_busy", "smoke_busy")
# Every response of GitHub's REST API to the App (bot.github_client.observe_github_responses).
GITHUB_RESPONSES = Counter("torchreview_github_responses_total", "Responses from GitHub's API, by HTTP status",
                           ["status"])
# From the X-RateLimit-* headers of the latest response (of any process: "mostrecent").
GITHUB_RATE_LIMIT_REMAINING = Gauge("torchreview_github_rate_limit_remaining",
                                    "Requests left in GitHub's rate-limit window (the latest response's "
                                    "X-RateLimit-Remaining)", ["resource"], multiprocess_mode="mostrecent")
GITHUB_RATE_LIMIT_RESET = Gauge("torchreview_github_rate_limit_reset_timestamp_seconds",
                                "When GitHub's rate-limit window resets (X-RateLimit-Reset, unix seconds)",
                                ["resource"], multiprocess_mode="mostrecent")
RATE_LIMIT_RESOURCES = ("core", "graphql", "search", "code_search", "integration_manifest", "code_scanning_upload")


def observe_github_response(status: int, headers: dict) -> None:
    """One response of GitHub's API (``headers`` lower-cased, as PyGithub keeps them)."""
    GITHUB_RESPONSES.labels(status=str(status)).inc()
    remaining, reset = headers.get("x-ratelimit-remaining"), headers.get("x-ratelimit-reset")
    if remaining is None:
        return
    resource = headers.get("x-ratelimit-resource") or "core"
    resource = resource if resource in RATE_LIMIT_RESOURCES else "other"  # a header value: keep the label set fixed
    try:
        GITHUB_RATE_LIMIT_REMAINING.labels(resource=resource).set(float(remaining))
        if reset is not None:
            GITHUB_RATE_LIMIT_RESET.labels(resource=resource).set(float(reset))
    except ValueError:
        pass  # not a number: nothing to report


def event_label(event: Optional[str]) -> str:
    if not event:
        return "none"
    return event if event in EVENT_LABELS else "other"


def observe_webhook(event: Optional[str], status: int, seconds: float) -> None:
    WEBHOOKS.labels(event=event_label(event), status=str(status)).inc()
    WEBHOOK_SECONDS.observe(seconds)


def multiprocess_dir() -> Optional[str]:
    return os.environ.get(MULTIPROC_ENV) or None


def registry() -> CollectorRegistry:
    """What a scrape reports: every process's values in multiprocess mode, else this process's."""
    if multiprocess_dir() is None:
        from prometheus_client import REGISTRY

        return REGISTRY
    from prometheus_client import multiprocess

    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)
    return collected


class _Scrape:
    """The registry's metrics and the ``extra`` collectors' (read when scraped), as one source."""

    def __init__(self, *sources) -> None:
        self.sources = sources

    def collect(self):
        for source in self.sources:
            yield from source.collect()


def render(*extra) -> tuple[bytes, str]:
    return generate_latest(_Scrape(registry(), *extra)), CONTENT_TYPE_LATEST


class QueueDepth:
    """Jobs waiting in each queue, read from the broker when scraped: one value for the deployment,
    whichever process is asked (the web's /metrics)."""

    def __init__(self, broker_url: str, queues: tuple[str, ...]) -> None:
        self.broker_url = broker_url
        self.queues = queues

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily("torchreview_queue_depth", "Jobs waiting in the queue for a worker", labels=["queue"])
        up = GaugeMetricFamily("torchreview_queue_depth_up", "1: the broker answered the queue-depth read")
        try:
            depths = queue_depths(self.broker_url, self.queues)
        except Exception as exc:  # noqa: BLE001 - a scrape reports the broker as away, it does not fail
            log.warning("queue depth: the broker did not answer: %s", exc)
            up.add_metric([], 0)
        else:
            for queue, count in depths.items():
                depth.add_metric([queue], count)
            up.add_metric([], 1)
        yield depth
        yield up


SQLITE_BROKER = "sqla+sqlite:///"


def queue_depths(broker_url: str, queues: tuple[str, ...]) -> dict[str, int]:
    if broker_url.startswith(SQLITE_BROKER):
        # Read-only, straight from kombu's tables: kombu's own size query would create a missing queue's
        # row, racing a starting worker that creates it too.
        import sqlite3
        from contextlib import closing

        path = broker_url[len(SQLITE_BROKER):]
        if not os.path.exists(path):
            return {queue: 0 for queue in queues}
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)) as db:
            try:
                found = dict(db.execute("SELECT q.name, COUNT(m.id) FROM kombu_queue q LEFT JOIN kombu_message m "
                                        "ON m.queue_id = q.id AND m.visible = 1 GROUP BY q.name").fetchall())
            except sqlite3.OperationalError as exc:
                if "no such table" not in str(exc):
                    raise
                found = {}  # nothing was ever queued
        return {queue: int(found.get(queue, 0)) for queue in queues}
    from kombu import Connection
    from kombu.exceptions import ChannelError

    depths = {}
    with Connection(broker_url, connect_timeout=2, transport_options={"socket_timeout": 2}) as connection:
        connection.ensure_connection(max_retries=1)
        channel = connection.default_channel
        for queue in queues:
            try:  # passive: count, never create
                depths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
            except ChannelError:
                depths[queue] = 0  # Redis keeps no empty list
    return depths


def mark_process_dead(pid: int) -> None:
    """Drop a dead process's live-gauge files (its counters stay, summed into the totals)."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
