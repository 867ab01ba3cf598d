"""Prometheus metrics for the webhook and the workers."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

WEBHOOKS = Counter("torchreview_webhooks_total", "Webhook deliveries answered", ["event", "status"])
WEBHOOK_SECONDS = Histogram("torchreview_webhook_seconds", "Time to answer a webhook delivery",
                            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
REVIEWS = Counter("torchreview_reviews_total", "Review jobs finished", ["outcome"])
REVIEW_SECONDS = Histogram("torchreview_review_seconds", "Time to review one pull request head",
                           buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300))


def observe_webhook(event: str, status: int, seconds: float) -> None:
    WEBHOOKS.labels(event=event, status=str(status)).inc()
    WEBHOOK_SECONDS.observe(seconds)


def render() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST
