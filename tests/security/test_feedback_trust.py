"""Issue 23 item 6: a verdict on the bot's comments counts only from a user with write access (GitHub's
collaborator permission, asked once and cached), only for the real rule ids of our comment's own marker line."""
from __future__ import annotations

import json

import redis

from bot.feedback import comment_rules
from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for

CODE = "import torch\n\nstate = torch.load('a.pt')\n"


def test_only_writers_count_and_their_permission_is_asked_once(stack):
    state = stack["state"]
    store = redis.Redis.from_url(stack["env"]["REDIS_URL"])
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\n"})  # TR601 is a preview rule
    state.add_collaborator(repo, "writer", "write")
    state.add_collaborator(repo, "reader", "read")  # can react and reply, cannot push: not a judge
    pr = state.open_pull_request(repo, {"train.py": CODE}, user="writer")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    completed_run(state, pr.head_sha, timeout=120)
    (ours,) = [c for c in state.review_comments_for(pr) if c.user.login.endswith("[bot]")]
    for user in ("writer", "reader", "outsider"):
        state.react_to_review_comment(ours.id, "-1", user)
    state.reply_to_review_comment(ours.id, "/review false-positive trust me", user="outsider")
    head = state.push(pr, {"train.py": CODE + "\nx = 1\n"})
    assert deliver(stack, "pull_request", pr_payload("synchronize", name, pr)).status_code == 202
    completed_run(state, head, timeout=120)
    pr.state = "closed"
    assert deliver(stack, "pull_request", pr_payload("closed", name, pr)).status_code == 202

    def permission_asks():
        return {user: len(state.requests_matching("GET", f"/repos/{name}/collaborators/{user}/permission"))
                for user in ("writer", "reader", "outsider")}

    log = stack["worker"].log.name
    wait_for(lambda: open(log, errors="replace").read().count(f"review {name}#{pr.number}: closed") or None, 90,
             "the closed PR's feedback job")
    records = [json.loads(x) for x in store.lrange("torchreview:feedback", 0, -1)]
    mine = [(r["user"], r["kind"], r["rule"]) for r in records if r["repository"] == name]
    assert mine == [("writer", "thumbs-down", "TR601")]
    # the synchronize review and the closed-PR job both read the verdicts; GitHub was asked once per user
    assert permission_asks() == {"writer": 1, "reader": 1, "outsider": 1}


def test_rules_come_from_our_marker_line_and_the_catalog_only():
    quoted = "`x = load(\"<!-- torchreview:fingerprint=00 rule=TR90001 -->\")`"
    assert comment_rules(f"{quoted}\n\n<!-- torchreview:fingerprint=ab rule=TR601 -->") == ["TR601"]
    assert comment_rules(f"text\n\n{quoted}") == []  # a last line that is not only markers is not ours
    assert comment_rules("x\n\n<!-- torchreview:fingerprint=ab rule=TR99999 -->") == []  # no such rule
    assert comment_rules("x\n\n<!-- torchreview:fingerprint=ab rule=TR601 --> "
                         "<!-- torchreview:fingerprint=cd rule=TR90002 -->") == ["TR601"]
