"""Red team: anyone can mark the bot's comments wrong, and a comment's raw body carries PR text inside code
spans, so fake fingerprint markers become feedback 'rules' (metrics labels, the repository-wide summary line)."""
from __future__ import annotations

import json
import time

import redis

from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for

MARKERS = "".join(f"<!-- torchreview:fingerprint=00 rule=TR{90000 + i} -->" for i in range(200))
POISON = ("import torch\n\n\ndef resume(path):\n"
          f"    state = torch.load(path + \"{MARKERS}\")\n    return state\n")


def test_outsider_poisons_feedback_with_fake_rules(stack):
    state = stack["state"]
    store = redis.Redis.from_url(stack["env"]["REDIS_URL"])
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\n"})  # TR601 is a preview rule
    pr = state.open_pull_request(repo, {"train.py": POISON}, user="mallory")  # an outside contributor
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    completed_run(state, pr.head_sha, timeout=120)
    ours = [c for c in state.review_comments_for(pr) if "TR601" in c.body]
    assert ours, [c.body[:200] for c in state.review_comments_for(pr)]
    raw = ours[0].body
    fake_in_body = raw.count("rule=TR9")
    # the outsider (and two sock puppets) give the bot's comment a thumbs-down: no permission is asked
    for user in ("mallory", "mallory-2", "mallory-3"):
        state.react_to_review_comment(ours[0].id, "-1", user)
    # (adapted: with the fix the outsiders record nothing, so a maintainer's 👎 is what the closed-PR job records;
    # it must count for the comment's real rule only, never for the markers quoted from the PR's code)
    state.react_to_review_comment(ours[0].id, "-1", "octo-maintainer")
    pr.state = "closed"
    assert deliver(stack, "pull_request", pr_payload("closed", name, pr)).status_code == 202
    def mine():
        return [json.loads(x) for x in store.lrange("torchreview:feedback", 0, -1) if json.loads(x)["repository"] == name]
    wait_for(lambda: mine() or None, 90, "feedback records")
    while True:  # until the closed-PR job has recorded everything
        count = len(mine()); time.sleep(5)
        if len(mine()) == count:
            break
    records = mine()
    rules = sorted({r["rule"] for r in records})
    users = sorted({r["user"] for r in records})
    # a later PR of the same repository: its check run repeats the poisoned statistics to every reviewer
    pr2 = state.open_pull_request(repo, {"other.py": "import torch\nx = torch.load('a.pt')\n"}, user="alice", head="f2")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr2)).status_code == 202
    run2 = completed_run(state, pr2.head_sha, timeout=120)
    note = next((line for line in run2.output_summary.splitlines() if "marked wrong" in line), "")
    print(json.dumps({"fake_markers_in_raw_body": fake_in_body, "records": len(records), "distinct_rules": len(rules),
                      "sample_rules": rules[:5] + rules[-3:], "users": users, "summary_line_on_next_pr": note[:400]},
                     indent=1))
    assert not any(r.startswith("TR9") for r in rules), "fake rules recorded as feedback labels"
    assert users == ["octo-maintainer"], "users without write access counted"
    assert rules == ["TR601"] and "TR9" not in note
