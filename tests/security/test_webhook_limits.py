"""The webhook as `torchreview serve` runs it (gunicorn, bot.cli.web_command) against slow and large requests
from anyone on the network (issue 23, items 9 and 10), over real HTTP on loopback:

* clients that send their headers or their body a byte at a time hold a thread for the read deadline at most,
  and a genuine delivery gets through meanwhile (16 of them held every thread of the default server forever);
* a body over the limit (by its Content-Length) or without a well-formed signature is refused before it is read,
  so 16 concurrent 25 MB bodies with a bad signature no longer sit in the workers' memory;
* a body whose well-formed signature does not match is read in chunks to the limit, never past it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from bot.cli import WEB_THREADS, web_command
from bot.settings import MAX_WEBHOOK_BYTES
from github_emulator.local import ProcessGroup, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
SECRET = "webhook-limits-secret-0123456789"
READ_DEADLINE_S = 3
WORKERS = 1  # one worker's threads, so that the slow clients surely hold all of them
PATH = "/api/github/webhooks"


@pytest.fixture(scope="module")
def web(redis_url, tmp_path_factory):
    port = free_port()
    workdir = tmp_path_factory.mktemp("web")
    env = {**os.environ, "GITHUB_APP_ID": "4242", "GITHUB_WEBHOOK_SECRET": SECRET, "REDIS_URL": redis_url,
           "TORCHREVIEW_DATA_DIR": str(workdir), "PYTHONPATH": str(ROOT),
           "TORCHREVIEW_WEB_READ_DEADLINE_S": str(READ_DEADLINE_S)}
    server = ProcessGroup(web_command("127.0.0.1", port, WORKERS), workdir / "web.log", env=env, cwd=ROOT, grace=20)
    try:
        wait_until(lambda: _healthy(port), 60, "gunicorn")
        yield port
    finally:
        server.stop()


def _healthy(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def head(length: int, signature: str, extra: str = "") -> bytes:
    return (f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-GitHub-Event: ping\r\n"
            f"X-GitHub-Delivery: {uuid.uuid4()}\r\nX-Hub-Signature-256: {signature}\r\nContent-Length: {length}\r\n"
            f"{extra}\r\n").encode()


def status_line(connection: socket.socket) -> str:
    """The answer's status line, "" when the server closed without one, "TIMEOUT" when it kept silent."""
    data = b""
    while b"\r\n" not in data:
        try:
            chunk = connection.recv(4096)
        except socket.timeout:
            return "TIMEOUT"
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0].decode(errors="replace")


def genuine_delivery(port: int) -> tuple[float, str]:
    body = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=15) as connection:
        connection.sendall(head(len(body), signature, "Connection: close\r\n") + body)
        return time.monotonic() - started, status_line(connection)


def test_slow_clients_hold_no_thread_past_the_deadline_and_a_delivery_gets_through(web):
    wrong = "sha256=" + "0" * 64  # well formed: the body must be read to know it is wrong
    slow = []
    for n in range(WEB_THREADS * WORKERS + 4):  # more slow clients than threads
        connection = socket.create_connection(("127.0.0.1", web), timeout=30)
        if n % 3 == 0:  # the headers, a byte at a time
            connection.sendall(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        elif n % 3 == 1:  # the headers, then the body a byte at a time
            connection.sendall(head(100_000, wrong) + b"{")
        else:  # the red team's: a signature that cannot be one, then the body a byte at a time
            connection.sendall(head(100_000, "sha256=00") + b"{")
        slow.append(connection)
    stop = threading.Event()

    def trickle():
        for _ in range(30):  # bounded: 30 s at most
            for connection in slow:
                try:
                    connection.send(b"a")
                except OSError:
                    pass
            if stop.wait(1):
                return

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(1)  # every slow client is sending
        seconds, status = genuine_delivery(web)
        assert status == "HTTP/1.1 200 OK", status
        assert seconds < 2 * READ_DEADLINE_S + 3, seconds  # it waited for the first slow clients to be cut
        for connection in slow:  # each was answered (401) or cut off at its deadline, none still held
            connection.settimeout(READ_DEADLINE_S + 10)
            assert status_line(connection) in ("", "HTTP/1.1 401 UNAUTHORIZED", "HTTP/1.1 400 BAD REQUEST")
    finally:
        stop.set()
        trickler.join(timeout=5)
        for connection in slow:
            connection.close()


@pytest.mark.parametrize("length, signature, status", [
    (25_000_000, "sha256=" + "0" * 64, "413"),  # over the limit by its Content-Length
    (MAX_WEBHOOK_BYTES + 1, "sha256=" + "0" * 64, "413"),
    (1_000_000, "sha256=00", "401"),  # no well-formed signature
    (1_000_000, "", "401"),
    (1_000_000, "sha1=" + "0" * 40, "401"),
])
def test_a_body_too_large_or_unsigned_is_refused_before_it_is_read(web, length, signature, status):
    with socket.create_connection(("127.0.0.1", web), timeout=30) as connection:
        connection.sendall(head(length, signature))  # and not a byte of the body
        connection.settimeout(READ_DEADLINE_S - 1)  # an answer before the deadline: nothing was waited for
        assert status_line(connection).split(" ")[1:2] == [status]


def test_a_wrong_signature_is_checked_over_the_body_and_a_chunked_body_stops_at_the_limit(web):
    url = f"http://127.0.0.1:{web}{PATH}"
    headers = {"X-GitHub-Event": "ping", "X-GitHub-Delivery": str(uuid.uuid4()),
               "X-Hub-Signature-256": "sha256=" + "0" * 64}
    for size in (1 << 20, MAX_WEBHOOK_BYTES):  # the largest body taken is read whole, then refused
        body = b"{" + b" " * (size - 2) + b"}"
        assert requests.post(url, data=body, headers=headers, timeout=30).status_code == 401

    def chunks():  # no Content-Length: the limit applies while reading
        for _ in range(MAX_WEBHOOK_BYTES // (1 << 20) + 2):
            yield b" " * (1 << 20)

    try:
        answer = requests.post(url, data=chunks(), headers=headers, timeout=30)
    except requests.ConnectionError:  # the server may close while the rest is still being sent
        return
    assert answer.status_code == 413
