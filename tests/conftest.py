"""Shared fixtures: a real redis-server on a free port, real webhook payloads, signing."""
from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TORCHREVIEW_GITHUB_SPEC_DIR", ROOT.parent / "shared" / "github"))
WEBHOOK_SECRET = "test-webhook-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A private redis-server for the session (never the machine's shared one)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed; scripts/test.sh installs it (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    deadline = time.time() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return client


def payload(name: str) -> dict:
    """A real GitHub webhook payload from shared/github/webhooks (``derived/`` ones are marked there)."""
    from bot.emulator.webhooks import real_payload

    return real_payload(name)


def signed_headers(body: bytes, event: str, delivery: str | None = None, secret: str = WEBHOOK_SECRET) -> dict:
    """Headers for exactly these bytes (tests also send bodies that are not valid JSON)."""
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    return headers
