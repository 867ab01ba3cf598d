"""Red team: a check run named `torchreview` created on the PR head by another App (GitHub Actions' GITHUB_TOKEN in a
workflow the PR itself adds, for a same-repository PR) is adopted by the App as its own. GitHub refuses to let an
App update another App's check run (403 "Invalid app_id ... check run can only be modified by the GitHub App that
created it"); the emulator keeps that rule, and issues workflow tokens (github_emulator.state.workflow_token)."""
from __future__ import annotations

import time

import pytest
import requests

from tests.conftest import deliver, new_repo, pr_payload

BUGGY = "import torch\n\n\ndef resume(a):\n    return torch.symeig(a)\n"  # TR810 (stable, high): the check must fail


@pytest.fixture
def github_actions_app(stack):
    """GitHub Actions, as the emulator models it: a workflow's GITHUB_TOKEN acts as this App, and the emulator
    refuses (403) an update of a check run by any App but its creator, as GitHub does."""
    return stack["state"].actions_app


def spoof(stack, repo, sha, status, conclusion=None):
    """The PR's workflow posts a "torchreview" check run with its GITHUB_TOKEN, through the REST API."""
    state = stack["state"]
    body = {"name": "torchreview", "head_sha": sha, "status": status,
            "output": {"title": "No issues found", "summary": "All good."}}
    if conclusion:
        body["conclusion"] = conclusion
    response = requests.post(f"{stack['env']['GITHUB_API_URL']}/repos/{repo.full_name}/check-runs", json=body,
                             headers={"Authorization": f"token {state.workflow_token(repo)}"}, timeout=10)
    assert response.status_code == 201, response.text
    run = state.check_runs[response.json()["id"]]
    assert run.app.id == state.actions_app.id != state.app.id
    return run


@pytest.mark.parametrize("status, conclusion", [("completed", "success"), ("in_progress", None)])
def test_same_named_check_run_of_another_app(stack, github_actions_app, status, conclusion):
    state = stack["state"]
    repo, name = new_repo(state, {})
    state.add_collaborator(repo, "member", "write")  # a low-privilege member: can push a branch, not merge
    pr = state.open_pull_request(repo, {"train.py": BUGGY}, user="member")
    # the PR's own workflow (on: pull_request, permissions: checks: write) posts "torchreview" first
    spoof(stack, repo, pr.head_sha, status, conclusion)
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    deadline = time.time() + 150
    while time.time() < deadline:
        runs = state.check_runs_for(pr.head_sha, name="torchreview")
        ours = [r for r in runs if r.app.id == state.app.id]
        if ours and all(r.status == "completed" for r in ours):
            break
        time.sleep(1)
    runs = state.check_runs_for(pr.head_sha, name="torchreview")
    rejected = [r for r in state.requests if r.method == "PATCH" and "/check-runs/" in r.path and r.status == 403]
    print({"spoof": (status, conclusion),
           "check_runs_named_torchreview": [(r.app.slug, r.status, r.conclusion, (r.output_title or "")[:60]) for r in runs],
           "app_patches_refused_403": len(rejected), "review_comments": len(state.review_comments_for(pr))})
    ours = [r for r in runs if r.app.id == state.app.id]
    assert not rejected, "the App tried to edit the other App's check run"
    # what a secure App does: its own failing check run on the head, whatever other Apps post under the name
    assert ours and ours[0].conclusion == "failure" and "TR810" in (ours[0].output_summary or "") or \
        pytest.fail("the App did not post its own verdict (see the printed check runs)")


def test_the_emulator_keeps_each_app_to_its_own_check_runs(stack, github_actions_app):
    """What GitHub does, and the App's fix relies on: a run records the App whose token created it, and only that
    App may edit it."""
    state = stack["state"]
    repo, _name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"a.py": "x = 1\n"}, user="member")
    theirs = spoof(stack, repo, pr.head_sha, "in_progress")
    url = f"{stack['env']['GITHUB_API_URL']}/repos/{repo.full_name}/check-runs/{theirs.id}"
    token = state.workflow_token(repo)
    done = {"status": "completed", "conclusion": "success"}
    assert requests.patch(url, json=done, headers={"Authorization": f"token {token}"}, timeout=10).status_code == 200
    installation = state.issue_token(state.installations[1], None, None).token  # our App's token
    refused = requests.patch(url, json={"conclusion": "failure"}, headers={"Authorization": f"token {installation}"},
                             timeout=10)
    assert refused.status_code == 403 and "can only be modified by the GitHub App that created it" in refused.text
    assert state.check_runs[theirs.id].conclusion == "success"
