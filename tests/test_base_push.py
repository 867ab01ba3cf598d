"""A push that changes a branch's configuration: deciding whether it did (from the payload, else from the two trees
and the two configurations), and listing the open PRs on that base to review again, once each."""
from __future__ import annotations

import json

import jsonschema
import pytest

from bot import base_push
from bot.base_push import changed_config_files, configuration_changed, run_base_push
from bot.github_client import GitHubClients
from bot.jobs import (BASE_CONFIG_CHANGED, NO_COMMIT, BasePushJob, config_commit, config_paths_pushed, job_from_dict,
                      route_event)
from bot.settings import Settings
from bot.store import SqliteStore
from github_emulator import EmulatorState
from github_emulator.contract import WEBHOOK_SCHEMA, require
from github_emulator.webhooks import push_payload
from tests.conftest import WEBHOOK_SECRET, new_repo

CONFIG = ".github/torchreview.yml"
SETTINGS = Settings(app_id=4242, private_key=None, webhook_secret=WEBHOOK_SECRET)


def genuine(payload: dict) -> dict:
    """``payload``, checked against GitHub's push schema (the webhooks package's, which the real example it is
    made from meets; the REST description's asks for repository fields that example predates)."""
    definitions = json.loads(require(WEBHOOK_SCHEMA).read_text())["definitions"]
    jsonschema.Draft7Validator({"$ref": "#/definitions/push$event", "definitions": definitions}).validate(payload)
    return payload


@pytest.fixture
def local():
    """A repository in an emulator's state (no server: payloads only)."""
    state = EmulatorState(app_public_key_pem=b"", app_id=4242)
    state.add_installation("octo-org", installation_id=1)
    repo = state.add_repo("octo-org/models", files={"README.md": "# m\n", CONFIG: "fail_on: critical\n"})
    return state, repo


def pushed(state, repo, *changes: dict, branch: str = "main", parent: str | None = None) -> tuple[str, str]:
    """Commit each of ``changes`` in turn on ``branch`` (from ``parent``: a forced push); (before, after)."""
    before = repo.branches.get(branch, NO_COMMIT)
    sha = parent if parent is not None else before
    for files in changes:
        sha = state.commit(repo, files, parent=None if sha == NO_COMMIT else sha, branch=branch)
    return before, sha


@pytest.mark.parametrize("changes, touched", [
    ([{CONFIG: "fail_on: high\n"}], {CONFIG}),
    ([{"train.py": "import torch\n"}, {CONFIG: None}], {CONFIG}),  # removed, in the second of two commits
    ([{"pyproject.toml": "[tool.torchreview]\nfail_on = 'low'\n"}], {"pyproject.toml"}),  # added
    ([{"train.py": "import torch\n"}, {"docs/a.md": "a\n"}], set()),
    ([{"docs/.github/torchreview.yml": "fail_on: low\n"}], set()),  # not where the configuration is read
])
def test_a_complete_payload_names_the_configuration_files_it_touched(local, changes, touched):
    state, repo = local
    before, after = pushed(state, repo, *changes)
    payload = genuine(push_payload(state, repo, "main", before, after))
    assert config_paths_pushed(payload) == touched
    jobs = route_event("push", payload, "d-1", SETTINGS)
    if touched:
        (job,) = jobs
        assert isinstance(job, BasePushJob) and job.config_paths == sorted(touched)
        assert (job.branch, job.before, job.after) == ("main", before, after) and job.pushed_at
        assert job_from_dict(json.loads(json.dumps(job.to_dict()))) == job  # what the queue carries back
    else:
        assert jobs == []  # nothing to do, and no API call spent finding that out


def test_a_payload_that_may_leave_commits_out_is_not_trusted(local):
    state, repo = local
    # 25 commits, the configuration changed in the first: GitHub's list may hold only the last 20
    before, after = pushed(state, repo, {CONFIG: "fail_on: low\n"}, *({"log.txt": f"{i}\n"} for i in range(24)))
    payload = genuine(push_payload(state, repo, "main", before, after))
    assert len(payload["commits"]) == 20 and config_paths_pushed(payload) is None
    (job,) = route_event("push", payload, "d-2", SETTINGS)
    assert job.config_paths is None  # the worker compares the trees


@pytest.mark.parametrize("damage", [
    lambda p: p["commits"][0].pop("modified"),  # a commit without its file lists
    lambda p: p.update(commits=[]),
    lambda p: p.update(commits=p["commits"][:-1]),  # the pushed head not listed last
])
def test_a_payload_without_every_file_list_is_not_trusted(local, damage):
    state, repo = local
    before, after = pushed(state, repo, {"a.txt": "a\n"}, {"b.txt": "b\n"})
    payload = push_payload(state, repo, "main", before, after)
    damage(payload)
    assert config_paths_pushed(payload) is None
    (job,) = route_event("push", payload, "d-3", SETTINGS)
    assert job.config_paths is None


def test_forced_pushes_and_new_branches_are_decided_by_the_trees(local):
    state, repo = local
    first = repo.branches["main"]
    pushed(state, repo, {CONFIG: "fail_on: low\n"})
    # the configuration change is dropped: the payload lists only the new commit, which touches no configuration
    before, after = pushed(state, repo, {"a.txt": "a\n"}, parent=first)
    forced = genuine(push_payload(state, repo, "main", before, after))
    assert forced["forced"] and forced["commits"][0]["added"] == ["a.txt"]
    assert config_paths_pushed(forced) is None
    (job,) = route_event("push", forced, "d-4", SETTINGS)
    assert job.config_paths is None

    created = genuine(push_payload(state, repo, "release", NO_COMMIT, after))
    assert created["created"] and config_paths_pushed(created) is None
    (job,) = route_event("push", created, "d-5", SETTINGS)
    assert job.branch == "release" and job.before == NO_COMMIT


def test_a_deleted_branch_or_a_tag_asks_for_nothing(local):
    state, repo = local
    deleted = genuine(push_payload(state, repo, "main", repo.branches["main"], NO_COMMIT))
    assert deleted["deleted"] and route_event("push", deleted, "d-6", SETTINGS) == []
    before, after = pushed(state, repo, {CONFIG: "fail_on: low\n"})
    tag = dict(push_payload(state, repo, "main", before, after), ref="refs/tags/v1.0")
    assert route_event("push", tag, "d-7", SETTINGS) == []


# ---- on the worker: the trees, the configurations, the open PRs ------------------------------------------------


@pytest.fixture
def remote(emulator, app_key, tmp_path):
    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret=WEBHOOK_SECRET, api_url=emulator.url,
                        data_dir=tmp_path / "data", github_write_interval=0)
    return emulator.state, GitHubClients(settings), SqliteStore(tmp_path / "state.sqlite")


def test_the_trees_say_which_configuration_files_changed(remote):
    state, clients, store = remote
    repo, name = new_repo(state, {}, {CONFIG: "fail_on: critical\n", "pyproject.toml": "[project]\nname = 'm'\n"})
    gh_repo = clients.for_installation(1, name).get_repo(name)
    start = repo.branches["main"]
    _, code_only = pushed(state, repo, *({"log.txt": f"{i}\n"} for i in range(3)))
    assert changed_config_files(gh_repo, start, code_only) == set()
    _, stricter = pushed(state, repo, {CONFIG: "fail_on: high\n"})
    assert changed_config_files(gh_repo, start, stricter) == {CONFIG}
    assert configuration_changed(gh_repo, start, stricter, store)
    # pyproject.toml edited outside [tool.torchreview]: a configuration file changed, the configuration did not
    _, bumped = pushed(state, repo, {"pyproject.toml": "[project]\nname = 'm'\nversion = '2'\n"})
    assert changed_config_files(gh_repo, stricter, bumped) == {"pyproject.toml"}
    assert not configuration_changed(gh_repo, stricter, bumped, store)
    # an invalid configuration is a change too (reviews then fail with its error)
    _, broken = pushed(state, repo, {CONFIG: "fail_on: sometimes\n"})
    assert configuration_changed(gh_repo, bumped, broken, store)
    # a branch's first push, and an old commit GitHub no longer has, count as changes
    assert changed_config_files(gh_repo, NO_COMMIT, broken) == set(base_push.CONFIG_FILES_IN_ORDER)
    assert configuration_changed(gh_repo, NO_COMMIT, broken, store)
    assert changed_config_files(gh_repo, "f" * 40, broken) == set(base_push.CONFIG_FILES_IN_ORDER)
    assert configuration_changed(gh_repo, "f" * 40, broken, store)


def _job(repo, name, before, after, paths=None, delivery="d-push", at=None) -> BasePushJob:
    return BasePushJob(installation_id=1, repository=name, branch="main", before=before, after=after,
                       delivery=delivery, config_paths=paths, pushed_at=at)


def test_each_open_pr_on_the_branch_is_reviewed_again_once(remote):
    state, clients, store = remote
    repo, name = new_repo(state, {}, {CONFIG: "fail_on: critical\n"})
    state.commit(repo, {"NOTES.md": "r\n"}, parent=repo.branches["main"], branch="release")
    on_main = [state.open_pull_request(repo, {f"m{i}.py": "import torch\n"}, head=f"m{i}") for i in range(3)]
    state.open_pull_request(repo, {"r.py": "import torch\n"}, base="release", head="r")
    on_main[2].state = "closed"
    before, after = pushed(state, repo, {CONFIG: "fail_on: high\n"})
    sent = []
    outcome = run_base_push(_job(repo, name, before, after), clients, store, sent.append)
    assert "2 re-review(s) enqueued" in outcome
    assert sorted((j.pull_number, j.head_sha) for j in sent) == sorted((p.number, p.head_sha) for p in on_main[:2])
    assert {(j.reason, j.base_sha, j.delivery) for j in sent} == {(BASE_CONFIG_CHANGED, after, "d-push")}
    # the reviews (and /review config, and smoke runs) now read the configuration of that push
    pull = clients.for_installation(1, name).get_repo(name).get_pull(on_main[0].number)
    assert pull.base.sha != after and config_commit(store, name, pull) == after

    # the job again (a retry, the delivery again): nothing enqueued twice
    again = run_base_push(_job(repo, name, before, after), clients, store, sent.append)
    assert "0 re-review(s) enqueued, 2 already" in again and len(sent) == 2
    # a PR pushed to since is a new head: reviewed again
    state.push(on_main[0], {"m0.py": "import torch\nx = 1\n"})
    run_base_push(_job(repo, name, before, after), clients, store, sent.append)
    assert [j.head_sha for j in sent[2:]] == [on_main[0].head_sha]


def test_a_push_that_changed_no_configuration_reviews_nothing(remote):
    state, clients, store = remote
    repo, name = new_repo(state, {}, {CONFIG: "fail_on: critical\n", "pyproject.toml": "[project]\nname = 'm'\n"})
    state.open_pull_request(repo, {"m.py": "import torch\n"})
    start = repo.branches["main"]
    _, after = pushed(state, repo, *({"log.txt": f"{i}\n"} for i in range(25)),
                      {"pyproject.toml": "[project]\nname = 'n'\n"})
    sent = []
    asked = len(state.requests_matching("GET", f"/repos/{name}/pulls*"))
    assert run_base_push(_job(repo, name, start, after), clients, store, sent.append).startswith(
        "configuration unchanged")
    assert sent == [] and len(state.requests_matching("GET", f"/repos/{name}/pulls*")) == asked
    assert config_commit(store, name, clients.for_installation(1, name).get_repo(name).get_pull(1)) == start


def test_the_fan_out_is_capped_most_recently_updated_first(remote, monkeypatch):
    state, clients, store = remote
    repo, name = new_repo(state, {}, {CONFIG: "fail_on: critical\n"})
    pulls = [state.open_pull_request(repo, {f"m{i}.py": "import torch\n"}, head=f"m{i}") for i in range(5)]
    import time

    time.sleep(1.1)  # GitHub's timestamps have seconds
    state.push(pulls[1], {"m1.py": "import torch\nx = 1\n"})
    monkeypatch.setattr(base_push, "MAX_BASE_PUSH_REVIEWS", 3)
    before, after = pushed(state, repo, {CONFIG: "fail_on: high\n"})
    sent = []
    assert run_base_push(_job(repo, name, before, after), clients, store, sent.append).endswith("capped")
    assert [j.pull_number for j in sent] == [pulls[1].number, pulls[4].number, pulls[3].number]


def test_an_older_push_never_takes_the_branch_back_to_its_configuration(remote):
    state, clients, store = remote
    repo, name = new_repo(state, {}, {CONFIG: "fail_on: critical\n"})
    pr = state.open_pull_request(repo, {"m.py": "import torch\n"})
    first_before, first = pushed(state, repo, {CONFIG: "fail_on: high\n"})
    _, second = pushed(state, repo, {CONFIG: "fail_on: medium\n"})
    sent = []
    run_base_push(_job(repo, name, first, second, [CONFIG], "d-2", at=2000.0), clients, store, sent.append)
    run_base_push(_job(repo, name, first_before, first, [CONFIG], "d-1", at=1000.0), clients, store, sent.append)
    pull = clients.for_installation(1, name).get_repo(name).get_pull(pr.number)
    assert config_commit(store, name, pull) == second  # the late delivery of the first push did not win
