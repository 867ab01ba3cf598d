"""The App's latency, on real parts: gunicorn + Flask, a private redis-server, a Celery worker, the emulator.

Prints:
1. the webhook's response time (p50 / p90 / p99 / max) over N signed ``pull_request.synchronize``
   deliveries (default 1,000), each a new delivery id, measured at the client on a keep-alive
   connection — what GitHub waits for; for scale, the same for ``GET /healthz`` (the floor of the stack);
2. the time from delivery to the posted review and completed check run for a 20-file pull request
   (median of a few runs), with the worker's GitHub write pacing off and on.

    python bench/webhook.py [--deliveries 1000] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SECRET = "bench-webhook-secret"


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return f"p50 {pick(0.5):.2f} ms · p90 {pick(0.9):.2f} ms · p99 {pick(0.99):.2f} ms · max {ordered[-1] * 1000:.2f} ms"


def healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from bot.cli import web_command, worker_command
    from github_emulator import EmulatorState, generate_app_key, serve
    from functools import partial

    from github_emulator.local import free_port, wait_until

    wait = partial(wait_until, interval=0.05)  # latency is measured: poll often
    from github_emulator.webhooks import pull_request_payload, signed_delivery

    workdir = Path(tempfile.mkdtemp(prefix="torchreview-bench-"))
    redis_port = free_port()
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--save", "",
                              "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    private, public = generate_app_key()
    state = EmulatorState(app_public_key_pem=public, app_id=7)
    emulator = serve(state)
    state.add_installation("bench-org", installation_id=1)
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "GITHUB_APP_ID": "7",
           "GITHUB_PRIVATE_KEY": private, "GITHUB_WEBHOOK_SECRET": SECRET, "GITHUB_API_URL": emulator.url,
           "TORCHREVIEW_DATA_DIR": str(workdir), "PYTHONPATH": str(ROOT)}
    port = free_port()
    web = subprocess.Popen(web_command("127.0.0.1", port, 2), env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    children = [web, redis]
    try:
        base = f"http://127.0.0.1:{port}"
        wait(lambda: healthy(base + "/healthz"), 30, "gunicorn")
        repo = state.add_repo("bench-org/models", files={"README.md": "# bench\n"})
        example = (ROOT / "examples" / "buggy_train.py").read_text()
        pr = state.open_pull_request(repo, {"train.py": example})
        data = pull_request_payload("synchronize", pr)

        session = requests.Session()
        floor = []
        for _ in range(200):
            started = time.perf_counter()
            session.get(base + "/healthz", timeout=10)
            floor.append(time.perf_counter() - started)
        times, statuses = [], {}
        for n in range(args.deliveries):
            # a distinct body each time: the webhook enqueues a replayed body only once
            body, headers = signed_delivery("pull_request", {**data, "bench_delivery": n}, SECRET)
            started = time.perf_counter()
            response = session.post(base + "/api/github/webhooks", data=body, headers=headers, timeout=10)
            times.append(time.perf_counter() - started)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        print(f"webhook, {args.deliveries} signed deliveries ({len(body):,} bytes each; statuses {statuses}):")
        print(f"  {percentiles(times)}")
        print(f"  GET /healthz for scale: {percentiles(floor)}")

        import redis as redis_client

        redis_client.Redis(port=redis_port).flushdb()  # drop the queued benchmark jobs
        for pacing in ("0", "1.0"):
            worker_env = {**env, "TORCHREVIEW_GITHUB_WRITE_INTERVAL": pacing}
            worker = subprocess.Popen(worker_command(1, "reviews"), env=worker_env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            children.append(worker)
            durations = []
            for run in range(args.runs):
                files = {f"models/net_{i:02d}.py": example.replace("Classifier", f"Classifier{i}") for i in range(20)}
                pr = state.open_pull_request(repo, files, title=f"20 files, run {run}")
                body, headers = signed_delivery("pull_request", pull_request_payload("opened", pr), SECRET)
                started = time.perf_counter()
                session.post(base + "/api/github/webhooks", data=body, headers=headers, timeout=10)
                wait(lambda: [r for r in state.check_runs_for(pr.head_sha, name="torchreview") if r.status == "completed"]
                     and state.reviews_for(pr), 300, "the review")
                durations.append(time.perf_counter() - started)
            comments = len(state.review_comments_for(pr))
            print(f"delivery → review posted + check run completed, 20-file PR ({comments} inline comments), "
                  f"GitHub write pacing {pacing}s: median {statistics.median(durations):.2f}s "
                  f"(runs: {', '.join(f'{d:.2f}' for d in durations)})")
            worker.terminate()
            worker.wait(timeout=30)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
                child.wait(timeout=30)
        emulator.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
