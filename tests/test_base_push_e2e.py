"""A push to the base branch that changes its configuration, end to end: a real push payload over real HTTP into
Flask, the fan-out and the reviews on a real Celery worker, PyGithub against the GitHub emulator."""
from __future__ import annotations

import time
import uuid

from github_emulator.webhooks import push_payload
from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for
from tests.test_app_e2e import BASE_TRAIN, HEAD_TRAIN

CONFIG = ".github/torchreview.yml"
# HEAD_TRAIN's stable finding is high: it passes under fail_on critical, fails under fail_on high
LENIENT, STRICT = "preview: true\nfail_on: critical\n", "preview: true\nfail_on: high\n"


def run_for(state, sha: str, delivery: str):
    def completed():
        runs = [r for r in state.check_runs_for(sha, name="torchreview")
                if r.external_id == delivery and r.status == "completed"]
        return runs[0] if runs else None

    return wait_for(completed, 90, f"the check run delivery {delivery[:8]} asked for on {sha[:7]}")


def push_to(stack, repo, *changes: dict, branch: str = "main") -> tuple[str, int]:
    """Commit ``changes`` on ``branch`` one by one and deliver the push; (its delivery id, the webhook's status)."""
    state = stack["state"]
    before = sha = repo.branches[branch]
    for files in changes:
        sha = state.commit(repo, files, parent=sha, branch=branch)
    delivery = str(uuid.uuid4())
    return delivery, deliver(stack, "push", push_payload(state, repo, branch, before, sha), delivery).status_code


def test_a_stricter_base_configuration_turns_an_open_prs_check_red_and_back(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {"train.py": BASE_TRAIN, CONFIG: LENIENT})
    state.commit(repo, {"NOTES.md": "release\n"}, parent=repo.branches["main"], branch="release")
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN}, head="resume")
    elsewhere = state.open_pull_request(repo, {"train.py": HEAD_TRAIN}, base="release", head="backport")
    for opened in (pr, elsewhere):
        assert deliver(stack, "pull_request", pr_payload("opened", name, opened)).status_code == 202
        assert completed_run(state, opened.head_sha).conclusion == "success"
    reviews, comments = len(state.reviews_for(pr)), len(state.review_comments_for(pr))
    assert reviews == 1 and comments >= 1

    # a push that changes only other files re-reviews nothing (the webhook knows from the payload)
    delivery, status = push_to(stack, repo, {"README.md": "# models, documented\n"})
    assert status == 204
    # the configuration made stricter: the open PR on main is judged again, on its unchanged head
    delivery, status = push_to(stack, repo, {CONFIG: STRICT})
    assert status == 202
    run = run_for(state, pr.head_sha, delivery)
    assert run.conclusion == "failure"
    newest = state.check_runs_for(pr.head_sha, name="torchreview")
    assert len(newest) == 2  # a fresh run: the green verdict did not stand while the new one was made
    # nothing said twice: the same findings, so no new review or inline comment; one summary comment
    assert len(state.reviews_for(pr)) == reviews and len(state.review_comments_for(pr)) == comments
    assert len([c for c in state.issue_comments_for(pr) if "torchreview:summary" in c.body]) == 1
    assert [r.conclusion for r in state.check_runs_for(elsewhere.head_sha, name="torchreview")] == ["success"]

    # the PR's next push is judged by the new configuration, though its base.sha is the commit it was opened on
    head = state.push(pr, {"notes.txt": "wip\n"})
    assert deliver(stack, "pull_request", pr_payload("synchronize", name, pr)).status_code == 202
    assert completed_run(state, head).conclusion == "failure"

    # back to lenient, in the first of 21 commits: the payload may have left it out, the trees say
    delivery, status = push_to(stack, repo, {CONFIG: LENIENT}, *({"log.txt": f"{i}\n"} for i in range(20)))
    assert status == 202
    assert run_for(state, head, delivery).conclusion == "success"
    assert len(state.reviews_for(pr)) == reviews

    # the README-only push above asked for nothing: no run came of it, on either PR
    time.sleep(1)
    assert len(state.check_runs_for(pr.head_sha, name="torchreview")) == 2
    assert len(state.check_runs_for(elsewhere.head_sha, name="torchreview")) == 1


def test_a_push_whose_trees_show_no_configuration_change_reviews_nothing(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {"train.py": BASE_TRAIN, CONFIG: LENIENT})
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    completed_run(state, pr.head_sha)
    listed = len(state.requests_matching("GET", f"/repos/{name}/pulls"))
    # 21 commits, none to the configuration: the payload cannot tell, so the worker compares the trees
    delivery, status = push_to(stack, repo, *({"log.txt": f"{i}\n"} for i in range(21)))
    assert status == 202
    wait_for(lambda: state.requests_matching("GET", f"/repos/{name}/git/trees/{repo.branches['main']}"), 60,
             "the worker to read the pushed tree")
    time.sleep(2)
    assert len(state.check_runs_for(pr.head_sha, name="torchreview")) == 1
    assert len(state.requests_matching("GET", f"/repos/{name}/pulls")) == listed  # no PR listed either
