"""The webhook: verify, decide, enqueue, answer. No GitHub call and no analysis in the request."""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from typing import Callable, Optional

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from bot import health
from bot.jobs import ENQUEUED, GPU_QUEUE, REVIEW_QUEUE, Job, delivery_key, route_event
from bot.recover import SweepMetrics
from bot.settings import MAX_WEBHOOK_BYTES, Settings, check_webhook_secret

log = logging.getLogger("torchreview.webhook")

PENDING_TTL = 60  # a claimed delivery not yet on the queue (its request may have died): free again after this


SIGNATURE_RE = re.compile(r"sha256=[0-9a-f]{64}")
_READ_CHUNK = 64 << 10


class _BodyRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def read_signed_body(stream, secret: str, header: Optional[str], limit: int, length: Optional[int]) -> bytes:
    """The body from ``stream`` (``length`` bytes when the request says), read in chunks while its HMAC is
    computed, refused (``_BodyRefused``) past ``limit`` bytes or when it does not match ``header``. A signature
    that cannot be one is refused before a byte of the body is read."""
    if not header or not SIGNATURE_RE.fullmatch(header):
        raise _BodyRefused(401, "missing or invalid X-Hub-Signature-256")
    digest = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    chunks, size = [], 0
    left = limit + 1 if length is None else length  # no read past a stated length: werkzeug's max would refuse it
    while left > 0 and (chunk := stream.read(min(_READ_CHUNK, left))):
        left -= len(chunk)
        size += len(chunk)
        if size > limit:
            raise _BodyRefused(413, "payload too large")
        digest.update(chunk)
        chunks.append(chunk)
    if not hmac.compare_digest("sha256=" + digest.hexdigest(), header):
        raise _BodyRefused(401, "missing or invalid X-Hub-Signature-256")
    return b"".join(chunks)


HANDLED_EVENTS = {"pull_request", "issue_comment", "check_run", "check_suite", "push"}


def create_app(settings: Optional[Settings] = None, *, enqueue: Optional[Callable[[Job], None]] = None,
               store=None) -> Flask:
    """App factory. ``enqueue`` and ``store`` default to the Celery queues (bot.jobs) and the shared store."""
    settings = settings or Settings.from_env(role="web")  # the web never reads the App's private key
    if not settings.webhook_secret:
        raise ValueError("GITHUB_WEBHOOK_SECRET is required to serve webhooks")
    check_webhook_secret(settings.webhook_secret)
    if store is None:
        from bot.store import make_store

        store = make_store(settings.redis_url, settings.data_dir)
    if enqueue is None:
        from bot.jobs import enqueuer_for

        enqueue = enqueuer_for(settings, store)
    from bot import metrics

    app = Flask("torchreview")
    app.config["MAX_CONTENT_LENGTH"] = MAX_WEBHOOK_BYTES  # werkzeug's stream stops a chunked body past it too
    app.extensions["torchreview.settings"] = settings

    if settings.internal_port:
        internal_paths = {"/healthz", "/metrics"}

        @app.before_request
        def one_listener_each():
            # SERVER_PORT is the listening socket's own port under gunicorn, never a client's header
            internal = request.environ.get("SERVER_PORT") == str(settings.internal_port)
            if (request.path in internal_paths) != internal:
                return Response(status=404)
            return None

    @app.get("/healthz")
    def healthz() -> Response:
        missing = health.missing_workers()  # `serve`'s own workers: a delivery now would wait for nobody
        if missing:
            return jsonify(status="unavailable", missing_workers=missing), 503
        return jsonify(status="ok")

    # what the whole deployment shares, read when scraped: the queues, and what the delivery sweeps did
    deployment = (metrics.QueueDepth(settings.broker_url, (REVIEW_QUEUE, GPU_QUEUE)), SweepMetrics(store))

    @app.get("/metrics")
    def prometheus() -> Response:
        body, content_type = metrics.render(*deployment)
        return Response(body, content_type=content_type)

    @app.post(settings.webhook_path)
    def webhook() -> Response:
        started = time.perf_counter()
        event = request.headers.get("X-GitHub-Event")
        delivery = request.headers.get("X-GitHub-Delivery")
        length = request.content_length
        if length is not None and length > MAX_WEBHOOK_BYTES:  # from the header, before reading the body
            return _answer(413, "payload too large", event, started)
        try:  # raw bytes: the signature covers exactly these
            body = read_signed_body(request.stream, settings.webhook_secret,
                                    request.headers.get("X-Hub-Signature-256"), MAX_WEBHOOK_BYTES, length)
        except _BodyRefused as refused:
            return _answer(refused.status, refused.message, event, started)
        except RequestEntityTooLarge:
            return _answer(413, "payload too large", event, started)
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
        keys = [delivery_key(delivery), f"torchreview:delivery-body:{hashlib.sha256(body).hexdigest()}"]
        # A claim is "pending" for a short while, and "enqueued" for days once the jobs are on the queue: a
        # process killed in between (or a Redis gone away) leaves a claim that lapses, not a lost delivery.
        claimed = []
        try:
            held = store.claim_all(keys, PENDING_TTL)  # one round trip: the ack's time is mostly round trips
            if held is not None:
                if store.get(keys[held]) == ENQUEUED:
                    return _answer(200, "duplicate delivery; already enqueued", event, started)
                return _answer(503, "this delivery is being enqueued by another request; retry it", event, started)
            claimed = keys
            for job in jobs:
                enqueue(job)
        except Exception:  # Redis away (a restart) or the queue refused: nothing is enqueued, say so
            log.exception("could not enqueue delivery %s", delivery)
            for key in claimed:
                try:
                    store.release(key)  # a redelivery (bot/recover.py's sweep) may try again
                except Exception:  # noqa: BLE001 - still away: the pending claim lapses by itself
                    log.warning("could not release %s; it lapses in %ss", key, PENDING_TTL)
            return _answer(503, "could not enqueue; retry the delivery", event, started)
        try:
            store.put_all(keys, ENQUEUED, settings.delivery_ttl_s)
        except Exception:  # noqa: BLE001 - enqueued all the same; a redelivery after the lapse runs it twice, idempotently
            log.warning("delivery %s enqueued, but not marked so", delivery, exc_info=True)
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
