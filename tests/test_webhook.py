"""Real HTTP into the Flask app, real Redis for the queue and de-duplication, real payloads."""
from __future__ import annotations

import json
import threading

import pytest
import requests
from werkzeug.serving import make_server

from bot.settings import Settings
from bot.webhook import create_app
from tests.conftest import WEBHOOK_SECRET, payload, signed_headers

QUEUE = "reviews"


@pytest.fixture
def webhook(redis_url, redis_client, tmp_path):
    settings = Settings(app_id=None, private_key=None, webhook_secret=WEBHOOK_SECRET, redis_url=redis_url,
                        data_dir=tmp_path)
    app = create_app(settings)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}{settings.webhook_path}"
    server.shutdown()


def queued(redis_client) -> list[dict]:
    jobs = []
    for raw in redis_client.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        import base64

        body = json.loads(base64.b64decode(message["body"]))
        jobs.append(body[0][0])
    return jobs


def post(url, body: bytes, headers: dict):
    return requests.post(url, data=body, headers=headers, timeout=10)


def test_pull_request_opened_is_enqueued(webhook, redis_client):
    body = json.dumps(payload("pull_request.opened")).encode()
    response = post(webhook, body, signed_headers(body, "pull_request"))
    assert response.status_code == 202
    (job,) = queued(redis_client)
    assert job["repository"] == "Codertocat/Hello-World" and job["pull_number"] == 2
    assert job["head_sha"] == "ec26c3e57ca3a959ca5aad62de7213c562f8c821" and job["installation_id"] == 1


@pytest.mark.parametrize("mutate,status", [
    (lambda h: h.pop("X-Hub-Signature-256"), 401),
    (lambda h: h.update({"X-Hub-Signature-256": "sha256=" + "0" * 64}), 401),
    (lambda h: h.update({"X-Hub-Signature-256": "sha1=abc"}), 401),
    (lambda h: h.pop("X-GitHub-Event"), 400),
    (lambda h: h.pop("X-GitHub-Delivery"), 400),
])
def test_bad_deliveries_are_rejected_and_nothing_enqueued(webhook, redis_client, mutate, status):
    body = json.dumps(payload("pull_request.opened")).encode()
    headers = signed_headers(body, "pull_request")
    mutate(headers)
    assert post(webhook, body, headers).status_code == status
    assert queued(redis_client) == []


def test_wrong_secret(webhook, redis_client):
    body = json.dumps(payload("pull_request.opened")).encode()
    assert post(webhook, body, signed_headers(body, "pull_request", secret="other")).status_code == 401
    assert queued(redis_client) == []


def test_malformed_json_signed(webhook, redis_client):
    body = b'{"action": "opened", '
    assert post(webhook, body, signed_headers(body, "pull_request")).status_code == 400
    assert queued(redis_client) == []


def test_oversized_body_413(webhook, redis_client):
    body = b"{" + b" " * (25 * 1024 * 1024 + 10) + b"}"
    assert post(webhook, body, signed_headers(body, "pull_request")).status_code == 413
    assert queued(redis_client) == []


def test_unhandled_events_and_actions_204(webhook, redis_client):
    # (pull_request.closed is handled: a last read of reviewers' feedback, tests/test_feedback_e2e.py)
    for event, name in [("installation", "installation.created"),
                        ("pull_request", "pull_request.labeled"), ("issue_comment", "issue_comment.created")]:
        body = json.dumps(payload(name)).encode()
        assert post(webhook, body, signed_headers(body, event)).status_code == 204, name
    assert queued(redis_client) == []


def test_a_base_change_is_reviewed_again_a_title_edit_is_not(webhook, redis_client):
    edited = payload("derived/pull_request.edited")  # changes.title only
    body = json.dumps(edited).encode()
    assert post(webhook, body, signed_headers(body, "pull_request")).status_code == 204
    edited["changes"] = {"base": {"ref": {"from": "release-1.0"}, "sha": {"from": "a" * 40}}}
    edited["pull_request"]["updated_at"] = "2030-01-01T00:00:00Z"
    body = json.dumps(edited).encode()
    assert post(webhook, body, signed_headers(body, "pull_request")).status_code == 202
    (job,) = queued(redis_client)
    assert job["reason"] == "pull_request.edited" and job["head_sha"] == edited["pull_request"]["head"]["sha"]
    # an edit pushes nothing: /review smoke stays pinned to when the head was pushed, not to the edit
    assert not [key for key in redis_client.keys("torchreview:head:*")]


def test_a_push_is_enqueued_only_when_it_may_have_changed_the_configuration(webhook, redis_client):
    push = payload("push")  # a branch's first push: nothing to compare its file lists with
    body = json.dumps(push).encode()
    headers = signed_headers(body, "push")
    assert post(webhook, body, headers).status_code == 202
    assert post(webhook, body, headers).status_code == 200  # the same delivery again: enqueued once
    (job,) = queued(redis_client)
    assert job["kind"] == "base_push" and job["config_paths"] is None and job["after"] == push["after"]
    assert job["branch"] == "master" and job["pushed_at"] == push["repository"]["pushed_at"]
    message = json.loads(redis_client.lindex(QUEUE, 0))
    assert message["headers"]["task"] == "torchreview.base_pushed"  # listed and fanned out on a worker

    redis_client.delete(QUEUE)
    later = dict(push, created=False, before="a" * 40)  # complete file lists, README.md only: nothing to do
    body = json.dumps(later).encode()
    assert post(webhook, body, signed_headers(body, "push")).status_code == 204
    later["commits"][0]["modified"] = [".torchreview.toml"]
    body = json.dumps(later).encode()
    assert post(webhook, body, signed_headers(body, "push")).status_code == 202
    (job,) = queued(redis_client)
    assert job["config_paths"] == [".torchreview.toml"] and job["before"] == "a" * 40

    redis_client.delete(QUEUE)
    deleted = dict(later, deleted=True, after="0" * 40, commits=[], head_commit=None)
    body = json.dumps(deleted).encode()
    assert post(webhook, body, signed_headers(body, "push")).status_code == 204
    assert queued(redis_client) == []


def test_ping(webhook):
    body = json.dumps(payload("ping")).encode()
    assert post(webhook, body, signed_headers(body, "ping")).status_code == 200


def test_duplicate_delivery_enqueued_once(webhook, redis_client):
    body = json.dumps(payload("pull_request.synchronize")).encode()
    headers = signed_headers(body, "pull_request", delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert post(webhook, body, headers).status_code == 202
    assert post(webhook, body, headers).status_code == 200
    assert len(queued(redis_client)) == 1


def test_review_command_on_pull_request(webhook, redis_client):
    data = payload("derived/issue_comment.created.on_pull_request")
    data["comment"]["body"] = "/review"
    body = json.dumps(data).encode()
    assert post(webhook, body, signed_headers(body, "issue_comment")).status_code == 202
    (job,) = queued(redis_client)
    assert job["reason"] == "command" and job["command"] == "/review" and job["head_sha"] is None and job["pull_number"] == data["issue"]["number"]


def test_bot_comments_are_ignored(webhook, redis_client):
    data = payload("derived/issue_comment.created.on_pull_request")
    data["comment"]["body"] = "/review"
    data["comment"]["user"]["type"] = "Bot"
    data["comment"]["user"]["login"] = "torchreview[bot]"
    body = json.dumps(data).encode()
    assert post(webhook, body, signed_headers(body, "issue_comment")).status_code == 204
    assert queued(redis_client) == []


def test_drafts_are_enqueued_for_the_repository_policy_to_decide(webhook, redis_client):
    data = payload("pull_request.opened")
    data["pull_request"]["draft"] = True
    body = json.dumps(data).encode()
    assert post(webhook, body, signed_headers(body, "pull_request")).status_code == 202


def test_check_suite_without_pull_requests_is_skipped(webhook, redis_client):
    body = json.dumps(payload("check_suite.requested")).encode()  # fork-style: empty pull_requests
    assert post(webhook, body, signed_headers(body, "check_suite")).status_code == 204
    data = payload("check_run.rerequested")
    data["check_run"]["pull_requests"] = [{"number": 2, "id": 1, "url": "x", "head": {}, "base": {}}]
    body = json.dumps(data).encode()
    assert post(webhook, body, signed_headers(body, "check_run")).status_code == 202
    (job,) = queued(redis_client)
    assert job["head_sha"] == data["check_run"]["head_sha"]


def test_healthz_and_metrics(webhook):
    base = webhook.rsplit("/api/", 1)[0]
    assert requests.get(base + "/healthz", timeout=5).json() == {"status": "ok"}
    assert "torchreview_webhooks_total" in requests.get(base + "/metrics", timeout=5).text


def test_unauthenticated_callers_cannot_grow_the_metric_labels(webhook):
    import random
    import string

    from prometheus_client.parser import text_string_to_metric_families

    from bot.metrics import EVENT_LABELS

    rng = random.Random(7)
    for _ in range(200):
        event = "".join(rng.choices(string.ascii_letters + string.digits + "_-.{}\"", k=rng.randint(1, 40)))
        headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": str(rng.random()), "Content-Type": "application/json"}
        assert post(webhook, b"{}", headers).status_code == 401
    base = webhook.rsplit("/api/", 1)[0]
    text = requests.get(base + "/metrics", timeout=5).text
    samples = [s for family in text_string_to_metric_families(text) if family.name == "torchreview_webhooks"
               for s in family.samples if s.name == "torchreview_webhooks_total"]
    assert {s.labels["event"] for s in samples} <= set(EVENT_LABELS)
    assert sum(s.value for s in samples if s.labels == {"event": "other", "status": "401"}) >= 200


def test_a_replayed_body_under_a_new_delivery_id_is_enqueued_once(webhook, redis_client):
    body = json.dumps(payload("pull_request.opened")).encode()
    assert post(webhook, body, signed_headers(body, "pull_request")).status_code == 202
    replay = signed_headers(body, "pull_request")  # same signed bytes, a fresh X-GitHub-Delivery
    assert post(webhook, body, replay).status_code == 200
    assert len(queued(redis_client)) == 1
    other = json.dumps({**payload("pull_request.opened"), "number": 3}).encode()  # a different event still counts
    assert post(webhook, other, signed_headers(other, "pull_request")).status_code == 202
    assert len(queued(redis_client)) == 2


@pytest.mark.parametrize("secret", ["change-me", "CHANGEME", "please-change-me-before-deploying", "Your_Webhook_Secret",
                                    "short-secret", "aaaaaaaaaaaaaaaaaaaa"])
def test_weak_webhook_secrets_are_refused(tmp_path, secret):
    from bot.settings import SettingsError

    settings = Settings(app_id=None, private_key=None, webhook_secret=secret, redis_url=None, data_dir=tmp_path)
    with pytest.raises(SettingsError, match="GITHUB_WEBHOOK_SECRET"):
        create_app(settings, enqueue=lambda job: None, store=object())
    with pytest.raises(SettingsError, match="GITHUB_WEBHOOK_SECRET"):
        Settings.from_env({"GITHUB_APP_ID": "1", "GITHUB_WEBHOOK_SECRET": secret}, role="web")


def test_strong_secrets_and_workers_without_one_are_accepted():
    secret = "9f2c41d7e0b84a6c93b1f5d8a7e2c640"  # what `openssl rand -hex 16` prints
    assert Settings.from_env({"GITHUB_APP_ID": "1", "GITHUB_WEBHOOK_SECRET": secret}, role="web").webhook_secret == secret
    # the web ignores a private key it was given by mistake, and a worker needs no webhook secret
    assert Settings.from_env({"GITHUB_APP_ID": "1", "GITHUB_WEBHOOK_SECRET": secret,
                              "GITHUB_PRIVATE_KEY_PATH": "/nonexistent.pem"}, role="web").private_key is None
    from bot.settings import SettingsError

    with pytest.raises(SettingsError, match="GITHUB_PRIVATE_KEY"):
        Settings.from_env({"GITHUB_APP_ID": "1", "GITHUB_WEBHOOK_SECRET": "change-me"}, role="worker")


def test_a_delivery_being_enqueued_is_retried_not_dropped(webhook, redis_client):
    """A claim is only "pending" until the jobs are on the queue: a request that died in between (a killed
    gunicorn worker) leaves a claim that lapses, and a redelivery meanwhile is told to retry (503), never
    "already enqueued" (200, which GitHub would not redeliver)."""
    from bot.webhook import ENQUEUED, PENDING_TTL

    body = json.dumps(payload("pull_request.opened")).encode()
    headers = signed_headers(body, "pull_request")
    key = f"torchreview:delivery:{headers['X-GitHub-Delivery']}"
    redis_client.set(key, "1", ex=PENDING_TTL)  # claimed by a request that never enqueued
    assert post(webhook, body, headers).status_code == 503
    assert queued(redis_client) == []
    redis_client.delete(key)  # the pending claim lapsed
    assert post(webhook, body, headers).status_code == 202
    assert redis_client.get(key).decode() == ENQUEUED and 60 < redis_client.ttl(key)
    assert post(webhook, body, headers).status_code == 200  # now a duplicate
    assert len(queued(redis_client)) == 1


def test_redis_away_is_a_503_and_nothing_is_claimed(tmp_path):
    """Redis restarting (or gone): the webhook answers 503 so GitHub's redelivery tries again, not a 500."""
    from github_emulator.local import free_port

    settings = Settings(app_id=None, private_key=None, webhook_secret=WEBHOOK_SECRET,
                        redis_url=f"redis://127.0.0.1:{free_port()}/0", data_dir=tmp_path)
    client = create_app(settings).test_client()
    body = json.dumps(payload("pull_request.opened")).encode()
    response = client.post(settings.webhook_path, data=body, headers=signed_headers(body, "pull_request"))
    assert response.status_code == 503 and "retry" in response.get_json()["message"]
