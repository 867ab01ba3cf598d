"""The web's memory and availability under unauthenticated abuse (issue 23, items 9 and 10), on loopback:

* N concurrent 25 MB bodies with a bad signature (refused from their Content-Length, never read);
* N concurrent bodies of the largest size taken (5 MiB) with a well-formed but wrong signature (read in
  chunks, then refused);
* N slow clients sending a byte a second while a genuine delivery is timed.

Prints the gunicorn workers' total RSS (idle and peak) for each, and the genuine delivery's latency.

    python bench/webhook_abuse.py [--clients 16] [--workers 2]
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.cli import web_command  # noqa: E402
from bot.settings import MAX_WEBHOOK_BYTES  # noqa: E402
from github_emulator.local import free_port, wait_until  # noqa: E402

SECRET = "bench-webhook-abuse-secret-0123456789"
PATH = "/api/github/webhooks"


def workers_rss_mib(master: int) -> float:
    total = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == master:
                status = Path(f"/proc/{entry}/status").read_text()
                total += int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return total / 1024


def head(length: int, signature: str) -> bytes:
    return (f"POST {PATH} HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: {uuid.uuid4()}\r\n"
            f"X-Hub-Signature-256: {signature}\r\nContent-Length: {length}\r\n\r\n").encode()


def send_body(port: int, size: int, signature: str) -> str:
    body = b" " * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(head(size, signature))
        try:
            for offset in range(0, size, len(body)):
                connection.sendall(body[:min(len(body), size - offset)])
                time.sleep(0.02)
        except OSError:
            pass  # refused and closed while we were still sending
        try:
            return connection.recv(100).split(b"\r\n", 1)[0].decode()
        except OSError as exc:
            return type(exc).__name__


def peak_during(master: int, threads: list[threading.Thread]) -> float:
    peak = 0.0
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, workers_rss_mib(master))
        time.sleep(0.05)
    return peak


def genuine(port: int) -> tuple[float, str]:
    body = json.dumps({"zen": "x", "hook_id": 1}).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head(len(body), signature) + body)
        try:
            line = connection.recv(100).split(b"\r\n", 1)[0].decode()
        except socket.timeout:
            line = "TIMEOUT"
    return round(time.monotonic() - started, 2), line


def ready(port: int) -> bool:
    try:
        return genuine(port)[1].startswith("HTTP/1.1 200")
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="torchreview-bench-abuse-"))
    redis_port, port = free_port(), free_port()
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--save", "",
                              "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    env = {**os.environ, "GITHUB_APP_ID": "7", "GITHUB_WEBHOOK_SECRET": SECRET, "PYTHONPATH": str(ROOT),
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "TORCHREVIEW_DATA_DIR": str(workdir)}
    web = subprocess.Popen(web_command("127.0.0.1", port, args.workers), env=env, cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: ready(port), 60, "gunicorn")
        time.sleep(1)
        idle = workers_rss_mib(web.pid)
        print(f"gunicorn, {args.workers} workers: idle RSS {idle:.0f} MiB")
        wrong = "sha256=" + "0" * 64
        for label, size, signature in (("25 MB bodies, bad signature", 25_000_000, "sha256=00"),
                                       (f"{MAX_WEBHOOK_BYTES >> 20} MiB bodies, wrong signature", MAX_WEBHOOK_BYTES, wrong)):
            answers: list[str] = []
            threads = [threading.Thread(target=lambda: answers.append(send_body(port, size, signature)))
                       for _ in range(args.clients)]
            peak = peak_during(web.pid, threads)
            print(f"{args.clients} concurrent {label}: peak RSS {peak:.0f} MiB (+{peak - idle:.0f}); "
                  f"answers {sorted(set(answers))}")
        slow = []
        for _ in range(args.clients):
            connection = socket.create_connection(("127.0.0.1", port), timeout=30)
            connection.sendall(head(100_000, wrong) + b"{")
            slow.append(connection)
        timings = []
        for _ in range(3):
            for connection in slow:
                try:
                    connection.send(b" ")
                except OSError:
                    pass
            timings.append(genuine(port))
            time.sleep(1)
        print(f"with {args.clients} slow clients (a byte a second), genuine deliveries: {timings}")
        for connection in slow:
            connection.close()
    finally:
        os.killpg(web.pid, 15)
        web.wait(timeout=30)
        redis.terminate()
        redis.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
