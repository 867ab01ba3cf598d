"""The webhook: verify, decide, enqueue, answer. No GitHub call and no analysis in the request."""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from flask import Flask, Response, jsonify, request

from bot.settings import MAX_WEBHOOK_BYTES, Settings, check_webhook_secret

log = logging.getLogger("torchreview.webhook")

DELIVERY_TTL = 7 * 24 * 3600  # GitHub redelivers for up to a few days
PR_ACTIONS = {"opened", "synchronize", "reopened", "ready_for_review"}


@dataclass(frozen=True)
class ReviewRequest:
    """What a worker needs to review one PR head; built from the webhook, never from GitHub calls."""

    installation_id: int
    repository: str  # owner/name
    pull_number: Optional[int]  # None for check_suite events on a head without a known PR
    head_sha: Optional[str]  # None: "whatever the head is when the job runs" (/review)
    reason: str
    delivery: str
    requested_by: Optional[str] = None
    # for ``/review`` commands: the comment, its author's association, and its text
    comment_id: Optional[int] = None
    author_association: Optional[str] = None
    command: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def verify_signature(secret: str, body: bytes, header: Optional[str]) -> bool:
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def route_event(event: str, payload: dict[str, Any], delivery: str, settings: Settings) -> list[ReviewRequest]:
    """The review jobs an event asks for (empty: nothing to do)."""
    installation = (payload.get("installation") or {}).get("id")
    repo = (payload.get("repository") or {}).get("full_name")
    if not installation or not repo:
        return []
    sender = payload.get("sender") or {}
    if event == "pull_request":
        pr = payload.get("pull_request") or {}
        if payload.get("action") not in PR_ACTIONS or pr.get("state") == "closed":
            return []
        return [ReviewRequest(installation, repo, pr.get("number"), (pr.get("head") or {}).get("sha"),
                              f"pull_request.{payload['action']}", delivery)]
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
        return [ReviewRequest(installation, repo, issue.get("number"), None, "command", delivery,
                              requested_by=(comment.get("user") or {}).get("login"), comment_id=comment.get("id"),
                              author_association=comment.get("author_association"), command=body)]
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
        return [ReviewRequest(installation, repo, pr.get("number"), run.get("head_sha"), f"check_run.{action}", delivery,
                              requested_by=sender.get("login"))
                for pr in run.get("pull_requests") or []]
    if event == "check_suite":
        suite = payload.get("check_suite") or {}
        if payload.get("action") not in {"requested", "rerequested"}:
            return []
        # Fork PRs arrive with no pull_requests here; their pull_request events cover them.
        return [ReviewRequest(installation, repo, pr.get("number"), suite.get("head_sha"),
                              f"check_suite.{payload['action']}", delivery)
                for pr in suite.get("pull_requests") or []]
    return []


def _is_bot(user: dict[str, Any], settings: Settings) -> bool:
    login = user.get("login") or ""
    return user.get("type") == "Bot" or login.endswith("[bot]") or (settings.bot_login is not None and login == settings.bot_login)


HANDLED_EVENTS = {"pull_request", "issue_comment", "check_run", "check_suite"}


def create_app(settings: Optional[Settings] = None, *, enqueue: Optional[Callable[[ReviewRequest], None]] = None,
               store=None) -> Flask:
    """App factory. ``enqueue`` and ``store`` default to the Celery task and the shared store."""
    settings = settings or Settings.from_env(role="web")  # the web never reads the App's private key
    if not settings.webhook_secret:
        raise ValueError("GITHUB_WEBHOOK_SECRET is required to serve webhooks")
    check_webhook_secret(settings.webhook_secret)
    if store is None:
        from bot.store import make_store

        store = make_store(settings.redis_url, settings.data_dir)
    if enqueue is None:
        from bot.tasks import enqueuer_for

        enqueue = enqueuer_for(settings)
    from bot import metrics

    app = Flask("torchreview")
    app.config["MAX_CONTENT_LENGTH"] = MAX_WEBHOOK_BYTES
    app.extensions["torchreview.settings"] = settings

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    @app.get("/metrics")
    def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, content_type=content_type)

    @app.post(settings.webhook_path)
    def webhook() -> Response:
        started = time.perf_counter()
        event = request.headers.get("X-GitHub-Event")
        delivery = request.headers.get("X-GitHub-Delivery")
        length = request.content_length
        if length is not None and length > MAX_WEBHOOK_BYTES:
            return _answer(413, "payload too large", event, started)
        body = request.get_data(cache=False)  # raw bytes: the signature covers exactly these
        if len(body) > MAX_WEBHOOK_BYTES:
            return _answer(413, "payload too large", event, started)
        if not verify_signature(settings.webhook_secret, body, request.headers.get("X-Hub-Signature-256")):
            return _answer(401, "missing or invalid X-Hub-Signature-256", event, started)
        if not event or not delivery:
            return _answer(400, "missing X-GitHub-Event or X-GitHub-Delivery header", event, started)
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return _answer(400, "body is not valid JSON", event, started)
        if not isinstance(payload, dict):
            return _answer(400, "body is not a JSON object", event, started)
        if event == "ping":
            return _answer(200, "pong", event, started)
        if event not in HANDLED_EVENTS:
            return _answer(204, None, event, started)
        jobs = route_event(event, payload, delivery, settings)
        if not jobs:
            return _answer(204, None, event, started)
        # Once per delivery id, and once per signed body: a captured delivery replayed under a new
        # X-GitHub-Delivery is not a new event (a genuine one differs in its ids or timestamps).
        keys = [f"torchreview:delivery:{delivery}", f"torchreview:delivery-body:{hashlib.sha256(body).hexdigest()}"]
        claimed = []
        for key in keys:
            if not store.claim(key, DELIVERY_TTL):
                for done in claimed:
                    store.release(done)
                return _answer(200, "duplicate delivery; already enqueued", event, started)
            claimed.append(key)
        try:
            for job in jobs:
                enqueue(job)
        except Exception:
            for key in keys:
                store.release(key)  # let GitHub's redelivery try again
            log.exception("could not enqueue delivery %s", delivery)
            return _answer(503, "could not enqueue; retry the delivery", event, started)
        return _answer(202, f"enqueued {len(jobs)} review job(s)", event, started)

    @app.errorhandler(413)
    def too_large(_error) -> Response:
        return _answer(413, "payload too large", request.headers.get("X-GitHub-Event"), time.perf_counter())

    return app


def _answer(status: int, message: Optional[str], event: Optional[str], started: float) -> Response:
    from bot import metrics

    metrics.observe_webhook(event, status, time.perf_counter() - started)  # a fixed label set, see bot.metrics
    if status == 204:
        return Response(status=204)
    return Response(json.dumps({"message": message}), status=status, content_type="application/json")
