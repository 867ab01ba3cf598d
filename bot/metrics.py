"""Prometheus metrics for the webhook and the workers.

Both run several processes (gunicorn workers, Celery pool children), each with its own counters. With
``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is first imported, every process writes
its values to files there and a scrape adds them up (prometheus-client's multiprocess mode):
``torchreview serve`` sets it for gunicorn, and each Celery worker for its pool (``bot.worker_metrics``).
"""
from __future__ import annotations

import os
from typing import Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# The ``event`` label takes only these values: unsigned deliveries are counted too (as 401s) and
# anyone can send any X-GitHub-Event, so a free-text label would let them add series without bound.
EVENT_LABELS = ("pull_request", "issue_comment", "check_run", "check_suite", "ping", "none", "other")

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


def render() -> tuple[bytes, str]:
    return generate_latest(registry()), CONTENT_TYPE_LATEST


def mark_process_dead(pid: int) -> None:
    """Drop a dead process's live-gauge files (its counters stay, summed into the totals)."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
