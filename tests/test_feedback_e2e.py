"""Feedback from reviewers, end to end: a 👎 and a `/review false-positive` reply on the App's comments are
recorded once, shown in the next check run, and exported by `torchreview feedback export`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for

ROOT = Path(__file__).resolve().parents[1]
# two findings in two files: two comments (one rule's findings in one file would share one)
TWO = {f"{n}.py": f'import torch\n\n{n} = torch.load("{n}.pt")\n' for n in ("a", "b")}


def bot_comments(state, pr):
    return [c for c in state.review_comments_for(pr) if c.user.login.endswith("[bot]")]


def export(stack) -> dict:
    env = {**os.environ, "REDIS_URL": stack["env"]["REDIS_URL"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bot.cli", "feedback", "export"], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_thumbs_down_and_false_positive_replies_are_recorded_once_and_summarized(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\n"})  # TR601, a preview rule, is the subject
    state.add_collaborator(repo, "alice", "write")  # a verdict counts from users with write access only
    pr = state.open_pull_request(repo, TWO)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    first, second = sorted(bot_comments(state, pr), key=lambda c: c.path)
    assert "/review false-positive" in first.body and "👎" in first.body  # every comment says how

    state.react_to_review_comment(first.id, "-1", user="alice")
    state.react_to_review_comment(first.id, "+1", user="bob")  # not a verdict
    state.reply_to_review_comment(second.id, "/review false-positive we wrote b.pt ourselves", user="alice")
    state.reply_to_review_comment(second.id, "thanks, fixing", user="bob")  # not a verdict either
    head = state.push(pr, {"b.py": TWO["b.py"] + "\nc = 1\n"})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    run = completed_run(state, head)
    assert "2 of torchreview's past comments on this repository were marked wrong" in run.output_summary

    records = [r for r in export(stack)["records"] if r["repository"] == name]
    assert sorted((r["kind"], r["user"], r["rule"]) for r in records) == [
        ("false-positive", "alice", "TR601"), ("thumbs-down", "alice", "TR601")]
    assert next(r for r in records if r["kind"] == "false-positive")["reason"] == "we wrote b.pt ourselves"

    # closing the PR reads them again: nothing is counted twice
    closed = pr_payload("closed", name, pr)
    closed["pull_request"]["state"] = "closed"
    assert deliver(stack, "pull_request", closed).status_code == 202
    log = Path(stack["worker"].log.name)
    wait_for(lambda: "closed: 0 new verdict(s)" in log.read_text(errors="replace"), 60, "the closed PR's feedback job")
    assert len([r for r in export(stack)["records"] if r["repository"] == name]) == 2
