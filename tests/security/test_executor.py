"""The executor service: code in, result out, over real HTTP, with the real sandbox behind it; only for callers
holding the shared token, and no silent or slow client blocks it (issue 23, item 13)."""
from __future__ import annotations

import io
import json
import select
import socket
import tarfile
import threading
import time
from pathlib import Path

import pytest
import requests

from gpu_runner import executor
from gpu_runner.runner import TargetRequest
from gpu_runner.sandbox import SandboxLimits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"
TOKEN = "executor-test-token-0123456789abcdef0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def service(monkeypatch):
    monkeypatch.setenv(executor.TOKEN_VARIABLE, TOKEN)  # the worker's side reads it from its environment
    monkeypatch.setattr(executor._Handler, "timeout", 2.0)  # READ_TIMEOUT_S, short for the tests
    monkeypatch.setattr(executor, "BODY_DEADLINE_S", 3.0)
    server = executor.make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def raw_request(url: str, head: bytes, timeout: float = 10) -> socket.socket:
    host, port = url.rsplit("/", 1)[-1].split(":")
    connection = socket.create_connection((host, int(port)), timeout=timeout)
    connection.sendall(head)
    return connection


def status_of(connection: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]) if data else 0


def test_a_job_round_trip_through_the_service(service, monkeypatch, tmp_path):
    assert requests.get(service + "/healthz", timeout=30).json() == {"sandbox": "ok"}
    head = tmp_path / "head"
    head.mkdir()
    (head / "mlp.py").write_text((FIXTURES / "mlp.py").read_text())
    monkeypatch.setenv(executor.EXECUTOR_URL_VARIABLE, service)
    # The worker's secret in its environment: never sent, and redacted should a report quote it.
    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", "executor-test-secret-0123456789")
    # a static finding to decide travels with its target (here about an attribute the model does not have)
    claim = {"rule": "TR302", "path": "mlp.py", "line": 5, "end_line": 5, "class": "MLP", "attribute": "blocks"}
    run = executor.run_smoke(head, [TargetRequest("mlp.py:MLP", 3, findings=[claim])], base_dir=None, device="cpu",
                             limits=SandboxLimits(timeout_s=120), steps=3)
    assert run["refused"] is None and run["warnings"] == []
    (target,) = run["targets"]
    assert target["target"] == "mlp.py:MLP" and target["line"] == 3
    assert target["status"] in ("passed", "failed") and target["head"]["checks"], target
    assert [(f["rule"], f["verdict"]) for f in target["head"]["findings"]] == [("TR302", "undecided")]
    assert "`self.blocks`" in target["head"]["findings"][0]["evidence"]


def test_malformed_and_escaping_archives_are_refused(service, tmp_path):
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w:gz") as archive:
        job = json.dumps({"targets": [{"target": "x.py:X"}]}).encode()
        for name, data in (("job.json", job), ("head/x.py", b"pass\n"), ("../escaped.py", b"pwned\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    answer = requests.post(service + "/v1/smoke", data=body.getvalue(), timeout=30, headers=AUTH)
    assert answer.status_code == 400 and "escaped.py" in answer.json()["error"]
    answer = requests.post(service + "/v1/smoke", data=b"not a tarball", timeout=30, headers=AUTH)
    assert answer.status_code == 400
    assert requests.get(service + "/v1/other", timeout=30).status_code == 404


def test_limits_a_repository_asks_for_are_capped(monkeypatch):
    monkeypatch.setenv("TORCHREVIEW_EXECUTOR_MAX_MEMORY", str(1 << 30))
    limits = executor._limits({"timeout_s": 10 ** 6, "memory_bytes": 1 << 40})
    assert limits.timeout_s == executor.MAX_TIMEOUT_S and limits.memory_bytes == 1 << 30


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789abcdef0123456789", f"Bearer {TOKEN}x",
                                           TOKEN, f"bearer {TOKEN}"])
def test_a_job_without_the_token_is_refused_before_its_body_is_read(service, authorization):
    # 400 MB announced, none sent: an answer at once means the body was never waited for
    head = (b"POST /v1/smoke HTTP/1.1\r\nHost: x\r\nContent-Length: 400000000\r\n" +
            (f"Authorization: {authorization}\r\n".encode() if authorization else b"") + b"\r\n")
    started = time.monotonic()
    with raw_request(service, head) as connection:
        assert status_of(connection) == 401
    assert time.monotonic() - started < 2


def test_silent_and_slow_clients_neither_block_the_service_nor_hold_it(service):
    silent = [raw_request(service, b"") for _ in range(8)]  # half-open: connected, never a byte
    trickle = raw_request(service, b"POST /v1/smoke HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                                   + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode() + b"x")
    try:
        # served meanwhile (one thread for all would wait on the silent ones forever)
        assert requests.get(service + "/healthz", timeout=30).status_code in (200, 503)
        for _ in range(10):  # the body never arrives whole: 408 by BODY_DEADLINE_S, each read within the timeout
            if select.select([trickle], [], [], 1)[0]:  # answered: stop sending (into a closed connection)
                break
            trickle.sendall(b"x")
        assert status_of(trickle) == 408
        for connection in silent:  # dropped after READ_TIMEOUT_S of silence
            connection.settimeout(10)
            assert connection.recv(100) == b""
    finally:
        for connection in silent + [trickle]:
            connection.close()


def test_no_executor_or_worker_without_a_long_enough_token(monkeypatch, tmp_path):
    monkeypatch.delenv(executor.TOKEN_VARIABLE, raising=False)
    monkeypatch.delenv(executor.TOKEN_FILE_VARIABLE, raising=False)
    with pytest.raises(executor.TokenMissing, match="TORCHREVIEW_EXECUTOR_TOKEN.*not set"):
        executor.make_server("127.0.0.1", 0)
    with pytest.raises(SystemExit) as exited:
        executor.main(["--host", "127.0.0.1", "--port", "0"])
    assert exited.value.code == 2
    monkeypatch.setenv(executor.TOKEN_VARIABLE, "short")
    with pytest.raises(executor.TokenMissing, match="too short"):
        executor.executor_token()
    monkeypatch.delenv(executor.TOKEN_VARIABLE)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # as `openssl rand -hex 32 > executor-token` writes it
    monkeypatch.setenv(executor.TOKEN_FILE_VARIABLE, str(token_file))
    assert executor.executor_token() == TOKEN
