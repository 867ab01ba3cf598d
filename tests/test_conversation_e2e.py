"""Review like a good colleague, across pushes and commands: end to end against the emulator."""
from __future__ import annotations

import time

from bot.conversation import SUMMARY_MARKER
from bot.review import parse_fingerprints
from github_emulator.webhooks import issue_comment_payload, real_payload
from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for



def loads(*names: str, weights_only: bool = False) -> dict[str, str]:
    keyword = ", weights_only=True" if weights_only else ""
    return {f"{n}.py": f'import torch\n\n{n} = torch.load("{n}.pt"{keyword})\n' for n in names}


# Three findings in three files: three comments (one rule's findings in one file would share one, and so would
# one rule's findings in three files without PER_FILE).
THREE = loads("a", "b", "c")
# every repository here opts into preview rules: the findings of these tests are TR601's, a preview rule
# (reported, never failing the check)
PREVIEW = {".github/torchreview.yml": "preview: true\n"}
PER_FILE = {".github/torchreview.yml": "preview: true\ngroup_rule_from_files: 0\n"}
FIX_B_ADD_D = {**loads("b", weights_only=True), **loads("d")}
MOVED = {path: "# a comment\n# and another\n\n" + text for path, text in {**THREE, **FIX_B_ADD_D}.items()}


def bot_comments(state, pr):
    return [c for c in state.review_comments_for(pr) if c.user.login.endswith("[bot]")]


def summary_comments(state, pr):
    return [c for c in state.issue_comments_for(pr) if SUMMARY_MARKER in c.body]


def test_pushes_comment_only_new_findings_and_resolve_fixed_ones(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PER_FILE)
    pr = state.open_pull_request(repo, THREE)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    first = bot_comments(state, pr)
    assert sorted((c.path, c.line) for c in first) == [("a.py", 3), ("b.py", 3), ("c.py", 3)]
    assert len(summary_comments(state, pr)) == 1

    head = state.push(pr, FIX_B_ADD_D)
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    after = bot_comments(state, pr)
    assert len(after) == 4  # exactly one new comment, nothing re-posted
    (new,) = [c for c in after if c.id not in {f.id for f in first}]
    assert (new.path, new.line) == ("d.py", 3) and 'torch.load("d.pt")' in new.body
    resolved = [t for t in state.threads_for(pr) if t.is_resolved]
    assert [state.thread_comments(t)[0].path for t in resolved] == ["b.py"]  # b's thread: fixed
    assert len(summary_comments(state, pr)) == 1  # edited in place, not re-posted
    assert len(state.reviews_for(pr)) == 2

    # An unrelated edit moves every line down: no duplicates, nothing resolved.
    head = state.push(pr, MOVED)
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    assert len(bot_comments(state, pr)) == 4
    assert len([t for t in state.threads_for(pr) if t.is_resolved]) == 1
    assert len(state.reviews_for(pr)) == 2


def test_cleanup_delete_removes_unanswered_comments_only(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\ncleanup: delete\ngroup_rule_from_files: 0\n"})
    pr = state.open_pull_request(repo, THREE)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    comments = {c.path: c for c in bot_comments(state, pr)}
    state.reply_to_review_comment(comments["a.py"].id, "Intentional: trusted file.", user="alice")
    head = state.push(pr, loads("a", "b", weights_only=True))
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    remaining = {c.path for c in bot_comments(state, pr)}
    assert remaining == {"a.py", "c.py"}  # b (no reply) deleted; a kept (alice replied) and resolved
    assert any(t.is_resolved and state.thread_comments(t)[0].path == "a.py" for t in state.threads_for(pr))
    assert any(c.user.login == "alice" for c in state.review_comments_for(pr))  # never touches others' comments


def test_review_command_from_read_only_user_is_refused(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    state.add_collaborator(repo, "reader", role="read")
    pr = state.open_pull_request(repo, THREE)
    data = issue_comment_payload(state, pr, "/review", user="reader", author_association="COLLABORATOR")
    comment = state.issue_comments[data["comment"]["id"]]
    assert deliver(stack, "issue_comment", data).status_code == 202
    wait_for(lambda: comment.reactions, 60, "the reaction")
    assert [r.content for r in comment.reactions] == ["-1"]  # no reply: nothing that spends the write budget
    assert state.issue_comments_for(pr) == [comment]
    assert state.check_runs_for(pr.head_sha, name="torchreview") == []
    assert state.reviews_for(pr) == []


def test_review_command_by_collaborator_runs_and_acknowledges(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    state.add_collaborator(repo, "maintainer", role="write")
    pr = state.open_pull_request(repo, THREE)
    data = issue_comment_payload(state, pr, "/review", user="maintainer", author_association="NONE")
    comment = state.issue_comments[data["comment"]["id"]]
    assert deliver(stack, "issue_comment", data).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "success" and len(bot_comments(state, pr)) == 1  # one (preview) rule in three files
    assert len(parse_fingerprints(bot_comments(state, pr)[0].body)) == 3
    assert [r.content for r in comment.reactions] == ["eyes"]


def test_review_config_and_help_commands(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\nfail_on: medium\nrules:\n  ignore: [TR105]\n"})
    pr = state.open_pull_request(repo, THREE)
    deliver(stack, "issue_comment", issue_comment_payload(state, pr, "/review config", user="octo-maintainer"))
    reply = wait_for(lambda: [c for c in state.issue_comments_for(pr) if "fail_on" in c.body], 60, "the config reply")
    assert "medium" in reply[0].body and ".github/torchreview.yml" in reply[0].body
    deliver(stack, "issue_comment", issue_comment_payload(state, pr, "/review frobnicate", user="octo-maintainer"))
    wait_for(lambda: [c for c in state.issue_comments_for(pr) if "/review smoke" in c.body], 60, "the usage reply")
    # the full SHA: no pull_request event told the App which commits the PR had, so a prefix would not resolve
    deliver(stack, "issue_comment", issue_comment_payload(state, pr, f"/review smoke {pr.head_sha}",
                                                          user="octo-maintainer"))
    wait_for(lambda: [c for c in state.issue_comments_for(pr) if "is queued" in c.body], 60, "the smoke reply")


def test_a_rule_disabled_on_the_base_branch_stays_disabled_and_the_pr_cannot_disable(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "preview: true\nrules:\n  ignore: [TR601]\n"})
    code = "import torch\n\nmodel = Net()\ntorch.save(model, 'm.pt')\n"
    pr = state.open_pull_request(repo, {**THREE, "train.py": code,
                                        ".github/torchreview.yml": "preview: true\nrules:\n  ignore: [TR601, TR602]\n"})
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    rules = {c.body.split("TR", 1)[1][:3] for c in bot_comments(state, pr)}
    assert rules == {"602"}


def test_invalid_config_names_the_line(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "fail_on: high\nskip:\n  drafts: maybe\n"})
    pr = state.open_pull_request(repo, THREE)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    run = completed_run(state, pr.head_sha)
    assert run.conclusion in {"failure", "action_required"}
    assert ".github/torchreview.yml:3" in run.output_summary and "drafts" in run.output_summary
    assert state.reviews_for(pr) == []


def test_two_hundred_findings(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    code = "import torch\n" + "".join(f'x{i} = torch.load("{i}.pt")\n' for i in range(200))
    pr = state.open_pull_request(repo, {"train.py": code})
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    run = completed_run(state, pr.head_sha, timeout=120)
    # one thing repeated 200 times is one comment that lists the lines, not 200 (nor 30) comments
    (comment,) = bot_comments(state, pr)
    assert "200 findings in this file" in comment.body
    assert len(run.annotations) == 200


def test_two_rapid_pushes_only_the_latest_head_is_reviewed(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, THREE)
    first = pr.head_sha
    first_payload = pr_payload("synchronize", name, pr)
    second = state.push(pr, FIX_B_ADD_D)
    deliver(stack, "pull_request", first_payload)  # arrives late, after the second push
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, second)
    time.sleep(2)
    assert {r.commit_id for r in state.reviews_for(pr)} == {second}
    assert all(r.status == "completed" for r in state.check_runs_for(first))


def test_skip_label_and_drafts(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, THREE, labels=["torchreview:skip"])
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    pr2 = state.open_pull_request(repo, THREE, head="other", title="WIP [skip torchreview]")
    deliver(stack, "pull_request", pr_payload("opened", name, pr2))
    draft = state.open_pull_request(repo, {**THREE, "draft.py": "# draft\n"}, head="draft", draft=True)
    deliver(stack, "pull_request", pr_payload("opened", name, draft))
    time.sleep(3)
    assert [state.check_runs_for(p.head_sha) for p in (pr, pr2, draft)] == [[], [], []]
    # ready for review: reviewed
    draft.draft = False
    deliver(stack, "pull_request", pr_payload("ready_for_review", name, draft))
    assert completed_run(state, draft.head_sha).conclusion == "success"  # reviewed: TR601 is preview


def test_rerun_button(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, THREE)
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    run = completed_run(state, pr.head_sha)
    posted = len(bot_comments(state, pr))
    assert [a["identifier"] for a in run.actions] == ["rerun"]
    data = real_payload("check_run.requested_action")
    owner, short = name.split("/")
    data["repository"].update(full_name=name, name=short)
    data["repository"]["owner"]["login"] = owner
    data["installation"]["id"] = 1
    data["requested_action"] = {"identifier": "rerun"}
    data["check_run"]["head_sha"] = pr.head_sha
    data["check_run"]["app"]["id"] = 4242
    data["check_run"]["pull_requests"][0]["number"] = pr.number
    assert deliver(stack, "check_run", data).status_code == 202
    wait_for(lambda: len([r for r in state.check_runs_for(pr.head_sha, name="torchreview")
                          if r.status == "completed"]) == 2, 60, "a second check run")
    assert len(bot_comments(state, pr)) == posted == 1  # re-run, but nothing re-posted
