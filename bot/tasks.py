"""Celery: the worker side. The tasks load a job description (bot.jobs) and run it; a job that hits a
transient GitHub error, the shared write budget or a busy lock is re-queued with a countdown, never
slept on inside the worker."""
from __future__ import annotations

import logging
from functools import lru_cache

from celery.signals import worker_process_init

import bot.worker_metrics  # noqa: F401 - connects the worker's metrics endpoint to Celery's signals
from bot.jobs import REVIEW_TASK, SMOKE_TASK, job_from_dict, make_celery
from bot.settings import Settings

log = logging.getLogger("torchreview.tasks")

MAX_RETRIES = 8
BUDGET_RETRIES = 1000  # waiting for the next minute's write budget is not a failure

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


@celery_app.task(bind=True, name=REVIEW_TASK, max_retries=MAX_RETRIES, acks_late=True, reject_on_worker_lost=True)
def review_pull_request(self, request: dict) -> str:
    from bot.github_client import classify
    from bot.jobs import CommandJob
    from bot.pipeline import LockBusy, fail_check_run, run_command, run_review
    from bot.store import WriteBudgetSpent

    job = job_from_dict(request)
    settings, store, clients = _runtime()
    try:
        outcome = run_command(job, clients, store) if isinstance(job, CommandJob) else run_review(job, clients, store)
    except LockBusy as busy:
        raise self.retry(countdown=busy.delay, max_retries=MAX_RETRIES * 4)
    except WriteBudgetSpent as spent:
        log.info("review %s#%s: write budget spent; again in %.0fs", job.repository, job.pull_number, spent.delay)
        raise self.retry(countdown=spent.delay, max_retries=BUDGET_RETRIES)
    except Exception as exc:  # noqa: BLE001 - classified below
        transient = classify(exc, self.request.retries)
        if transient is not None and self.request.retries < MAX_RETRIES:
            log.warning("review %s#%s: %s; retrying in %.0fs", job.repository, job.pull_number, transient, transient.delay)
            raise self.retry(exc=transient, countdown=transient.delay)
        log.exception("review %s#%s failed for good", job.repository, job.pull_number)
        if not isinstance(job, CommandJob):
            fail_check_run(job, clients, store, f"{type(exc).__name__}: {exc}")
        raise
    log.info("review %s#%s: %s", job.repository, job.pull_number, outcome)
    return outcome


@celery_app.task(bind=True, name=SMOKE_TASK, max_retries=3, acks_late=True, reject_on_worker_lost=True)
def smoke_pull_request(self, request: dict) -> str:
    from bot.github_client import classify
    from bot.smoke import SmokeBusy, fail_smoke_check_run, run_smoke_job
    from bot.store import WriteBudgetSpent

    job = job_from_dict(request)  # the same pinned head_sha on every retry: never re-read
    settings, store, clients = _runtime()
    try:
        outcome = run_smoke_job(job, clients, store)
    except SmokeBusy:
        raise self.retry(countdown=30, max_retries=200)  # a redelivered copy waits for the running one
    except WriteBudgetSpent as spent:
        raise self.retry(countdown=spent.delay, max_retries=BUDGET_RETRIES)
    except Exception as exc:  # noqa: BLE001 - classified below
        transient = classify(exc, self.request.retries)
        if transient is not None and self.request.retries < self.max_retries:
            raise self.retry(exc=transient, countdown=transient.delay)
        log.exception("smoke %s#%s failed for good", job.repository, job.pull_number)
        fail_smoke_check_run(job, clients, store, f"{type(exc).__name__}: {exc}")
        raise
    log.info("smoke %s#%s: %s", job.repository, job.pull_number, outcome)
    return outcome
