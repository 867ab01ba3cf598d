"""Operating the App: `torchreview serve` under gunicorn (2 workers) and a Celery worker, as deployed.

Real processes throughout: the CLI starts gunicorn, deliveries go over HTTP, Redis is a private
redis-server, the worker reviews against the GitHub emulator, and the deploy manifests' own probe
commands are run.
"""
from __future__ import annotations

import json
import os
import random
import socket
import string
import subprocess
import sys
import uuid

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot.metrics import EVENT_LABELS
from github_emulator.local import ProcessGroup, free_port
from github_emulator.webhooks import issue_comment_payload, pull_request_payload
from tests.conftest import (ROOT, START_TIMEOUT_S, WEBHOOK_SECRET, Worker, answer, completed_run,
                            install_on_octo_org, payload, signed_headers, wait_for, worker_env)

DEPLOY = ROOT / "deploy"


def samples(text: str, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of one sample name in a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


@pytest.fixture
def web(redis_url, redis_client, tmp_path):
    """`torchreview serve` with REDIS_URL (web only), 2 gunicorn workers, and no private key at all."""
    port = free_port()
    metrics_dir = tmp_path / "metrics"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PROMETHEUS_"))}
    env.update({"REDIS_URL": redis_url, "GITHUB_APP_ID": "4242", "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
                # the web must never read the key: a path that does not exist proves it
                "GITHUB_PRIVATE_KEY_PATH": str(tmp_path / "no-such-key.pem"),
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "TORCHREVIEW_DATA_DIR": str(tmp_path / "data"),
                "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"})
    base = f"http://127.0.0.1:{port}"
    with ProcessGroup([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--web-workers", "2"], tmp_path / "serve.log", env=env, cwd=ROOT, grace=30) as serve:
        wait_for(lambda: answer(serve, base + "/healthz"), START_TIMEOUT_S, "gunicorn")
        yield {"base": base, "hook": base + "/api/github/webhooks", "metrics_dir": metrics_dir, "env": env}


def test_web_serves_without_the_private_key_and_every_scrape_agrees(web):
    """Each gunicorn worker counts what it answers; every /metrics must show the sum of all of them."""
    sent = 0
    seen_pids: set[str] = set()
    rng = random.Random(3)
    # GitHub's deliveries and strangers' posts, until both gunicorn workers have answered some.
    while len(seen_pids) < 2 and sent < 600:
        data = payload("pull_request.opened")
        data["number"] = sent  # a distinct event each time (same-body replays are deduplicated)
        body = json.dumps(data).encode()
        assert requests.post(web["hook"], data=body, headers=signed_headers(body, "pull_request"),
                             timeout=10).status_code == 202
        junk = "".join(rng.choices(string.ascii_letters, k=12))
        assert requests.post(web["hook"], data=b"{}", headers={"X-GitHub-Event": junk, "X-GitHub-Delivery": junk},
                             timeout=10).status_code == 401
        sent += 2
        seen_pids = {p.stem.rsplit("_", 1)[1] for p in web["metrics_dir"].glob("counter_*.db")}
    assert len(seen_pids) >= 2, "every delivery went to one gunicorn worker"

    scrapes = [requests.get(web["base"] + "/metrics", timeout=10).text for _ in range(12)]
    totals = [samples(text, "torchreview_webhooks_total") for text in scrapes]
    assert all(t == totals[0] for t in totals)
    assert sum(totals[0].values()) == sent
    assert totals[0][(("event", "pull_request"), ("status", "202"))] == sent / 2
    assert totals[0][(("event", "other"), ("status", "401"))] == sent / 2
    assert {dict(labels)["event"] for labels in totals[0]} <= set(EVENT_LABELS)
    counts = [samples(text, "torchreview_webhook_seconds_count")[()] for text in scrapes]
    assert counts == [sent] * len(counts)


def _slow_client(hook_url: str) -> socket.socket:
    """A client that has sent only part of its request line and headers, and then waits."""
    host, port = hook_url.split("//")[1].split("/")[0].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /api/github/webhooks HTTP/1.1\r\nHost: " + host.encode() + b"\r\nX-GitHub-Ev")
    return sock


def test_clients_that_send_slowly_do_not_block_other_deliveries(web):
    slow = [_slow_client(web["hook"]) for _ in range(2)]
    try:
        # With one request per worker process (gunicorn's sync workers) these would wait for the slow
        # clients and time out; with threads they are answered.
        for n in range(6):
            data = payload("pull_request.opened")
            data["number"] = 1000 + n
            body = json.dumps(data).encode()
            assert requests.post(web["hook"], data=body, headers=signed_headers(body, "pull_request"),
                                 timeout=20).status_code == 202
        # The slow clients finish their request and are answered too.
        body = json.dumps(payload("ping")).encode()
        headers = signed_headers(body, "ping")
        for sock in slow:
            rest = "ent: ping\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k != "X-GitHub-Event")
            sock.sendall(rest.encode() + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        for sock in slow:
            sock.close()


def test_serve_refuses_a_placeholder_webhook_secret(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update({"REDIS_URL": "redis://127.0.0.1:1/0", "GITHUB_APP_ID": "1", "GITHUB_WEBHOOK_SECRET": "change-me",
                "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "GITHUB_WEBHOOK_SECRET is a placeholder" in done.stderr and "openssl rand" in done.stderr
    assert "change-me" not in done.stderr  # secrets are never echoed


def _k8s(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def _container(name: str) -> dict:
    (deployment,) = [d for d in _k8s(name) if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_a_finished_review_shows_up_on_the_workers_metrics_port_and_its_probes_pass(
        web, emulator, app_key, redis_url, tmp_path):
    port = free_port()
    env = worker_env(emulator, app_key, redis_url, tmp_path)
    env.pop("GITHUB_WEBHOOK_SECRET")  # workers never verify deliveries
    env["TORCHREVIEW_WORKER_METRICS_PORT"] = str(port)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    worker = Worker(env, concurrency=1)
    try:
        state = emulator.state
        install_on_octo_org(state)
        repo = state.add_repo(f"octo-org/metrics-{uuid.uuid4().hex[:6]}", files={"README.md": "# m\n"})
        pr = state.open_pull_request(repo, {"train.py": 'import torch\n\nm = torch.symeig(a)\n'})
        body = json.dumps(pull_request_payload("opened", pr)).encode()
        assert requests.post(web["hook"], data=body, headers=signed_headers(body, "pull_request"),
                             timeout=10).status_code == 202
        completed_run(state, pr.head_sha)

        def reviewed():
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except requests.ConnectionError:
                return None
            done = samples(text, "torchreview_reviews_total").get((("outcome", "done"),))
            return text if done else None

        text = wait_for(reviewed, 60, "the review on the worker's /metrics")
        assert samples(text, "torchreview_reviews_total")[(("outcome", "done"),)] == 1
        assert samples(text, "torchreview_review_seconds_count")[()] == 1

        # The Deployment's probes, as written in worker.yaml, against this worker.
        container = _container("worker.yaml")
        probe_env = {**env, "HOSTNAME": socket.gethostname(),
                     "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")}
        command = container["readinessProbe"]["exec"]["command"]
        done = subprocess.run(command, env=probe_env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        quick = [part.replace("--timeout 10", "--timeout 1") for part in command]  # no reply is awaited in full
        elsewhere = subprocess.run(quick, env={**probe_env, "HOSTNAME": "no-such-worker"}, cwd=tmp_path,
                                   capture_output=True, text=True, timeout=60)
        assert elsewhere.returncode != 0  # the probe does fail for a worker that does not answer
        liveness = container["livenessProbe"]["httpGet"]
        assert requests.get(f"http://127.0.0.1:{port}{liveness['path']}", timeout=5).ok
    finally:
        worker.stop()


def test_deployments_give_the_private_key_to_workers_only_and_probe_them():
    web_pod = _container("web.yaml")
    web_spec = [d for d in _k8s("web.yaml") if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]
    assert not [v for v in web_spec.get("volumes", []) if "secret" in v]
    assert all("KEY" not in e["name"] for e in web_pod.get("env", []))
    config = _k8s("configmap.yaml")[0]["data"]
    assert not [k for k in config if "KEY" in k]  # envFrom reaches the web pods too
    for name in ("worker.yaml", "gpu-worker.yaml"):
        pod = _container(name)
        env = {e["name"] for e in pod["env"]}
        assert "GITHUB_PRIVATE_KEY_PATH" in env and "GITHUB_WEBHOOK_SECRET" not in env
        assert "inspect ping" in " ".join(pod["readinessProbe"]["exec"]["command"])
        assert pod["livenessProbe"]["httpGet"]["port"] == "metrics"
        assert {"name": "metrics", "containerPort": int(config["TORCHREVIEW_WORKER_METRICS_PORT"])} in pod["ports"]

    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "secrets" not in services["web"]
    assert all("KEY" not in k for k in services["web"].get("environment", {}))
    for name, secrets in (("worker", ["github-app-key"]), ("gpu-worker", ["github-app-key", "executor-token"])):
        assert services[name]["secrets"] == secrets
        assert "inspect ping" in " ".join(services[name]["healthcheck"]["test"])
    assert "GITHUB_PRIVATE_KEY=" not in (DEPLOY / ".env.example").read_text()


def test_the_manifest_asks_for_no_permission_the_docs_do_not_explain():
    manifest = yaml.safe_load((ROOT / "app.yml").read_text())
    page = (ROOT / "docs" / "app.md").read_text()
    section = page.split("## Why each permission", 1)[1].split("\n## ", 1)[0]
    for permission, level in manifest["default_permissions"].items():
        assert f"`{permission}: {level}`" in section, permission
    for event in manifest["default_events"]:
        assert f"`{event}`" in section, event


def test_the_app_works_with_exactly_the_manifests_permissions(web, emulator, app_key, redis_url, tmp_path):
    """Review, 👀 reaction, command reply, thread resolution: all within app.yml's permissions."""
    permissions = yaml.safe_load((ROOT / "app.yml").read_text())["default_permissions"]
    state = emulator.state
    account = f"least-{uuid.uuid4().hex[:6]}"
    installation = state.add_installation(account, permissions=permissions)
    repo = state.add_repo(f"{account}/models", files={"README.md": "# m\n"})
    state.add_collaborator(repo, "maintainer", role="write")
    env = worker_env(emulator, app_key, redis_url, tmp_path)
    worker = Worker(env, concurrency=1)
    try:
        pr = state.open_pull_request(repo, {"train.py": 'import torch\n\nm = torch.symeig(a)\n'})
        body = json.dumps(pull_request_payload("opened", pr, installation_id=installation.id)).encode()
        assert requests.post(web["hook"], data=body, headers=signed_headers(body, "pull_request"),
                             timeout=10).status_code == 202
        assert completed_run(state, pr.head_sha).conclusion == "failure"
        assert state.review_comments_for(pr)

        data = issue_comment_payload(state, pr, "/review help", user="maintainer",
                                     installation_id=installation.id)
        comment = state.issue_comments[data["comment"]["id"]]
        body = json.dumps(data).encode()
        assert requests.post(web["hook"], data=body, headers=signed_headers(body, "issue_comment"),
                             timeout=10).status_code == 202
        wait_for(lambda: [c for c in state.issue_comments_for(pr) if "/review smoke" in c.body], 60, "the reply")
        wait_for(lambda: [r.content for r in comment.reactions] == ["eyes"], 30, "the 👀 reaction")

        # The fix resolves the bot's thread (GraphQL, pull_requests: write).
        head = state.push(pr, {"train.py": 'import torch\n\nm = torch.linalg.eigh(a)\n'})
        body = json.dumps(pull_request_payload("synchronize", pr, installation_id=installation.id)).encode()
        assert requests.post(web["hook"], data=body, headers=signed_headers(body, "pull_request"),
                             timeout=10).status_code == 202
        assert completed_run(state, head).conclusion == "success"
        wait_for(lambda: all(t.is_resolved for t in state.threads_for(pr)), 30, "the fixed finding's thread resolved")
        refused = [(r.method, r.path) for r in state.requests_matching(path=f"/repos/{account}/*") if r.status == 403]
        assert refused == []
    finally:
        worker.stop()


def test_embedded_serve_shows_its_workers_reviews_on_the_web_metrics(emulator, app_key, tmp_path):
    """One machine, no Redis: gunicorn and the embedded Celery workers share one metrics directory."""
    state = emulator.state
    install_on_octo_org(state)
    repo = state.add_repo(f"octo-org/embedded-{uuid.uuid4().hex[:6]}", files={"README.md": "# m\n"})
    pr = state.open_pull_request(repo, {"train.py": 'import torch\n\nm = torch.symeig(a)\n'})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PROMETHEUS_", "REDIS_"))}
    env.update({"GITHUB_APP_ID": "4242", "GITHUB_PRIVATE_KEY": app_key[0], "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
                "GITHUB_API_URL": emulator.url, "TORCHREVIEW_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
                "TORCHREVIEW_GITHUB_WRITE_INTERVAL": "0", "LOG_LEVEL": "WARNING"})
    base = f"http://127.0.0.1:{port}"
    with ProcessGroup([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--concurrency", "1"], tmp_path / "serve.log", env=env, cwd=ROOT, grace=30) as serve:
        wait_for(lambda: answer(serve, base + "/metrics"), START_TIMEOUT_S, "the embedded serve")
        body = json.dumps(pull_request_payload("opened", pr)).encode()
        assert requests.post(base + "/api/github/webhooks", data=body, headers=signed_headers(body, "pull_request"),
                             timeout=10).status_code == 202
        completed_run(state, pr.head_sha)

        def reviewed():
            scrape = answer(serve, base + "/metrics")
            return scrape.text if scrape and samples(scrape.text, "torchreview_reviews_total") else None

        text = wait_for(reviewed, 60, "the review on the web's /metrics")
        assert samples(text, "torchreview_reviews_total") == {(("outcome", "done"),): 1}
        assert samples(text, "torchreview_webhooks_total") == {(("event", "pull_request"), ("status", "202")): 1}
