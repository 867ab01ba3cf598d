"""`torchreview feedback`: what became of the App's comments, per installation and rule, end to end: a PR reviewed
(comments posted), a 👎 from a collaborator (and one from a user without access, not counted), a thread a person
resolved with the finding still there, a fix pushed (the App resolves that thread), then the command's output."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT, completed_run, deliver, new_repo, pr_payload, wait_for

FILES = {f"{n}.py": f'import torch\n\n{n} = torch.load("{n}.pt")\n' for n in ("a", "b", "c")}


def feedback_command(stack, *args: str) -> str:
    env = {**os.environ, "REDIS_URL": stack["env"]["REDIS_URL"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bot.cli", "feedback", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout


def test_feedback_reports_posted_verdicts_and_how_threads_ended(stack):
    state = stack["state"]
    # one comment per file (by default, a rule found in three files or more is said once)
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "group_rule_from_files: 0\npreview: true  # TR601 is a preview rule\n"})
    state.add_collaborator(repo, "alice", "write")
    pr = state.open_pull_request(repo, FILES)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    ours = {c.path: c for c in state.review_comments_for(pr) if c.user.login.endswith("[bot]")}
    assert sorted(ours) == ["a.py", "b.py", "c.py"]

    state.react_to_review_comment(ours["a.py"].id, "-1", user="alice")
    state.react_to_review_comment(ours["b.py"].id, "-1", user="mallory")  # no write access: not a verdict
    state.resolve_thread(ours["c.py"].id, user="alice")  # resolved, the finding still there
    head = state.push(pr, {"b.py": 'import torch\n\nb = torch.load("b.pt", weights_only=True)\n'})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    threads = {state.thread_root(state.review_comments[t.root_comment_id]).path: t for t in state.threads_for(pr)}
    assert threads["b.py"].is_resolved and threads["b.py"].resolved_by.login.endswith("[bot]")

    expected = {"installation": 1, "rule": "TR601", "posted": 3, "thumbs_down": 1, "false_positive": 0,
                "resolved_by_fix": 1, "resolved_without_fix": 1}
    assert json.loads(feedback_command(stack, "--format", "json", "--repository", name)) == {"rows": [expected]}
    table = feedback_command(stack, "--repository", name)
    assert "resolved by a fix" in table and "resolved without a fix" in table
    assert [line.split() for line in table.splitlines() if "TR601" in line] == [
        ["│", "1", "│", "TR601", "│", "3", "│", "1", "│", "0", "│", "1", "│", "1", "│"]]
    assert json.loads(feedback_command(stack, "--format", "json", "--installation", "2")) == {"rows": []}

    # the same PR read again at its close: nothing counted twice; a thread a person resolves later counts then
    state.resolve_thread(ours["a.py"].id, user="alice")
    closed = pr_payload("closed", name, pr)
    closed["pull_request"]["state"] = "closed"
    assert deliver(stack, "pull_request", closed).status_code == 202
    wait_for(lambda: json.loads(feedback_command(stack, "--format", "json", "--repository", name))["rows"][0]
             ["resolved_without_fix"] == 2, 60, "the closed PR's threads read")
    assert json.loads(feedback_command(stack, "--format", "json", "--repository", name))["rows"] == [
        dict(expected, resolved_without_fix=2)]


def test_events_are_kept_once_in_both_stores_and_a_fix_outranks_a_resolution(redis_url, tmp_path):
    import redis

    from bot.feedback import FIXED, POSTED, RESOLVED_UNFIXED, record_events, report
    from bot.store import RedisStore, SqliteStore

    redis.Redis.from_url(redis_url).delete(RedisStore.EVENTS, RedisStore.EVENTS + ":seen",
                                           RedisStore.FEEDBACK, RedisStore.FEEDBACK + ":seen")
    body = "text\n\n<!-- torchreview:fingerprint=ab12 rule=TR601 --> <!-- torchreview:fingerprint=cd34 rule=TR101 -->"
    faked = "<!-- torchreview:fingerprint=ef56 rule=TR999 -->"  # not a rule of ours: never a row
    for store in (RedisStore(redis_url), SqliteStore(tmp_path / "state.sqlite")):
        assert record_events(store, POSTED, 7, "o/r", 1, [body, faked]) == 2
        assert record_events(store, POSTED, 7, "o/r", 1, [body]) == 0  # the next review: not twice
        assert record_events(store, RESOLVED_UNFIXED, 7, "o/r", 1, [body]) == 2  # a person resolved it...
        only_tr601 = body.replace(" <!-- torchreview:fingerprint=cd34 rule=TR101 -->", "")
        assert record_events(store, FIXED, 7, "o/r", 1, [only_tr601]) == 1
        store.add_feedback({"id": "o/r#5:TR601:alice:thumbs-down", "repository": "o/r", "comment": 5,
                            "rule": "TR601", "kind": "thumbs-down", "user": "alice", "reason": ""})  # no installation
        rows = {row["rule"]: row for row in report(store)}
        assert rows == {  # ...then a push fixed TR601's finding: fixed, not both
            "TR101": {"installation": 7, "rule": "TR101", "posted": 1, "thumbs_down": 0, "false_positive": 0,
                      "resolved_by_fix": 0, "resolved_without_fix": 1},
            "TR601": {"installation": 7, "rule": "TR601", "posted": 1, "thumbs_down": 1, "false_positive": 0,
                      "resolved_by_fix": 1, "resolved_without_fix": 0}}
        assert report(store, repository="x/y") == [] and report(store, installation=8) == []
