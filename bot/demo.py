"""``torchreview demo``: the whole App on embedded defaults, reviewing PRs on a local GitHub emulator.

No GitHub account and no Redis: the emulator plays GitHub (checking the App's JWT, tokens and
every request body against GitHub's OpenAPI description), ``torchreview serve`` runs the webhook
and an embedded worker, and real ``pull_request`` payloads are signed and delivered.

Two parts, each a PR with a fix pushed afterwards: ``static`` (the review and the ``torchreview``
check run; needs no torch) and ``smoke`` (the ``torchreview / smoke`` check run of the GPU runner,
on the CPU here; needs torch). Everything printed is read back from the emulator, i.e. what GitHub
would show, each finding once.
"""
from __future__ import annotations

import html
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import requests
from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from analyzers.markdown import BREAK

ROOT = Path(__file__).resolve().parents[1]
SECRET = "demo-webhook-secret"
CHECK = "torchreview"
SMOKE_CHECK = "torchreview / smoke"
STATIC_REPO = "octo-org/vision"
SMOKE_REPO = "octo-org/tabular"
SMOKE_CONFIG = "smoke:\n  enabled: true\n  timeout: 120\n"
STATIC_CONFIG = "preview: true  # every rule, the preview ones included: the demo shows the whole catalog\n"
PARTS = ("all", "static", "smoke")
RUNNER_HINT = "pip install 'torchreview[runner]'"
BASE_TRAIN = '''import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x)
'''
CONCLUSION_STYLE = {"success": "green", "neutral": "yellow", "skipped": "yellow"}


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def make_console() -> Console:
    """A terminal wraps at its width, between words; a log (no TTY) gets whole lines, never rich's
    default 80 columns, which cut titles and target names."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True)
    return console


def run_demo(keep: bool = False, part: str = "all", console: Optional[Console] = None) -> int:
    console = console or make_console()
    torch_here = has_torch()
    if part == "smoke" and not torch_here:
        console.print(Text.assemble(("the smoke part trains models and needs torch: ", "red"), RUNNER_HINT))
        return 2
    with DemoApp(console) as app:
        try:
            if part in ("all", "static"):
                static_part(app)
            if part in ("all", "smoke"):
                if torch_here:
                    smoke_part(app)
                else:
                    console.print()
                    console.print(Text.assemble(("No torch here, so no smoke part", "yellow"), " (the GPU runner trains "
                                                f"the changed models): {RUNNER_HINT}, then torchreview demo --part smoke"))
        except TimeoutError as exc:
            app.show_log_tail(exc)
            return 1
        if keep:
            console.print(f"\nleaving everything running (emulator {app.emulator.url}, app {app.base}); Ctrl-C to stop")
            app.server.wait()
    return 0


class DemoApp:
    """The emulator plus ``torchreview serve`` (webhook and embedded worker) in a child process."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __enter__(self) -> "DemoApp":
        from github_emulator import EmulatorState, generate_app_key, serve
        from github_emulator.local import free_port, wait_until

        private_key, public_key = generate_app_key()
        self.state = EmulatorState(app_public_key_pem=public_key, app_id=1)
        self.emulator = serve(self.state)
        self.state.add_installation("octo-org", installation_id=1)
        port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix="torchreview-demo-"))
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # embedded defaults
        env.update(GITHUB_APP_ID="1", GITHUB_PRIVATE_KEY=private_key, GITHUB_WEBHOOK_SECRET=SECRET,
                   GITHUB_API_URL=self.emulator.url, TORCHREVIEW_DATA_DIR=str(self.data_dir), PORT=str(port),
                   TORCHREVIEW_GITHUB_WRITE_INTERVAL="0")
        self.log_path = self.data_dir / "serve.log"
        self.log = open(self.log_path, "w")
        self.server = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--web-workers", "1", "--concurrency", "1"],
            env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}"
        self.console.print(Text.assemble(("GitHub emulator", "bold"), f" on {self.emulator.url} · ",
                                         ("torchreview serve", "bold"), f" on {self.base} (embedded broker, log {self.log_path})"))
        try:
            wait_until(self._healthy, 120, "the webhook server and its workers to start")  # /healthz waits for both
        except TimeoutError as exc:
            self.show_log_tail(exc)
            self.__exit__(None, None, None)
            raise SystemExit(1) from None
        return self

    def __exit__(self, *exc) -> None:
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
        self.log.close()
        self.emulator.shutdown()

    def _healthy(self) -> bool:
        try:
            return requests.get(self.base + "/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def deliver(self, action: str, pr) -> requests.Response:
        from github_emulator.webhooks import pull_request_payload, signed_delivery

        body, headers = signed_delivery("pull_request", pull_request_payload(action, pr), SECRET)
        return requests.post(f"{self.base}/api/github/webhooks", data=body, headers=headers, timeout=10)

    def wait_check(self, sha: str, name: str = CHECK, timeout: float = 180):
        from github_emulator.local import wait_until

        def completed():
            runs = [r for r in self.state.check_runs_for(sha, name=name) if r.status == "completed"]
            return runs[0] if runs else None

        return wait_until(completed, timeout, f"the {name} check run on {sha[:7]}")

    def show_log_tail(self, exc: Exception) -> None:
        self.log.flush()
        self.console.print(Text.assemble((str(exc), "red"), f"; last lines of {self.log_path}:"))
        self.console.print("".join(self.log_path.read_text().splitlines(keepends=True)[-30:]), markup=False)


# ---- the two parts ------------------------------------------------------------------------------


def static_part(app: DemoApp) -> None:
    console, state = app.console, app.state
    # the demo shows the whole catalog: preview rules too (they are reported, and never fail the check)
    repo = state.add_repo(STATIC_REPO, files={"README.md": "# vision\n", "train.py": BASE_TRAIN,
                                              ".github/torchreview.yml": STATIC_CONFIG})
    state.add_collaborator(repo, "alice", role="write")
    pr = state.open_pull_request(repo, {"train.py": (ROOT / "examples" / "buggy_train.py").read_text()},
                                 title="Train the classifier with AMP", user="alice")
    section(console, f"The static review: {STATIC_REPO}#{pr.number} \"{pr.title}\" by alice")
    started = delivered(app, "opened", pr)
    run = app.wait_check(pr.head_sha)
    console.print(f"review and check run posted {time.perf_counter() - started:.1f}s after the delivery\n")
    show_review(console, state, pr)
    show_check_run(console, run)

    new_head = state.push(pr, {"train.py": (ROOT / "examples" / "fixed_train.py").read_text()},
                          message="Address torchreview's review")
    section(console, f"alice pushes a fix ({new_head[:7]})")
    delivered(app, "synchronize", pr)
    show_check_run(console, app.wait_check(new_head))
    show_threads(console, state, pr)


def smoke_part(app: DemoApp) -> None:
    console, state = app.console, app.state
    repo = state.add_repo(SMOKE_REPO, files={"README.md": "# tabular\n", ".github/torchreview.yml": SMOKE_CONFIG})
    state.add_collaborator(repo, "alice", role="write")  # collaborators' PRs are smoke-trained automatically
    models = (ROOT / "examples" / "smoke_models.py").read_text()
    pr = state.open_pull_request(repo, {"models.py": models}, title="Pool features with attention", user="alice")
    section(console, f"Smoke-training the changed models: {SMOKE_REPO}#{pr.number} \"{pr.title}\" by alice "
                     "(smoke.enabled, a collaborator)")
    started = delivered(app, "opened", pr)
    show_check_run(console, app.wait_check(pr.head_sha))
    smoke = app.wait_check(pr.head_sha, SMOKE_CHECK, timeout=300)
    console.print(f"smoke results {time.perf_counter() - started:.1f}s after the delivery (static review first, "
                  "then the runner: head and base, each model in a sandboxed child)")
    show_check_run(console, smoke)
    show_comments(console, state.review_comments_for(pr))

    fixed = models.replace("torch.softmax(self.score(h), dim=0)", "torch.sigmoid(self.score(h))") \
                  .replace("h * weights * x.shape[0]", "h * weights")
    new_head = state.push(pr, {"models.py": fixed}, message="Normalize the attention per row")
    section(console, f"alice pushes a fix ({new_head[:7]})")
    delivered(app, "synchronize", pr)
    show_check_run(console, app.wait_check(new_head))
    show_check_run(console, app.wait_check(new_head, SMOKE_CHECK, timeout=300))
    show_threads(console, state, pr)


def delivered(app: DemoApp, action: str, pr) -> float:
    started = time.perf_counter()
    response = app.deliver(action, pr)
    message = response.json().get("message", "") if response.content else ""
    app.console.print(Text.assemble("signed ", (f"pull_request.{action}", "cyan"),
                                    f" delivered to the webhook: HTTP {response.status_code} {message}"))
    return started


# ---- printing what GitHub shows -----------------------------------------------------------------


def section(console: Console, title: str) -> None:
    console.print()
    console.print(Text(f"── {title}", style="bold"))


def show_review(console: Console, state, pr) -> None:
    for review in state.reviews_for(pr):
        console.print(Text.assemble(("review: ", "bold"), inline(review.body)))
    show_comments(console, state.review_comments_for(pr))
    console.print("[dim](each comment also says why, in a sentence; `torchreview rule ID` has the rule's docs)[/]")


def show_comments(console: Console, comments) -> None:
    for comment in sorted(comments, key=lambda c: (c.path, c.line or 0, c.id)):
        for indent, text in comment_text(comment.path, comment.line, comment.body):
            print_indented(console, indent, text)


MARKER_RE = re.compile(r"\s*<!-- torchreview:[^>]*-->\s*")
TITLE_RE = re.compile(r"^\S+ \*\*(?:critical|high|medium|low)\*\* · `TR\d+`")
FENCE_RE = re.compile(r"^(`{3,})suggestion\n(.*?)\n?\1$", re.S)
LISTED_RE = re.compile(r"^\d+ findings in this (?:file|pull request):$")
LISTED_ITEM_RE = re.compile(r"^- (?:`([^`]+)` )?line (\d+): (.*)$")  # another file than the commented one: named


def comment_text(path: str, line: Optional[int], body: str) -> list[tuple[int, Text]]:
    """One inline comment as (indent, line) pairs: location and title, then the message and any
    suggested change. The hidden fingerprint marker is dropped, and so is the "Why" sentence. A rule's
    findings listed line by line (``- line 47: message``) get a location and title each."""
    paragraphs = [p for p in MARKER_RE.sub("\n\n", body).split("\n\n") if p.strip()]
    lines, title, first = [], "", 0
    if not paragraphs or not TITLE_RE.match(paragraphs[0]):  # a note first: where the finding is, what changed
        note = paragraphs[0] if paragraphs else ""
        lines.append((0, Text.assemble((f"{path}:{line}", "bold cyan"), "  ", inline(note))))
        first = 1
    for index, paragraph in enumerate(paragraphs[first:], first):
        if paragraph.startswith("**Why:**"):
            continue
        if TITLE_RE.match(paragraph):  # a finding, or the next one of a comment that covers several
            title = paragraph
            listed = index + 1 < len(paragraphs) and LISTED_RE.match(paragraphs[index + 1])
            where = path if listed else f"{path}:{line}"  # listed: each line of the list says where
            lines.append((0, Text.assemble((where, "bold cyan"), "  ", inline(paragraph))))
            continue
        if LISTED_RE.match(paragraph):
            continue
        fence = FENCE_RE.match(paragraph)
        if fence:
            code = [c.strip() for c in fence.group(2).splitlines()] or [""]
            label = Text("suggested change: ", style="dim")
            if len(code) == 1:
                lines.append((4, label.append(code[0], style="green")))
            else:
                lines += [(4, label)] + [(6, Text(c, style="green")) for c in code]
            continue
        for item in paragraph.splitlines():
            at = LISTED_ITEM_RE.match(item)
            if at and title:
                lines.append((0, Text.assemble((f"{at.group(1) or path}:{at.group(2)}", "bold cyan"), "  ",
                                               inline(title), " ", inline(at.group(3)))))
            else:
                lines.append((4, inline("• " + item[2:] if item.startswith("- ") else item)))
    return lines


def print_indented(console: Console, indent: int, text: Text) -> None:
    """A terminal wraps under the indent; a log gets the line whole."""
    if console.is_terminal:
        console.print(Padding(text, (0, 0, 0, indent)))
    else:
        console.print(Text(" " * indent).append_text(text))


INLINE_RE = re.compile(r"(`+)(.+?)\1|\*\*(.+?)\*\*|\\([!-/:-@\[-`{-~])")


def inline(markdown: str, style: str = "") -> Text:
    """GitHub's inline Markdown as styled text: code spans, bold, backslash escapes and entities; the
    zero-width spaces that stop GitHub's autolinks and mentions are dropped (a terminal has neither)."""
    text = Text(style=style)
    position = 0
    for match in INLINE_RE.finditer(markdown):
        text.append(_plain(markdown[position:match.start()]))
        if match.group(1):
            code = match.group(2)
            if len(code) > 2 and code[0] == code[-1] == " ":
                code = code[1:-1]  # CommonMark: one padding space each side
            text.append(code.replace(BREAK, ""), style="cyan")
        elif match.group(3) is not None:
            text.append_text(inline(match.group(3), "bold"))
        else:
            text.append(match.group(4))
        position = match.end()
    text.append(_plain(markdown[position:]))
    return text


def _plain(markdown: str) -> str:
    return html.unescape(markdown).replace(BREAK, "")


def show_check_run(console: Console, run) -> None:
    """One line for the run, then, for a smoke run, one line per target and any warnings."""
    style = CONCLUSION_STYLE.get(run.conclusion, "red")
    line = Text.assemble("check run ", (run.name, "bold"), f" on {run.head_sha[:7]}: ", (run.conclusion, style),
                         f" — {run.output_title}")
    summary = run.output_summary or ""
    totals = next((row for row in summary.splitlines() if row.replace("*", "").startswith("Totals:")), None)
    if totals and re.search(r"[1-9]", totals):  # all zeros: the title already says "No issues found"
        line.append(" · ")
        line.append_text(inline(totals.replace("**", "")))
    if run.annotations:
        line.append(f" · {len(run.annotations)} annotations")
    console.print(line)
    if run.name == SMOKE_CHECK:
        for row in smoke_lines(summary):
            print_indented(console, 2, row)


CELL_SPLIT = re.compile(r"(?<!\\)\|")


def smoke_lines(summary: str) -> list[Text]:
    """The smoke summary's tables, one line per target: failing checks by name (the inline comment has
    the details), the rest counted, then the measures."""
    results: dict[str, list[str]] = {}
    measures: dict[str, str] = {}
    extra: list[str] = []
    lines = summary.splitlines()
    for index, row in enumerate(lines):
        if row.startswith("| `"):
            cells = [c.strip() for c in CELL_SPLIT.split(row.strip().strip("|"))]
            target = cells[0]
            if len(cells) == 4:  # target | check | result | head vs base
                _, check, result, delta = cells
                if check in ("—", "all checks", "other checks"):
                    results.setdefault(target, []).append(result)
                else:
                    results.setdefault(target, []).append(f"{result.split(' ', 1)[0]} {check}")
                if delta not in ("", "—"):
                    results[target].append(f"vs base: {delta}")
            elif len(cells) == 5:  # target | parameters | step time | peak memory | loss after steps
                _, params, step, memory, loss = cells
                measures[target] = f"{params} params · {step}/step · {memory} peak · loss {loss}"
        elif row.startswith("⚠️") or (row.startswith("- ") and "Sandbox warnings" in "".join(lines[:index])):
            extra.append(row.removeprefix("- "))
    out = []
    for target, parts in results.items():
        text = inline(target, "bold")
        text.append("  ")
        text.append_text(inline(" · ".join(parts + ([measures[target]] if target in measures else []))))
        out.append(text)
    out += [Text("sandbox: ", style="yellow").append_text(inline(w)) if not w.startswith("⚠️") else inline(w)
            for w in extra]
    return out


def show_threads(console: Console, state, pr) -> None:
    from bot.review import count_phrase

    threads = state.threads_for(pr)
    resolved = sum(1 for thread in threads if thread.is_resolved)
    style = "green" if resolved == len(threads) else "red"
    comments = state.review_comments_for(pr)
    markers = [MARKER_RE.search(c.body).group().strip() for c in comments if MARKER_RE.search(c.body)]
    twice = len(markers) - len(set(markers))
    console.print(Text.assemble((f"{resolved} of {len(threads)} review threads resolved", style),
                                f" (their findings are fixed); {count_phrase(len(comments), 'comment')} in "
                                f"{count_phrase(len(state.reviews_for(pr)), 'review')}, " + (f"{twice} posted twice" if twice else "none posted twice")))
