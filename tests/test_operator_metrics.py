"""An operator's metrics: queue depth, job retries by reason, GitHub's responses and rate limit, and the
example alert rules (deploy/prometheus/) naming only metrics the App exports.

Real parts: a private redis-server and the embedded SQLite broker with real Celery messages, PyGithub
against the emulator, and a `torchreview worker` process whose /metrics port is scraped.
"""
from __future__ import annotations

import json
import logging
import re
import uuid

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot import metrics
from bot.jobs import GPU_QUEUE, REVIEW_QUEUE, ReviewJob, send
from bot.settings import Settings
from github_emulator.local import free_port
from github_emulator.webhooks import pull_request_payload
from tests.conftest import ROOT, Worker, completed_run, deliver, new_repo, wait_for, worker_env

ALERTS = ROOT / "deploy" / "prometheus" / "torchreview-alerts.yml"
QUEUES = (REVIEW_QUEUE, GPU_QUEUE)


def samples(text: str, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of one sample name in a Prometheus text exposition."""
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


def _job(n: int) -> ReviewJob:
    return ReviewJob(installation_id=1, repository="octo-org/queued", pull_number=n, head_sha="a" * 40,
                     reason="pull_request.opened", delivery=str(uuid.uuid4()))


# ---- the alert rules ---------------------------------------------------------------------------------


def exported_names(tmp_path) -> set[str]:
    """Every sample name the App can export: its metrics (all types' suffixes) and the scrape-time collectors."""
    from bot.recover import LAST_SUCCESS_KEY, SweepMetrics
    from bot.store import make_store

    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created")}
    names = set()
    for value in vars(metrics).values():
        if hasattr(value, "_type") and hasattr(value, "_name"):  # a prometheus_client metric of bot.metrics
            names |= {value._name + suffix for suffix in suffixes[value._type]}
    store = make_store(None, tmp_path)
    store.put(LAST_SUCCESS_KEY, "1", 60)
    for collector in (metrics.QueueDepth(f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}", QUEUES), SweepMetrics(store)):
        for family in collector.collect():
            names |= {s.name for s in family.samples} | {family.name}
    return names


PROMQL_WORDS = {"by", "on", "and", "or", "unless", "without", "ignoring", "group_left", "group_right", "bool",
                "offset"}


def test_the_alert_rules_parse_and_every_expression_names_exported_metrics(tmp_path):
    rules = yaml.safe_load(ALERTS.read_text())
    exported = exported_names(tmp_path)
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    names = {rule["alert"] for rule in alerts}
    # what the issue asks an operator to see coming
    assert {"TorchreviewQueueBackingUp", "TorchreviewRetriesClimbing", "TorchreviewGitHubServerErrors",
            "TorchreviewGitHubForbidden", "TorchreviewRateLimitLow", "TorchreviewNoReviewsCompleting"} <= names
    for rule in alerts:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), rule["alert"]
        bare = re.sub(r'"[^"]*"', '""', expr)  # label values are not names
        bare = re.sub(r"\{[^}]*\}", "", bare)  # nor are label matchers
        bare = re.sub(r"\b(?:by|on|without|ignoring)\s*\([^)]*\)", "", bare)  # nor grouping labels
        bare = re.sub(r"\[[^\]]*\]", "", bare)  # nor range durations
        identifiers = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", bare)
        metric_names = {name for name, call in identifiers if not call and name not in PROMQL_WORDS}
        assert metric_names, f"{rule['alert']} names no metric"
        assert metric_names <= exported, f"{rule['alert']}: {sorted(metric_names - exported)} not exported"


# ---- queue depth -------------------------------------------------------------------------------------


def test_queue_depth_counts_the_jobs_waiting_on_redis(redis_url, redis_client):
    settings = Settings(app_id=None, private_key=None, webhook_secret=None, redis_url=redis_url)
    collector = metrics.QueueDepth(settings.broker_url, QUEUES)
    assert metrics.queue_depths(settings.broker_url, QUEUES) == {REVIEW_QUEUE: 0, GPU_QUEUE: 0}
    for n in range(3):
        send(_job(n), settings)
    text = metrics.render(collector)[0].decode()
    assert samples(text, "torchreview_queue_depth") == {(("queue", "reviews"),): 3, (("queue", "gpu"),): 0}
    assert samples(text, "torchreview_queue_depth_up") == {(): 1}
    redis_client.flushdb()  # no worker is to take these


def test_queue_depth_reads_the_embedded_broker_without_creating_its_queues(tmp_path):
    settings = Settings(app_id=None, private_key=None, webhook_secret=None, data_dir=tmp_path)
    assert metrics.queue_depths(settings.broker_url, QUEUES) == {REVIEW_QUEUE: 0, GPU_QUEUE: 0}
    assert not (tmp_path / "broker.sqlite").exists()  # reading never makes the broker's file
    for n in range(2):
        send(_job(n), settings)
    assert metrics.queue_depths(settings.broker_url, QUEUES) == {REVIEW_QUEUE: 2, GPU_QUEUE: 0}
    import sqlite3

    with sqlite3.connect(tmp_path / "broker.sqlite") as db:  # the gpu queue's row is the worker's to create
        assert [row[0] for row in db.execute("SELECT name FROM kombu_queue")] == [REVIEW_QUEUE]


def test_a_broker_that_does_not_answer_is_reported_not_raised():
    collector = metrics.QueueDepth(f"redis://127.0.0.1:{free_port()}/0", QUEUES)
    text = metrics.render(collector)[0].decode()
    assert samples(text, "torchreview_queue_depth_up") == {(): 0}
    assert samples(text, "torchreview_queue_depth") == {}


# ---- GitHub's responses, at PyGithub's requester -----------------------------------------------------


def test_every_github_response_is_counted_by_status_with_the_rate_limit(emulator, app_key, caplog):
    from bot.github_client import GitHubClients

    state = emulator.state
    _repo, name = new_repo(state, {})
    clients = GitHubClients(Settings(app_id=4242, private_key=app_key[0], webhook_secret=None, api_url=emulator.url))
    before = {status: metrics.GITHUB_RESPONSES.labels(status=status)._value.get() for status in ("200", "404", "502")}
    gh = clients.for_installation(1)
    with caplog.at_level(logging.DEBUG, logger="github.Requester"):
        gh.get_repo(name)  # a token (201, the App's JWT), then 200
    assert any("==> 200" in r.getMessage() for r in caplog.records)  # PyGithub's own debug log still works
    with pytest.raises(Exception):
        gh.get_repo(name.replace("models", "missing"))
    state.faults.fail("GET", f"/repos/{name}", status=502, times=4)  # the in-place retries see each one
    with pytest.raises(Exception):
        gh.get_repo(name)
    gh.get_repo(name)  # the rate-limit headers of the last response are the ones kept
    after = {status: metrics.GITHUB_RESPONSES.labels(status=status)._value.get() for status in before}
    assert after["200"] - before["200"] == 2 and after["404"] - before["404"] == 1
    assert after["502"] - before["502"] == 4  # every response, the ones retried in place included
    bucket = state.rate_limit_bucket("installation:1")
    assert metrics.GITHUB_RATE_LIMIT_REMAINING.labels(resource="core")._value.get() == bucket.remaining
    assert metrics.GITHUB_RATE_LIMIT_RESET.labels(resource="core")._value.get() == bucket.reset


def test_a_retried_job_is_counted_by_reason_on_the_workers_metrics(emulator, app_key, redis_url, redis_client,
                                                                   tmp_path):
    """GitHub answers the check run's creation 502 twice: the job is re-queued twice (github_5xx), then done."""
    import threading

    from werkzeug.serving import make_server

    from bot.webhook import create_app

    port = free_port()
    env = {**worker_env(emulator, app_key, redis_url, tmp_path), "TORCHREVIEW_WORKER_METRICS_PORT": str(port)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    settings = Settings(app_id=4242, private_key=None, webhook_secret="test-webhook-secret", redis_url=redis_url,
                        data_dir=tmp_path, api_url=emulator.url)
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    worker = Worker(env, concurrency=1)
    try:
        state = emulator.state
        repo, name = new_repo(state, {})
        pr = state.open_pull_request(repo, {"train.py": 'import torch\n\nm = torch.symeig(a)\n'})
        state.faults.fail("POST", f"/repos/{name}/check-runs", status=502, times=2)
        stack = {"url": f"http://127.0.0.1:{server.server_port}{settings.webhook_path}"}
        assert deliver(stack, "pull_request", pull_request_payload("opened", pr)).status_code == 202
        completed_run(state, pr.head_sha, timeout=120)

        def scraped():
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            except requests.RequestException:
                return None  # not listening yet, or too slow to answer on a loaded machine: ask again
            return text if samples(text, "torchreview_reviews_total") else None

        text = wait_for(scraped, 60, "the review on the worker's /metrics")
        assert samples(text, "torchreview_job_retries_total") == {(("kind", "review"), ("reason", "github_5xx")): 2}
        statuses = samples(text, "torchreview_github_responses_total")
        assert statuses[(("status", "502"),)] == 2 and statuses[(("status", "201"),)] >= 2
        assert 0 < samples(text, "torchreview_github_rate_limit_remaining")[(("resource", "core"),)] <= 5000
    finally:
        worker.stop()
        server.shutdown()
