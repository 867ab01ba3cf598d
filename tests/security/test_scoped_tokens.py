"""Issue 23 item 16: every job's installation token is scoped to its one repository and the permissions a job
needs (POST /app/installations/{id}/access_tokens with ``repositories`` and ``permissions``), and the emulator
holds a token to that scope."""
from __future__ import annotations

import time

import pytest
from github import GithubException

from bot.github_client import JOB_PERMISSIONS, GitHubClients
from bot.settings import Settings
from tests.conftest import completed_run, deliver, new_repo, pr_payload


def token_requests(state, since: float) -> list:
    return [r for r in state.requests_matching("POST", "/app/installations/*/access_tokens") if r.at >= since]


def test_a_review_asks_for_a_token_of_its_repository_and_the_job_permissions_only(stack):
    state = stack["state"]
    repo, name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"train.py": "import torch\nx = torch.symeig(a)\n"}, user="alice")
    started = time.time()
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    assert completed_run(state, pr.head_sha, timeout=120).conclusion == "failure"
    asked = token_requests(state, started)
    assert asked, "the worker reviewed without asking for a token of this repository"
    for request in asked:
        assert request.status == 201
        assert request.body["repositories"] == [name.split("/")[1]], request.body
        assert request.body["permissions"] == JOB_PERMISSIONS
    issued = [t for t in state.tokens.values() if t.repository_names == {name}]
    assert issued and all(t.permissions == {**JOB_PERMISSIONS} for t in issued)
    assert "issues" not in JOB_PERMISSIONS and "administration" not in JOB_PERMISSIONS


def test_a_scoped_token_reaches_no_other_repository(stack, app_key):
    state = stack["state"]
    mine, mine_name = new_repo(state, {})
    other, other_name = new_repo(state, {})  # same installation
    clients = GitHubClients(Settings(app_id=4242, private_key=app_key[0], webhook_secret=None,
                                     api_url=stack["env"]["GITHUB_API_URL"]))
    gh = clients.for_installation(1, mine_name)
    assert gh.get_repo(mine_name).full_name == mine_name
    with pytest.raises(GithubException) as refused:
        gh.get_repo(other_name)
    assert refused.value.status == 404
    # another repository gets its own client and token
    assert clients.for_installation(1, other_name).get_repo(other_name).full_name == other_name
    assert clients.for_installation(1, mine_name) is gh


def test_the_emulator_refuses_a_scope_the_installation_does_not_cover(stack, app_key):
    from github import Auth

    from bot.github_client import ScopedInstallationAuth

    state = stack["state"]
    state.add_installation("someone-else", installation_id=77)
    _repo, name = new_repo(state, {})
    auth = ScopedInstallationAuth(Auth.AppAuth(4242, app_key[0]), 77, name, JOB_PERMISSIONS)
    import github

    client = github.Github(base_url=stack["env"]["GITHUB_API_URL"], auth=auth, retry=None)
    with pytest.raises(GithubException) as refused:
        client.get_repo(name)
    assert refused.value.status == 422  # "not accessible to the parent installation"
    greedy = ScopedInstallationAuth(Auth.AppAuth(4242, app_key[0]), 1, name, {**JOB_PERMISSIONS, "administration": "write"})
    with pytest.raises(GithubException) as refused:
        github.Github(base_url=stack["env"]["GITHUB_API_URL"], auth=greedy, retry=None).get_repo(name)
    assert refused.value.status == 422
