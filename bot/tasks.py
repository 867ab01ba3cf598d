"""Celery: the worker side. The tasks load a job description (bot.jobs) and run it; a job that hits a
transient GitHub error, the shared write budget or a busy lock is re-queued with a countdown, never
slept on inside the worker."""
from __future__ import annotations

import logging
import os
import socket
from functools import lru_cache

from celery.signals import after_setup_logger, after_setup_task_logger, worker_process_init

import bot.worker_metrics  # noqa: F401 - connects the worker's metrics endpoint to Celery's signals
import bot.health  # noqa: F401 - a worker of `torchreview serve` tells the web it is up
from bot.jobs import (BASE_PUSH_TASK, RECOVER_TASK, REVIEW_TASK, SMOKE_TASK, job_from_dict, longest_countdown,
                      make_celery)
from bot.settings import Settings

log = logging.getLogger("torchreview.tasks")

MAX_RETRIES = 8  # GitHub or Redis failures in a row; waiting below is not failing
BUDGET_RETRIES = 1000  # waiting for the next minute's write budget is not a failure
LOCK_RETRIES = 1000  # nor is waiting for the job ahead on the same PR (its lock lapses within LOCK_TTL if it died)

# Only the broker settings; role "web" reads no private key (web processes import this module too).
celery_app = make_celery(Settings.from_env(require_github=False, role="web"))


@lru_cache(maxsize=1)
def _runtime():
    """Settings, store and GitHub clients, built once per worker process."""
    from bot.github_client import GitHubClients
    from bot.store import make_store

    settings = Settings.from_env(role="worker")
    return settings, make_store(settings.redis_url, settings.data_dir), GitHubClients(settings)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redacted_logs(logger=None, **_kwargs) -> None:
    from bot.log_redaction import redact_handlers

    redact_handlers()  # the root's handlers, where Celery's own records (task failures) end up too
    if logger is not None:
        redact_handlers(logger)


@worker_process_init.connect
def _fresh_clients(**_kwargs) -> None:
    _runtime.cache_clear()  # forked pool children must not share the parent's connections


def _note_redelivery(task, job) -> None:
    """A job the broker handed out again because the worker holding it was lost (or Redis restarted)."""
    if (task.request.delivery_info or {}).get("redelivered"):
        log.warning("%s %s#%s: redelivered after a lost worker", job.kind, job.repository, job.pull_number)


# A job whose runs killed the worker holding them (out of memory, a signal) this many times is failed, never run
# again: acks_late + reject_on_worker_lost re-queue it after each loss, so it would take a worker slot for good.
WORKER_LOSSES_ALLOWED = 2
RUNNING_TTL = 24 * 3600


def _started(task, store) -> int:
    """Mark the job (its task id, kept by Celery's redeliveries and by our retries) as running; the number of
    workers that died running it so far. A mark still there when the job starts was left by a run that never
    finished: its worker was lost (a job waiting on a lock or the write budget in between is a retry that
    finished, so losses are counted across retries)."""
    running, losses = _running_key(task), f"torchreview:job-losses:{task.request.id}"
    holder = store.get(running)
    if holder and _alive_here(holder):
        return int(store.get(losses) or 0)
    lost = store.count(losses, RUNNING_TTL) if holder else int(store.get(losses) or 0)
    store.put(running, _holder(), RUNNING_TTL)
    return lost


def _running_key(task) -> str:
    return f"torchreview:job-running:{task.request.id}"


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive_here(holder: str) -> bool:
    """Whether the process that marked the job running is alive on this machine: then this start is a copy
    Redis redelivered (visibility timeout) while it runs, not a loss."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mark_started(task, store, request: dict, failures: int) -> int:
    """``_started``, with Redis away longer than the store's reconnects ride out re-queueing the job (a wait, not
    one of its failures): raised out of the task, the error failed it, and a failed job is acknowledged, gone."""
    try:
        return _started(task, store)
    except Exception as exc:  # noqa: BLE001 - classified below
        transient = _transient(exc, failures)
        if transient is None or transient.reason != "redis":
            raise
        raise _again(task, request, failures, transient.delay, task.request.retries + 1, "redis", exc=transient)


def _finished(task, store) -> None:
    try:
        store.unlock(_running_key(task), _holder())  # only our own mark: a live run's stays
    except Exception:  # noqa: BLE001 - Redis away: the next start of this job counts one loss too many
        log.warning("could not clear the running mark of %s", task.request.id, exc_info=True)


def _worker_loss_message(losses: int) -> str:
    return (f"this job stopped the worker running it {losses} times (out of memory or killed: a file in the pull "
            "request may be built to exhaust the reviewer), so it is not run again")


def _has_check_run(job) -> bool:
    """Whether ``job`` reviews a head (and so has a check run to fail): a review, or a bare ``/review``."""
    from bot.commands import parse_command
    from bot.jobs import CommandJob, ReviewJob

    if isinstance(job, ReviewJob):
        return job.reason != "pull_request.closed"
    command = parse_command(job.command or "") if isinstance(job, CommandJob) else None
    return command is not None and command.name == "review"


# How long a retry's message is offered to the broker before giving up: through a restart of Redis (a deploy: a
# second or a few away), as the store's commands are (bot.store.RedisStore). Celery's default gives up after about
# half a second of refused connections.
RETRY_PUBLISH_POLICY = {"max_retries": 12, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 1.0}


def _again(task, request: dict, failures: int, countdown: float, max_retries: int, reason: str, exc=None):
    """Re-queue the job; ``failures`` (GitHub or Redis errors in a row) rides along with it, so that waits
    for a lock or the write budget neither lengthen the back-off nor use up the failures allowed.
    ``reason``: one of bot.metrics.RETRY_REASONS, counted.

    A retry is a new message published, then the one held acknowledged. When the broker refuses the new one
    (Redis away longer than ``RETRY_PUBLISH_POLICY`` rides out), Celery rejects the held message *without*
    requeueing it, and the job is gone for good (a head never reviewed, although its delivery was acknowledged).
    The held message is put back instead: it runs again at once, or, if the broker is still away when the worker
    hands it back, after the visibility timeout (it stays in Redis's unacknowledged set until then)."""
    from celery.exceptions import Reject

    from bot import metrics

    metrics.JOB_RETRIES.labels(kind=request.get("kind") or "review", reason=reason).inc()
    try:
        return task.retry(args=[request], kwargs={"failures": failures}, countdown=min(countdown, longest_countdown()),
                          max_retries=max_retries, exc=exc, retry_policy=RETRY_PUBLISH_POLICY)
    except Reject as refused:
        log.warning("%s %s#%s: the broker refused its retry (%s); put back on the queue as it was",
                    request.get("kind") or "review", request.get("repository"), request.get("pull_number"),
                    refused.reason)
        raise Reject(refused.reason, requeue=True) from None


def _transient(exc: BaseException, failures: int):
    """GitHub's "later" (bot.github_client.classify), or Redis away for a moment (a restart, a failover)."""
    import redis

    from bot.github_client import TransientGitHubError, backoff, classify

    from kombu.exceptions import OperationalError

    # Redis as the store, or as the broker a job enqueues on (a smoke job, a base push's reviews): kombu's error
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OperationalError)):
        return TransientGitHubError(f"Redis unavailable: {exc}", backoff(failures), reason="redis")
    return classify(exc, failures)


@celery_app.task(bind=True, name=REVIEW_TASK, max_retries=MAX_RETRIES, acks_late=True, reject_on_worker_lost=True)
def review_pull_request(self, request: dict, failures: int = 0) -> str:
    from bot.jobs import CommandJob
    from bot.pipeline import LockBusy, fail_check_run, run_command, run_review
    from bot.store import WriteBudgetSpent

    job = job_from_dict(request)
    _note_redelivery(self, job)
    settings, store, clients = _runtime()
    losses = _mark_started(self, store, request, failures)
    if losses >= WORKER_LOSSES_ALLOWED:
        _finished(self, store)
        log.error("review %s#%s: %s", job.repository, job.pull_number, _worker_loss_message(losses))
        if _has_check_run(job):
            fail_check_run(job, clients, store, _worker_loss_message(losses))
        return f"failed: {losses} lost workers"
    try:
        try:
            outcome = run_command(job, clients, store) if isinstance(job, CommandJob) else run_review(job, clients, store)
        except LockBusy as busy:
            raise _again(self, request, failures, busy.delay, LOCK_RETRIES, "lock_busy")
        except WriteBudgetSpent as spent:
            log.info("review %s#%s: write budget spent; again in %.0fs", job.repository, job.pull_number, spent.delay)
            raise _again(self, request, failures, spent.delay, BUDGET_RETRIES, "write_budget")
        except Exception as exc:  # noqa: BLE001 - classified below
            transient = _transient(exc, failures)
            if transient is not None and transient.rate_limited:  # GitHub said when: waiting is not failing
                log.warning("review %s#%s: %s; again in %.0fs", job.repository, job.pull_number, transient, transient.delay)
                raise _again(self, request, failures, transient.delay, BUDGET_RETRIES, transient.reason, exc=transient)
            if transient is not None and failures < MAX_RETRIES:
                log.warning("review %s#%s: %s; retrying in %.0fs", job.repository, job.pull_number, transient, transient.delay)
                raise _again(self, request, failures + 1, transient.delay, self.request.retries + 1, transient.reason,
                             exc=transient)
            log.exception("review %s#%s failed for good", job.repository, job.pull_number)
            if not isinstance(job, CommandJob):
                fail_check_run(job, clients, store, f"{type(exc).__name__}: {exc}")
            raise
        log.info("review %s#%s: %s", job.repository, job.pull_number, outcome)
        return outcome
    finally:
        _finished(self, store)


SMOKE_FAILURES = 3


@celery_app.task(bind=True, name=SMOKE_TASK, max_retries=SMOKE_FAILURES, acks_late=True, reject_on_worker_lost=True)
def smoke_pull_request(self, request: dict, failures: int = 0) -> str:
    from bot.smoke import SmokeBusy, fail_smoke_check_run, run_smoke_job
    from bot.store import WriteBudgetSpent

    job = job_from_dict(request)  # the same pinned head_sha on every retry: never re-read
    _note_redelivery(self, job)
    settings, store, clients = _runtime()
    losses = _mark_started(self, store, request, failures)
    if losses >= WORKER_LOSSES_ALLOWED:
        _finished(self, store)
        log.error("smoke %s#%s: %s", job.repository, job.pull_number, _worker_loss_message(losses))
        fail_smoke_check_run(job, clients, store, _worker_loss_message(losses))
        return f"failed: {losses} lost workers"
    try:
        try:
            outcome = run_smoke_job(job, clients, store)
        except SmokeBusy:
            raise _again(self, request, failures, 30, 200, "smoke_busy")  # a redelivered copy waits for the running one
        except WriteBudgetSpent as spent:
            raise _again(self, request, failures, spent.delay, BUDGET_RETRIES, "write_budget")
        except Exception as exc:  # noqa: BLE001 - classified below
            transient = _transient(exc, failures)
            if transient is not None and transient.rate_limited:
                raise _again(self, request, failures, transient.delay, BUDGET_RETRIES, transient.reason, exc=transient)
            if transient is not None and failures < SMOKE_FAILURES:
                raise _again(self, request, failures + 1, transient.delay, self.request.retries + 1, transient.reason,
                             exc=transient)
            log.exception("smoke %s#%s failed for good", job.repository, job.pull_number)
            fail_smoke_check_run(job, clients, store, f"{type(exc).__name__}: {exc}")
            raise
        log.info("smoke %s#%s: %s", job.repository, job.pull_number, outcome)
        return outcome
    finally:
        _finished(self, store)


@celery_app.task(bind=True, name=BASE_PUSH_TASK, max_retries=MAX_RETRIES, acks_late=True, reject_on_worker_lost=True)
def base_pushed(self, request: dict, failures: int = 0) -> str:
    """A push that may have changed a branch's configuration: the open PRs on it are reviewed again
    (bot/base_push.py). Only GitHub reads and enqueueing here: a retry enqueues no review twice."""
    from bot.base_push import run_base_push

    job = job_from_dict(request)
    settings, store, clients = _runtime()
    try:
        outcome = run_base_push(job, clients, store)
    except Exception as exc:  # noqa: BLE001 - classified below
        transient = _transient(exc, failures)
        if transient is not None and (transient.rate_limited or failures < MAX_RETRIES):
            log.warning("push %s:%s: %s; again in %.0fs", job.repository, job.branch, transient, transient.delay)
            raise _again(self, request, failures + (not transient.rate_limited), transient.delay,
                         BUDGET_RETRIES if transient.rate_limited else self.request.retries + 1, transient.reason,
                         exc=transient)
        log.exception("push %s:%s failed for good", job.repository, job.branch)
        raise
    log.info("push %s:%s: %s", job.repository, job.branch, outcome)
    return outcome


@celery_app.task(name=RECOVER_TASK, ignore_result=True)
def recover_deliveries() -> str:
    """The scheduled delivery sweep (bot/recover.py): a failure is logged, and the next run tries again."""
    from bot.recover import scheduled_since, sweep

    settings, store, clients = _runtime()
    report = sweep(clients.integration.requester, store, scheduled_since(store))
    log.info("delivery sweep: %s", report.summary())
    return report.summary()
