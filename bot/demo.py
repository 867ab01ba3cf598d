"""``torchreview demo``: the whole App on embedded defaults, reviewing a PR on a local GitHub emulator.

No GitHub account and no Redis: the emulator plays GitHub (checking the App's JWT, tokens and
every request body against GitHub's OpenAPI description), ``torchreview serve`` runs the webhook
and an embedded worker, and a real ``pull_request.opened`` payload is signed and delivered.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel

ROOT = Path(__file__).resolve().parents[1]
REPO = "octo-org/vision"
SECRET = "demo-webhook-secret"
SMOKE_CHECK = "torchreview / smoke"
SMOKE_CONFIG = "smoke:\n  enabled: true\n  timeout: 120\n"
BASE_TRAIN = '''import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x)
'''


def _deliver(url: str, event: str, data: dict) -> requests.Response:
    from github_emulator.webhooks import signed_delivery

    body, headers = signed_delivery(event, data, SECRET)
    return requests.post(url, data=body, headers=headers, timeout=10)


def run_demo(keep: bool = False) -> int:
    from github_emulator import EmulatorState, generate_app_key, serve
    from github_emulator.local import free_port, wait_until
    from github_emulator.webhooks import pull_request_payload

    console = Console()
    private_key, public_key = generate_app_key()
    state = EmulatorState(app_public_key_pem=public_key, app_id=1)
    emulator = serve(state)
    state.add_installation("octo-org", installation_id=1)
    repo = state.add_repo(REPO, files={"README.md": "# vision\n", "train.py": BASE_TRAIN,
                                       ".github/torchreview.yml": SMOKE_CONFIG})
    state.add_collaborator(repo, "alice", role="write")  # collaborators' PRs are smoke-trained automatically
    buggy = (ROOT / "examples" / "buggy_train.py").read_text()
    models = (ROOT / "examples" / "smoke_models.py").read_text()
    pr = state.open_pull_request(repo, {"train.py": buggy, "models.py": models},
                                 title="Train the classifier with AMP", user="alice")
    console.print(f"[bold]GitHub emulator[/] at {emulator.url}: {REPO}#{pr.number} \"{pr.title}\" by alice "
                  f"(head {pr.head_sha[:7]})")

    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="torchreview-demo-"))
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # embedded defaults
    env.update(GITHUB_APP_ID="1", GITHUB_PRIVATE_KEY=private_key, GITHUB_WEBHOOK_SECRET=SECRET,
               GITHUB_API_URL=emulator.url, TORCHREVIEW_DATA_DIR=str(data_dir), PORT=str(port),
               TORCHREVIEW_GITHUB_WRITE_INTERVAL="0")
    log_path = data_dir / "serve.log"
    log = open(log_path, "w")
    server = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--web-workers", "1",
                               "--concurrency", "1"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        console.print(f"[bold]torchreview serve[/] (embedded broker in {data_dir}, log {log_path}) on {base}")
        wait_until(lambda: _healthy(base), 60, "the webhook server to start")
        started = time.perf_counter()
        response = _deliver(f"{base}/api/github/webhooks", "pull_request", pull_request_payload("opened", pr))
        console.print(f"delivered signed [cyan]pull_request.opened[/]: HTTP {response.status_code} "
                      f"{response.json().get('message', '') if response.content else ''}")
        run = wait_until(lambda: _completed(state, pr.head_sha), 180, "the review")
        console.print(f"review posted {time.perf_counter() - started:.1f}s after the delivery\n")
        _show(console, state, pr, run)
        smoke = wait_until(lambda: _completed(state, pr.head_sha, SMOKE_CHECK), 300, "the smoke check run")
        console.print(f"\nsmoke results {time.perf_counter() - started:.1f}s after the delivery")
        _show_smoke(console, state, pr, smoke)

        # The author fixes the critical and high findings and pushes: the check turns green.
        fixed = (ROOT / "examples" / "fixed_train.py").read_text()
        fixed_models = models.replace("torch.softmax(self.score(h), dim=0)", "torch.sigmoid(self.score(h))") \
                             .replace("h * weights * x.shape[0]", "h * weights")
        new_head = state.push(pr, {"train.py": fixed, "models.py": fixed_models}, message="Address torchreview's review")
        console.print(Panel(f"alice pushes a fix ({new_head[:7]}); delivering [cyan]pull_request.synchronize[/]"))
        _deliver(f"{base}/api/github/webhooks", "pull_request", pull_request_payload("synchronize", pr))
        run = wait_until(lambda: _completed(state, new_head), 180, "the second review")
        colour = "green" if run.conclusion == "success" else "red"
        console.print(f"check run [bold]torchreview[/] on {new_head[:7]}: [{colour}]{run.conclusion}[/] — {run.output_title}")
        smoke = wait_until(lambda: _completed(state, new_head, SMOKE_CHECK), 300, "the second smoke check run")
        colour = "green" if smoke.conclusion == "success" else "red"
        console.print(f"check run [bold]{SMOKE_CHECK}[/] on {new_head[:7]}: [{colour}]{smoke.conclusion}[/] — {smoke.output_title}")
        resolved = sum(1 for thread in state.threads_for(pr) if thread.is_resolved)
        console.print(f"{resolved} of {len(state.threads_for(pr))} review threads resolved (their findings are fixed); "
                      f"{len(state.reviews_for(pr))} reviews in total (static and smoke) — nothing was re-posted")
        if keep:
            console.print(f"\nleaving everything running (emulator {emulator.url}, app {base}); Ctrl-C to stop")
            server.wait()
        return 0
    except TimeoutError as exc:
        console.print(f"[red]{exc}[/]; last lines of {log_path}:")
        log.flush()
        console.print("".join(log_path.read_text().splitlines(keepends=True)[-30:]))
        return 1
    finally:
        import signal

        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()
        emulator.shutdown()


def _healthy(base: str) -> bool:
    try:
        return requests.get(base + "/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _completed(state, sha: str, name: str = "torchreview"):
    runs = [r for r in state.check_runs_for(sha, name=name) if r.status == "completed"]
    return runs[0] if runs else None


def _show_smoke(console: Console, state, pr, run) -> None:
    colour = "green" if run.conclusion == "success" else ("yellow" if run.conclusion == "neutral" else "red")
    console.print(Panel(Markdown(run.output_summary or ""), title=f"check run {SMOKE_CHECK}: {run.conclusion} — "
                        f"{run.output_title}", border_style=colour))
    for comment in state.review_comments_for(pr):
        if "**smoke**" in comment.body:
            console.print(f"[bold cyan]{comment.path}:{comment.line}[/]")
            console.print(Markdown(comment.body))


def _show(console: Console, state, pr, run) -> None:
    reviews = state.reviews_for(pr)
    comments = state.review_comments_for(pr)
    console.print(Panel(f"[bold]{len(reviews)} review[/] with [bold]{len(comments)} inline comments[/] on "
                        f"{REPO}#{pr.number}", style="bold"))
    for comment in sorted(comments, key=lambda c: (c.path, c.line or 0)):
        body = comment.body.split("<!--")[0].strip()
        console.print(f"[bold cyan]{comment.path}:{comment.line}[/]")
        console.print(Markdown(body))
        console.print()
    colour = "green" if run.conclusion == "success" else "red"
    console.print(Panel(Markdown(run.output_summary or ""),
                        title=f"check run torchreview: {run.conclusion} — {run.output_title}",
                        border_style=colour))
    console.print(f"{len(run.annotations)} annotations on the check run")
