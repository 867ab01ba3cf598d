"""Celery: the app (Redis broker, or an embedded SQLite broker) and the review task."""
from __future__ import annotations

import logging
import os
from functools import lru_cache

from celery import Celery
from celery.signals import worker_process_init

import bot.worker_metrics  # noqa: F401 - connects the worker's metrics endpoint to Celery's signals
from bot.settings import Settings
from bot.webhook import ReviewRequest

log = logging.getLogger("torchreview.tasks")

REVIEW_QUEUE = "reviews"
GPU_QUEUE = "gpu"  # smoke training: `torchreview worker --queues gpu` on GPU machines
MAX_RETRIES = 8


def make_celery(settings: Settings) -> Celery:
    app = Celery("torchreview", broker=settings.broker_url)
    visibility = int(os.environ.get("TORCHREVIEW_VISIBILITY_TIMEOUT", "900"))
    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.conf.update(
        task_default_queue=REVIEW_QUEUE,
        task_ignore_result=True,
        task_acks_late=True,  # a job is acknowledged when done, so a killed worker's job is redelivered
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Redis re-delivers the unacknowledged jobs of a dead worker after ``visibility`` seconds;
        # surviving workers sweep for them every few seconds (kombu's default is ~100 s). The
        # SQLAlchemy transport hands its options to create_engine, so it gets none.
        broker_transport_options={
            "visibility_timeout": visibility,
            "unacked_restore_interval": max(1, min(10, visibility // 2)),
            "unacked_restore_throttle": 1,
        } if settings.redis_url else {},
    )
    return app


# Only the broker settings; role "web" reads no private key (web processes import this module too).
celery_app = make_celery(Settings.from_env(require_github=False, role="web"))


@lru_cache(maxsize=1)
def _runtime():
    """Settings, store and GitHub clients, built once per worker process."""
    from bot.github_client import GitHubClients
    from bot.store import make_store

    settings = Settings.from_env(role="worker")
    return settings, make_store(settings.redis_url, settings.data_dir), GitHubClients(settings)


@worker_process_init.connect
def _fresh_clients(**_kwargs) -> None:
    _runtime.cache_clear()  # forked pool children must not share the parent's connections


@celery_app.task(bind=True, name="torchreview.review_pull_request", max_retries=MAX_RETRIES, acks_late=True,
                 reject_on_worker_lost=True)
def review_pull_request(self, request: dict) -> str:
    from bot.github_client import classify
    from bot.pipeline import LockBusy, fail_check_run, run_command, run_review

    job = ReviewRequest(**request)
    settings, store, clients = _runtime()
    try:
        outcome = run_command(job, clients, store) if job.reason == "command" else run_review(job, clients, store)
    except LockBusy as busy:
        raise self.retry(countdown=busy.delay, max_retries=MAX_RETRIES * 4)
    except Exception as exc:  # noqa: BLE001 - classified below
        transient = classify(exc, self.request.retries)
        if transient is not None and self.request.retries < MAX_RETRIES:
            log.warning("review %s#%s: %s; retrying in %.0fs", job.repository, job.pull_number, transient, transient.delay)
            raise self.retry(exc=transient, countdown=transient.delay)
        log.exception("review %s#%s failed for good", job.repository, job.pull_number)
        fail_check_run(job, clients, store, f"{type(exc).__name__}: {exc}")
        raise
    log.info("review %s#%s: %s", job.repository, job.pull_number, outcome)
    return outcome


@celery_app.task(bind=True, name="torchreview.smoke_pull_request", max_retries=3, acks_late=True,
                 reject_on_worker_lost=True)
def smoke_pull_request(self, request: dict) -> str:
    from bot.github_client import classify
    from bot.smoke import SmokeBusy, run_smoke_job

    job = ReviewRequest(**request)
    settings, store, clients = _runtime()
    try:
        outcome = run_smoke_job(job, clients, store)
    except SmokeBusy:
        raise self.retry(countdown=30, max_retries=200)  # a redelivered copy waits for the running one
    except Exception as exc:  # noqa: BLE001 - classified below
        transient = classify(exc, self.request.retries)
        if transient is not None and self.request.retries < self.max_retries:
            raise self.retry(exc=transient, countdown=transient.delay)
        log.exception("smoke %s#%s failed for good", job.repository, job.pull_number)
        raise
    log.info("smoke %s#%s: %s", job.repository, job.pull_number, outcome)
    return outcome


def enqueue_smoke(job: ReviewRequest) -> None:
    smoke_pull_request.apply_async(args=[job.to_dict()], queue=GPU_QUEUE)


def enqueuer_for(settings: Settings):
    """A function that enqueues review jobs on the broker ``settings`` name."""
    producer = celery_app if settings.broker_url == celery_app.conf.broker_url else make_celery(settings)

    def enqueue(job: ReviewRequest) -> None:
        producer.send_task(review_pull_request.name, args=[job.to_dict()], queue=REVIEW_QUEUE)

    return enqueue
