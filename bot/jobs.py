"""Job descriptions and enqueueing: what the webhook decides and what the workers run.

The webhook, the tasks and the pipeline all import this module and nothing imports back, so the
import graph has no circle (webhook -> jobs <- tasks -> pipeline/smoke -> jobs).

A job is everything a worker needs, fixed when the job is made: in particular a smoke job carries
the exact commit it may execute (``head_sha``), pinned when the run was authorized, so a retry or a
push in between can never make it run other code.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Union

from bot.settings import Settings
from bot.store import stamped

log = logging.getLogger("torchreview.jobs")

REVIEW_QUEUE = "reviews"
GPU_QUEUE = "gpu"  # smoke training: `torchreview worker --queues gpu` on GPU machines
REVIEW_TASK = "torchreview.review_pull_request"
SMOKE_TASK = "torchreview.smoke_pull_request"
RECOVER_TASK = "torchreview.recover_deliveries"  # the delivery sweep (bot/recover.py), on Celery beat
BASE_PUSH_TASK = "torchreview.base_pushed"  # a push that may have changed a branch's configuration (bot/base_push.py)
PR_ACTIONS = {"opened", "synchronize", "reopened", "ready_for_review"}
PUSHED_HEAD_REASONS = {f"pull_request.{action}" for action in PR_ACTIONS}
RETARGETED = "pull_request.edited"  # a base change (route_event sends no other edit)
BASE_CONFIG_CHANGED = "push.base_config"  # a push changed the configuration of the PR's base branch
# A new verdict on an unchanged head, because what it is judged against changed: a fresh check run at once.
REJUDGED_REASONS = {RETARGETED, BASE_CONFIG_CHANGED}
NO_COMMIT = "0" * 40  # a push's `before` when it creates the branch, its `after` when it deletes it
# GitHub lists at most this many commits in a push payload (documented for timeline events; webhooks may list more):
# a push listing this many may have left some out
PUSH_COMMITS_LISTED = 20
SMOKE_CHECK_NAME = "torchreview / smoke"
_FULL_SHA = re.compile(r"[0-9a-f]{40}")
HEAD_TTL = 30 * 24 * 3600  # how long the webhook remembers a PR's last pushed head


@dataclass(frozen=True, kw_only=True)
class ReviewJob:
    """Review one PR head (static analysis); built from the webhook, never from GitHub calls."""

    installation_id: int
    repository: str  # owner/name
    pull_number: Optional[int]
    head_sha: Optional[str]  # None: "whatever the head is when the job runs" (/review)
    reason: str
    delivery: str
    requested_by: Optional[str] = None
    # pull_request events: when GitHub last updated the PR (for a push: the push), to pin commands
    pr_updated_at: Optional[str] = None
    # a base branch's configuration push: the commit that made the configuration this head is judged by again
    base_sha: Optional[str] = None

    kind = "review"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class CommandJob:
    """A ``/review ...`` comment. ``head_sha``: for ``/review smoke``, the PR head the webhook knew
    when the comment was written (None when it did not know one that was pushed before the comment)."""

    installation_id: int
    repository: str
    pull_number: int
    delivery: str
    comment_id: Optional[int]
    command: str  # the comment body
    requested_by: Optional[str]
    comment_created_at: Optional[str] = None
    head_sha: Optional[str] = None
    author_association: Optional[str] = None
    reason: str = "command"

    kind = "command"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class SmokeJob:
    """Smoke-train exactly ``head_sha`` of a PR. ``reason``: "smoke.auto" (after a review, subject to
    ``smoke.trust``), "command.smoke" (authorized by ``requested_by``'s permission) or
    "check_run.rerequested" / "check_run.requested_action" (re-run of a smoke check run)."""

    installation_id: int
    repository: str
    pull_number: int
    head_sha: str
    reason: str
    delivery: str
    requested_by: Optional[str] = None
    comment_id: Optional[int] = None

    kind = "smoke"

    def __post_init__(self) -> None:
        if not _FULL_SHA.fullmatch(self.head_sha or ""):  # a prefix could name a commit pushed later
            raise ValueError(f"a smoke job needs the full 40-hex SHA of the commit it runs, not {self.head_sha!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class BasePushJob:
    """A push to ``branch`` that may have changed its configuration (bot/base_push.py decides, lists the open
    PRs on it and enqueues their reviews). ``config_paths``: the configuration files the payload says the push
    touched; None when the payload cannot say (a new branch, a forced push, commits or file lists left out)."""

    installation_id: int
    repository: str
    branch: str
    before: str
    after: str
    delivery: str
    config_paths: Optional[list[str]] = None
    pushed_at: Optional[float] = None  # when (epoch seconds): the newest push's configuration wins

    kind = "base_push"
    pull_number = None  # about a branch, no one PR (logs name jobs by repository#number)
    reason = "push"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


Job = Union[ReviewJob, CommandJob, SmokeJob, BasePushJob]
_KINDS = {cls.kind: cls for cls in (ReviewJob, CommandJob, SmokeJob, BasePushJob)}


def job_from_dict(data: dict[str, Any]) -> Job:
    """The job a task was given (unknown keys are dropped, so older queued jobs still load)."""
    data = dict(data)
    kind = data.pop("kind", None)
    if kind is None:  # queued before jobs had kinds
        reason = str(data.get("reason") or "")
        kind = "command" if reason == "command" else "smoke" if reason in ("smoke.auto", "command.smoke") else "review"
    cls = _KINDS[kind]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# ---- from a webhook delivery to jobs ---------------------------------------------------------------

ENQUEUED = "enqueued"  # a delivery's dedupe key once its jobs are on the queue (the webhook's claim)


def delivery_key(guid: str) -> str:
    """The dedupe key of a delivery: its X-GitHub-Delivery, which every redelivery of the event keeps (the
    webhook claims it, the delivery sweep reads it)."""
    return f"torchreview:delivery:{guid}"


def route_event(event: str, payload: dict[str, Any], delivery: str, settings: Settings) -> list[Job]:
    """The jobs an event asks for (empty: nothing to do). Pure: no GitHub call, no shared state."""
    installation = (payload.get("installation") or {}).get("id")
    repo = (payload.get("repository") or {}).get("full_name")
    if not installation or not repo:
        return []
    sender = payload.get("sender") or {}
    if event == "pull_request":
        pr = payload.get("pull_request") or {}
        if payload.get("action") == "closed":  # a last look at what reviewers said about our comments
            return [ReviewJob(installation_id=installation, repository=repo, pull_number=pr.get("number"),
                              head_sha=(pr.get("head") or {}).get("sha"), reason="pull_request.closed",
                              delivery=delivery)]
        action = payload.get("action")
        # A retargeted PR (edited, changes.base) is judged again: its verdict depends on the base (the base's
        # configuration, what `filter: introduced` compares with); title or body edits change nothing of it.
        retargeted = action == "edited" and "base" in (payload.get("changes") or {})
        if (action not in PR_ACTIONS and not retargeted) or pr.get("state") == "closed":
            return []
        return [ReviewJob(installation_id=installation, repository=repo, pull_number=pr.get("number"),
                          head_sha=(pr.get("head") or {}).get("sha"), reason=f"pull_request.{action}",
                          delivery=delivery, pr_updated_at=pr.get("updated_at"))]
    if event == "issue_comment":
        comment = payload.get("comment") or {}
        issue = payload.get("issue") or {}
        if payload.get("action") != "created" or not issue.get("pull_request"):
            return []
        if _is_bot(comment.get("user") or {}, settings) or _is_bot(sender, settings):
            return []
        from bot.commands import parse_command

        body = comment.get("body") or ""
        if parse_command(body) is None:
            return []
        return [CommandJob(installation_id=installation, repository=repo, pull_number=issue.get("number"),
                           delivery=delivery, comment_id=comment.get("id"), command=body,
                           requested_by=(comment.get("user") or {}).get("login"),
                           comment_created_at=comment.get("created_at"),
                           author_association=comment.get("author_association"))]
    if event == "check_run":
        run = payload.get("check_run") or {}
        action = payload.get("action")
        if (run.get("app") or {}).get("id") not in (None, settings.app_id) and settings.app_id is not None:
            return []  # another App's check run
        if action == "requested_action":
            if (payload.get("requested_action") or {}).get("identifier") != "rerun":
                return []
        elif action != "rerequested":
            return []
        if run.get("name") == SMOKE_CHECK_NAME and run.get("head_sha"):
            # Re-running a smoke check run executes PR code: the smoke job checks the clicker's
            # permission, and runs the commit the check run is on, nothing newer.
            return [SmokeJob(installation_id=installation, repository=repo, pull_number=pr.get("number"),
                             head_sha=run["head_sha"], reason=f"check_run.{action}", delivery=delivery,
                             requested_by=sender.get("login"))
                    for pr in run.get("pull_requests") or []]
        return [ReviewJob(installation_id=installation, repository=repo, pull_number=pr.get("number"),
                          head_sha=run.get("head_sha"), reason=f"check_run.{action}", delivery=delivery,
                          requested_by=sender.get("login"))
                for pr in run.get("pull_requests") or []]
    if event == "push":
        ref, after = payload.get("ref") or "", payload.get("after") or NO_COMMIT
        if not ref.startswith("refs/heads/") or payload.get("deleted") or after == NO_COMMIT:
            return []  # a tag, or a deleted branch: no open PR has it as its base
        paths = config_paths_pushed(payload)
        if paths is not None and not paths:
            return []  # the payload lists every change, and none is to a configuration file
        pushed_at = (payload.get("repository") or {}).get("pushed_at")
        return [BasePushJob(installation_id=installation, repository=repo, branch=ref[len("refs/heads/"):],
                            before=payload.get("before") or NO_COMMIT, after=after, delivery=delivery,
                            config_paths=None if paths is None else sorted(paths),
                            pushed_at=float(pushed_at) if isinstance(pushed_at, (int, float)) else None)]
    if event == "check_suite":
        suite = payload.get("check_suite") or {}
        if payload.get("action") not in {"requested", "rerequested"}:
            return []
        # Fork PRs arrive with no pull_requests here; their pull_request events cover them.
        return [ReviewJob(installation_id=installation, repository=repo, pull_number=pr.get("number"),
                          head_sha=suite.get("head_sha"), reason=f"check_suite.{payload['action']}",
                          delivery=delivery)
                for pr in suite.get("pull_requests") or []]
    return []


def config_paths_pushed(payload: dict[str, Any]) -> Optional[set[str]]:
    """The configuration files (``analyzers.config.CONFIG_FILES_IN_ORDER``) a push payload says its commits added,
    modified or removed; None when the payload cannot tell for sure: a new branch (nothing to compare with), a
    forced push (commits it dropped are not listed), a list that may have been cut (no commits, as many as GitHub
    lists at most, the last not the pushed head) or a commit without its file lists."""
    from analyzers.config import CONFIG_FILES_IN_ORDER

    commits = payload.get("commits")
    before, after = payload.get("before") or NO_COMMIT, payload.get("after") or NO_COMMIT
    if payload.get("created") or payload.get("forced") or before == NO_COMMIT:
        return None
    if not isinstance(commits, list) or not commits or len(commits) >= PUSH_COMMITS_LISTED:
        return None
    if not isinstance(commits[-1], dict) or commits[-1].get("id") != after:
        return None
    touched: set[str] = set()
    for commit in commits:
        lists = [commit.get(name) if isinstance(commit, dict) else None for name in ("added", "modified", "removed")]
        if not all(isinstance(paths, list) for paths in lists):
            return None
        touched.update(path for paths in lists for path in paths if isinstance(path, str))
    return touched & set(CONFIG_FILES_IN_ORDER)


def _is_bot(user: dict[str, Any], settings: Settings) -> bool:
    login = user.get("login") or ""
    return user.get("type") == "Bot" or login.endswith("[bot]") or (settings.bot_login is not None and login == settings.bot_login)


# ---- pinning: which head a command saw ---------------------------------------------------------------


def _head_key(repository: str, number: int) -> str:
    return f"torchreview:head:{repository}#{number}"


def _timestamp(value: Optional[str]) -> Optional[datetime]:
    """GitHub's timestamps, always UTC (one without a zone is read as UTC, so every two compare)."""
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None
    return at.replace(tzinfo=timezone.utc) if at is not None and at.tzinfo is None else at


def remember_head(store, job: ReviewJob) -> None:
    """Record the head a pull_request event announced, with when it was pushed (newest wins)."""
    if not (job.reason in PUSHED_HEAD_REASONS and job.pull_number and job.head_sha):
        return  # an edit (a retarget) pushes nothing: its updated_at is not when the head was pushed
    at = _timestamp(job.pr_updated_at)
    if at is None:
        return
    # atomic: a late, older delivery (or one racing it in another web process) never wins
    store.keep_latest(_head_key(job.repository, job.pull_number), job.head_sha, at.timestamp(), HEAD_TTL)


def _known(store, key: str) -> Optional[tuple[str, datetime]]:
    raw = store.get(key)
    known = stamped(raw)
    if known is not None:
        return known[1], datetime.fromtimestamp(known[0], timezone.utc)
    try:  # the JSON record earlier versions wrote (kept for HEAD_TTL): still a known head
        data = json.loads(raw or "")
        at = _timestamp(data["at"])
        return (data["sha"], at) if isinstance(data["sha"], str) and at is not None else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def pin_command(store, job: CommandJob) -> CommandJob:
    """``/review smoke``: the head known to have been pushed no later than the comment, or None.

    Ties within GitHub's one-second timestamps count as "before the comment". A head pushed after
    the comment (its delivery may arrive first) is never pinned: the worker then asks for an
    explicit ``/review smoke <sha>``.
    """
    from bot.commands import parse_command

    command = parse_command(job.command)
    if command is None or command.name != "smoke" or not job.pull_number:
        return job
    known = _known(store, _head_key(job.repository, job.pull_number))
    written = _timestamp(job.comment_created_at)
    if known is None or written is None or known[1] > written:
        return replace(job, head_sha=None)
    return replace(job, head_sha=known[0])


# ---- which base commit's configuration judges a PR --------------------------------------------------------

# how long a branch's newest configuration commit is remembered (each configuration push renews it)
BASE_CONFIG_TTL = 180 * 24 * 3600


def base_config_key(repository: str, branch: str) -> str:
    return f"torchreview:base-config:{repository}:{branch}"


def newest_config_commit(store, repository: str, branch: str) -> Optional[str]:
    """The newest commit of ``branch`` known to have changed its configuration, or None. GitHub refreshes a
    PR's ``base.sha`` only now and then, so it can predate such a push: reviews read the configuration here."""
    if store is None:
        return None
    known = stamped(store.get(base_config_key(repository, branch)))
    return known[1] if known is not None else None


def config_commit(store, repository: str, pr, pinned: Optional[str] = None) -> str:
    """The base commit whose configuration judges ``pr``: the newest of its base branch known to have changed the
    configuration, else ``pinned`` (the one a base-configuration job was made for), else the PR's ``base.sha``."""
    return newest_config_commit(store, repository, pr.base.ref) or pinned or pr.base.sha


# ---- enqueueing ------------------------------------------------------------------------------------


def visibility_timeout() -> int:
    """Seconds before Redis hands a job nobody acknowledged to another worker (the holder is presumed dead)."""
    return int(os.environ.get("TORCHREVIEW_VISIBILITY_TIMEOUT", "900"))


def longest_countdown() -> float:
    """The longest a job may wait before its retry: a job waiting (unacknowledged) past the visibility
    timeout would be handed to a second worker while the first still holds it, and run twice."""
    return max(1.0, 0.8 * visibility_timeout())


def recover_interval() -> int:
    """Seconds between two scheduled delivery sweeps (``TORCHREVIEW_RECOVER_INTERVAL``, default 600)."""
    value = os.environ.get("TORCHREVIEW_RECOVER_INTERVAL", "600").strip()
    if not value.isdigit() or int(value) < 10:
        raise ValueError(f"TORCHREVIEW_RECOVER_INTERVAL must be a number of seconds, at least 10; got {value!r}")
    return int(value)


def make_celery(settings: Settings):
    from celery import Celery

    app = Celery("torchreview", broker=settings.broker_url)
    visibility = visibility_timeout()
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
        # for the worker that runs beat (`torchreview worker --beat`, or `serve`'s): a sweep that finds no
        # worker free before the next one is due is dropped, not piled up
        beat_schedule={"recover-webhook-deliveries": {
            "task": RECOVER_TASK, "schedule": recover_interval(),
            "options": {"queue": REVIEW_QUEUE, "expires": recover_interval()}}},
    )
    return app


QUEUES = (REVIEW_QUEUE, GPU_QUEUE)


def declare_queues(settings: Settings) -> None:
    """Embedded broker: create its tables and queue rows before any web or worker process uses them.

    kombu's SQLAlchemy transport inserts a queue's row on first use, guarded by a lock of its own
    process only: a webhook's first send and a starting worker both inserted ``reviews``, and the
    loser died of ``UNIQUE constraint failed: kombu_queue.name``. Declared here first (under a file
    lock, so two declaring commands take turns), every later use only reads the row. Redis needs none.
    """
    if not settings.embedded:
        return
    import fcntl

    from kombu import Connection, Exchange, Queue

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.data_dir / "broker.lock", "w") as lock, Connection(settings.broker_url) as connection:
        fcntl.flock(lock, fcntl.LOCK_EX)
        channel = connection.default_channel
        for name in QUEUES:  # the same queues Celery declares for ``-Q reviews`` / ``-Q gpu``
            Queue(name, Exchange(name), routing_key=name, channel=channel).declare()


_producers: dict[str, Any] = {}


def _producer(settings: Settings):
    """One Celery app per broker URL and process, used only to send tasks by name."""
    app = _producers.get(settings.broker_url)
    if app is None:
        app = _producers[settings.broker_url] = make_celery(settings)
    return app


def send(job: Job, settings: Optional[Settings] = None) -> None:
    """Put ``job`` on its queue: smoke jobs on the GPU queue, the rest on the review queue."""
    # only the broker is needed here, and web processes send jobs too: never read the private key for it
    settings = settings or Settings.from_env(require_github=False, role="web")
    name, queue = ((SMOKE_TASK, GPU_QUEUE) if isinstance(job, SmokeJob)
                   else (BASE_PUSH_TASK, REVIEW_QUEUE) if isinstance(job, BasePushJob) else (REVIEW_TASK, REVIEW_QUEUE))
    # The webhook sends these while GitHub waits: Celery's generic repr of the arguments and a queue
    # declaration per message (the workers declare their queues) are most of a send's CPU.
    _producer(settings).send_task(name, args=[job.to_dict()], queue=queue, declare=[],
                                  argsrepr=f"[{job.kind} {job.repository}#{job.pull_number} {job.reason}]",
                                  kwargsrepr="{}")


def enqueue_smoke(job: SmokeJob) -> None:
    send(job)


def enqueuer_for(settings: Settings, store=None) -> Callable[[Job], None]:
    """The webhook's enqueue: remembers pushed heads and pins ``/review smoke`` to the one the
    comment saw (with ``store``), then sends the job."""

    def enqueue(job: Job) -> None:
        if store is not None:
            if isinstance(job, ReviewJob):
                remember_head(store, job)
            elif isinstance(job, CommandJob):
                job = pin_command(store, job)
        send(job, settings)

    return enqueue
