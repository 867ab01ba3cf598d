"""The GitHub emulator, driven through unmodified PyGithub.

Every emulator here runs with response checking on, so each JSON body an operation
returns is also validated against GitHub's OpenAPI response schema.
"""

from __future__ import annotations

import base64
import io
import tarfile
import time

import github
import jwt
import pytest
import requests
from github import Auth, GithubException
from github.GithubException import BadCredentialsException, RateLimitExceededException, UnknownObjectException

from github_emulator import EmulatorState, generate_app_key, serve
from github_emulator.diffing import diff_trees
from github_emulator.routes import ROUTES
from github_emulator.contract import CONTRACT_DIR_ENV, FETCH_COMMAND, ContractError, require
from github_emulator import contract
from github_emulator.spec import openapi, operations_index

APP_ID = 4242
BASE_FILES = {
    "model.py": (
        "import torch\n"
        "\n"
        "\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n"
        "\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
    ),
    "train.py": "from model import Net\n\nnet = Net()\n",
    "docs/README.md": "# Models\n",
}
HEAD_CHANGES = {
    # line 10 changes, lines 11-12 are added
    "model.py": BASE_FILES["model.py"].replace("return self.fc(x)", "y = self.fc(x)\n        return y.softmax(-1)\n")
    + "\n# trailing\n",
    "train.py": None,  # removed
    "eval.py": "import torch\n\nwith torch.no_grad():\n    pass\n",  # added
}


@pytest.fixture(scope="session")
def app_key() -> tuple[str, bytes]:
    openapi()  # pay the ~3 s description load once per session
    return generate_app_key()


@pytest.fixture
def world(app_key):
    """A fresh emulator: one installation on octo-org, one repo, one open PR."""
    _, public_pem = app_key
    state = EmulatorState(app_public_key_pem=public_pem, app_id=APP_ID)
    installation = state.add_installation("octo-org")
    repo = state.add_repo("octo-org/models", files=BASE_FILES)
    pr = state.open_pull_request(repo, HEAD_CHANGES, title="Use softmax", user="alice")
    emulator = serve(state, check_responses=True)
    yield state, emulator, installation, pr
    emulator.shutdown()
    assert emulator.app.config["RESPONSE_PROBLEMS"] == []


def integration(emulator, private_key: str, **kwargs) -> github.GithubIntegration:
    # PyGithub sleeps 0.25 s between requests (1 s between writes) by default, and
    # unlike Github(), GithubIntegration does not retry unless given a GithubRetry.
    options = {"seconds_between_requests": None, "seconds_between_writes": None, "retry": github.GithubRetry()}
    auth = Auth.AppAuth(APP_ID, private_key)
    return github.GithubIntegration(base_url=emulator.url, auth=auth, **{**options, **kwargs})


@pytest.fixture
def gh(world, app_key) -> github.Github:
    _, emulator, installation, _ = world
    return integration(emulator, app_key[0]).get_github_for_installation(installation.id)


@pytest.fixture
def repo(gh):
    return gh.get_repo("octo-org/models")


# ----------------------------------------------------------------------------- auth


def test_app_jwt_then_installation_token(world, app_key):
    state, emulator, installation, _ = world
    gi = integration(emulator, app_key[0])
    assert gi.get_app().slug == "torchreview"
    assert gi.get_repo_installation("octo-org", "models").id == installation.id
    token = gi.get_access_token(installation.id)
    assert token.token.startswith("ghs_")
    assert 3500 < (token.expires_at.timestamp() - time.time()) <= 3600


def test_jwt_signed_by_another_key_is_rejected(world):
    _, emulator, _, _ = world
    other_private_key, _ = generate_app_key()
    with pytest.raises(GithubException) as excinfo:
        integration(emulator, other_private_key).get_app()
    assert excinfo.value.status == 401


def test_jwt_with_wrong_issuer_or_too_long_lifetime_is_rejected(world, app_key):
    _, emulator, _, _ = world
    now = int(time.time())
    wrong_issuer = {"iss": "999", "iat": now - 60, "exp": now + 300}
    lives_an_hour = {"iss": str(APP_ID), "iat": now, "exp": now + 3600}
    for claims in (wrong_issuer, lives_an_hour):
        encoded = jwt.encode(claims, app_key[0], algorithm="RS256")
        response = requests.get(f"{emulator.url}/app", headers={"Authorization": f"Bearer {encoded}"})
        assert response.status_code == 401, claims


def test_bad_token_is_401(world):
    _, emulator, _, _ = world
    bad = github.Github(base_url=emulator.url, auth=Auth.Token("ghs_not-a-real-token"), seconds_between_requests=None)
    with pytest.raises(BadCredentialsException) as excinfo:
        bad.get_repo("octo-org/models")
    assert excinfo.value.status == 401


def test_expired_token_is_401(world, gh):
    state, _, _, _ = world
    gh.get_repo("octo-org/models")
    state.expire_tokens()
    with pytest.raises(BadCredentialsException):
        gh.get_repo("octo-org/models")


def test_repo_outside_installation_is_404(world, gh):
    state, _, _, _ = world
    state.add_repo("someone-else/private", files={"a.py": "x = 1\n"})
    with pytest.raises(UnknownObjectException):
        gh.get_repo("someone-else/private")


def test_token_narrowed_to_read_cannot_write(world, app_key):
    _, emulator, installation, pr = world
    gi = integration(emulator, app_key[0])
    read_only = gi.get_github_for_installation(installation.id, token_permissions={"pull_requests": "read"})
    pull = read_only.get_repo("octo-org/models").get_pull(pr.number)
    with pytest.raises(GithubException) as excinfo:
        pull.create_review(body="hi", event="COMMENT")
    assert excinfo.value.status == 403


# ----------------------------------------------------------------------------- pulls & contents


def test_pull_request_shape(world, repo):
    _, _, _, pr = world
    pull = repo.get_pull(pr.number)
    assert pull.title == "Use softmax"
    assert pull.user.login == "alice"
    assert pull.head.sha == pr.head_sha and pull.base.sha == pr.base_sha
    assert pull.base.ref == "main" and pull.head.ref == "feature"
    assert pull.changed_files == 3


def test_pull_files_have_github_patches(world, repo):
    _, _, _, pr = world
    files = {f.filename: f for f in repo.get_pull(pr.number).get_files()}
    assert {name: f.status for name, f in files.items()} == {
        "eval.py": "added",
        "model.py": "modified",
        "train.py": "removed",
    }
    assert files["eval.py"].patch.startswith("@@ -0,0 +1,4 @@\n+import torch")
    assert files["train.py"].patch.startswith("@@ -1,3 +0,0 @@\n-from model import Net")
    model_patch = files["model.py"].patch
    assert model_patch.startswith("@@ -7,4 +7,8 @@")
    assert "-        return self.fc(x)\n+        y = self.fc(x)\n+        return y.softmax(-1)" in model_patch
    assert not model_patch.startswith("---")
    assert (files["model.py"].additions, files["model.py"].deletions) == (5, 1)


def test_pull_files_paginate_with_link_headers(world, app_key):
    state, emulator, installation, _ = world
    many = {f"pkg/module_{i:03d}.py": f"value = {i}\n" for i in range(350)}
    big_pr = state.open_pull_request("octo-org/models", many, head="many-files")
    client = integration(emulator, app_key[0], per_page=100).get_github_for_installation(installation.id)
    names = [f.filename for f in client.get_repo("octo-org/models").get_pull(big_pr.number).get_files()]
    assert names == sorted(many)
    pages = state.requests_matching("GET", f"/repos/octo-org/models/pulls/{big_pr.number}/files")
    assert [r.query.get("page", "1") for r in pages] == ["1", "2", "3", "4"]

    first_page = requests.get(
        f"{emulator.url}/repos/octo-org/models/pulls/{big_pr.number}/files",
        params={"per_page": 100},
        headers={"Authorization": f"token {next(iter(state.tokens))}"},
    )
    assert 'rel="next"' in first_page.headers["Link"] and "page=4" in first_page.headers["Link"]


def test_pull_requests_listed_by_state_base_and_head_a_page_at_a_time(world, app_key):
    state, emulator, installation, first = world
    state.commit("octo-org/models", {"NOTES.md": "release\n"}, parent=state.repos["octo-org/models"].branches["main"],
                 branch="release")
    on_main = [state.open_pull_request("octo-org/models", {f"m{i}.py": "x = 1\n"}, head=f"main-{i}") for i in range(4)]
    on_release = state.open_pull_request("octo-org/models", {"r.py": "x = 1\n"}, base="release", head="fix")
    fork = state.fork("octo-org/models", owner="mallory")
    from_fork = state.open_pull_request("octo-org/models", {"f.py": "x = 1\n"}, head_repo=fork, head="fix",
                                        user="mallory")
    on_main[1].state = "closed"
    time.sleep(1.1)  # GitHub's timestamps have seconds: a later update sorts after
    state.push(on_main[2], {"m2.py": "x = 2\n"})
    client = integration(emulator, app_key[0], per_page=2).get_github_for_installation(installation.id)
    remote = client.get_repo("octo-org/models")

    open_on_main = [p.number for p in remote.get_pulls(state="open", base="main")]
    assert open_on_main == [from_fork.number, on_main[3].number, on_main[2].number, on_main[0].number, first.number]
    assert [p.number for p in remote.get_pulls(state="closed")] == [on_main[1].number]
    assert len(list(remote.get_pulls(state="all"))) == 7
    assert [p.number for p in remote.get_pulls(base="release")] == [on_release.number]
    assert [p.number for p in remote.get_pulls(head="mallory:fix")] == [from_fork.number]
    assert [p.number for p in remote.get_pulls(head="octo-org:fix")] == [on_release.number]
    assert [p.number for p in remote.get_pulls(base="main", sort="updated", direction="desc")][0] == on_main[2].number
    assert [p.number for p in remote.get_pulls(base="nowhere")] == []
    listed = remote.get_pulls(base="main")[0]
    assert listed.head.sha == from_fork.head_sha and listed.base.ref == "main" and listed.base.sha == from_fork.base_sha
    pages = [r.query.get("page", "1") for r in state.requests_matching("GET", "/repos/octo-org/models/pulls")
             if r.query.get("base") == "main" and "sort" not in r.query]
    assert pages[:3] == ["1", "2", "3"]

    token = {"Authorization": f"token {next(iter(state.tokens))}"}
    page = requests.get(f"{emulator.url}/repos/octo-org/models/pulls", params={"per_page": 2, "base": "main"},
                        headers=token)
    assert 'rel="next"' in page.headers["Link"] and "base=main" in page.headers["Link"] and "page=3" in page.headers["Link"]
    assert "mergeable" not in page.json()[0]  # the simple form, as GitHub lists them
    refused = requests.get(f"{emulator.url}/repos/octo-org/models/pulls", params={"state": "merged"}, headers=token)
    assert refused.status_code == 422


def test_contents_at_a_ref(world, repo):
    _, _, _, pr = world
    assert b"softmax" in repo.get_contents("model.py", ref=pr.head_sha).decoded_content
    assert b"softmax" not in repo.get_contents("model.py", ref="main").decoded_content
    assert [c.path for c in repo.get_contents("docs", ref="main")] == ["docs/README.md"]
    with pytest.raises(UnknownObjectException):
        repo.get_contents("train.py", ref=pr.head_sha)


def test_tree_blob_and_tarball(world, repo):
    _, emulator, _, pr = world
    tree = repo.get_git_tree(pr.head_sha, recursive=True)
    paths = {element.path: element for element in tree.tree}
    assert {"docs", "docs/README.md", "eval.py", "model.py"} <= set(paths)
    blob = repo.get_git_blob(paths["eval.py"].sha)
    assert blob.encoding == "base64" and b"torch" in base64.b64decode(blob.content)

    link = repo.get_archive_link("tarball", pr.head_sha)
    assert link.startswith(emulator.url)
    archive = tarfile.open(fileobj=io.BytesIO(requests.get(link).content), mode="r:gz")
    names = archive.getnames()
    root = names[0]
    assert root.startswith("octo-org-models-") and f"{root}/eval.py" in names


def test_compare(world, repo):
    _, _, _, pr = world
    comparison = repo.compare("main", pr.head_sha)
    assert comparison.status == "ahead" and comparison.ahead_by == 1
    assert sorted(f.filename for f in comparison.files) == ["eval.py", "model.py", "train.py"]


def test_collaborator_permission(world, repo):
    state, _, _, _ = world
    state.add_collaborator("octo-org/models", "maintainer-bob", role="maintain")
    assert repo.get_collaborator_permission("maintainer-bob") == "write"
    assert repo.get_collaborator_role_name("maintainer-bob") == "maintain"


# ----------------------------------------------------------------------------- reviews


def test_review_with_valid_inline_comments(world, repo):
    state, _, _, pr = world
    pull = repo.get_pull(pr.number)
    review = pull.create_review(
        body="Some notes",
        event="COMMENT",
        comments=[
            {"path": "model.py", "line": 11, "side": "RIGHT", "body": "added line"},
            {"path": "model.py", "line": 9, "body": "context line"},
            {"path": "model.py", "line": 10, "side": "LEFT", "body": "removed line"},
            {"path": "model.py", "start_line": 10, "line": 11, "side": "RIGHT", "body": "multi-line"},
            {"path": "eval.py", "position": 1, "body": "legacy position"},
        ],
    )
    assert review.state == "COMMENTED"
    stored = state.review_comments_for(pr)
    assert [(c.path, c.line, c.side) for c in stored] == [
        ("model.py", 11, "RIGHT"),
        ("model.py", 9, "RIGHT"),
        ("model.py", 10, "LEFT"),
        ("model.py", 11, "RIGHT"),
        ("eval.py", 1, "RIGHT"),
    ]
    listed = list(pull.get_review_comments())
    assert listed[0].diff_hunk.endswith("+        return y.softmax(-1)")
    assert [r.state for r in pull.get_reviews()] == ["COMMENTED"]


def test_review_with_one_line_outside_the_diff_is_rejected_whole(world, repo):
    state, _, _, pr = world
    with pytest.raises(GithubException) as excinfo:
        repo.get_pull(pr.number).create_review(
            body="x",
            event="COMMENT",
            comments=[
                {"path": "model.py", "line": 11, "body": "fine"},
                {"path": "model.py", "line": 1, "body": "line 1 is not in any hunk"},
            ],
        )
    assert excinfo.value.status == 422
    assert excinfo.value.data["errors"] == ["Pull request review thread line must be part of the diff"]
    assert state.reviews_for(pr) == [] and state.review_comments_for(pr) == []


def test_invalid_review_event_fails_openapi_validation(world, repo):
    _, _, _, pr = world
    with pytest.raises(GithubException) as excinfo:
        repo.get_pull(pr.number).create_review(body="x", event="APPROVED")
    assert excinfo.value.status == 422
    assert excinfo.value.data["message"] == "Validation Failed"
    assert excinfo.value.data["errors"][0]["field"] == "event"


def test_standalone_comment_edit_delete(world, repo, gh):
    state, _, _, pr = world
    pull = repo.get_pull(pr.number)
    head_commit = gh.withLazy(True).get_repo("octo-org/models").get_commit(pr.head_sha)  # lazy: no GET commits/
    comment = pull.create_review_comment("nit", head_commit, "eval.py", line=3)
    assert (comment.line, comment.side) == (3, "RIGHT")
    comment.edit("nit (edited)")
    assert state.review_comments[comment.id].body == "nit (edited)"
    comment.delete()
    assert state.review_comments_for(pr) == []


def test_graphql_review_threads_and_resolve(world, repo, gh):
    state, _, _, pr = world
    repo.get_pull(pr.number).create_review(
        body="", event="COMMENT", comments=[{"path": "eval.py", "line": 1, "body": "first"}]
    )
    state.reply_to_review_comment(state.review_comments_for(pr)[0].id, "agreed", user="alice")
    query = """
    query($owner: String!, $name: String!, $number: Int!) {
      repository(owner: $owner, name: $name) {
        pullRequest(number: $number) {
          reviewThreads(first: 50) {
            totalCount
            pageInfo { hasNextPage endCursor }
            nodes {
              id isResolved isOutdated path line
              comments(first: 10) { nodes { databaseId body author { login } } }
            }
          }
        }
      }
    }"""
    _, data = gh.requester.graphql_query(query, {"owner": "octo-org", "name": "models", "number": pr.number})
    threads = data["data"]["repository"]["pullRequest"]["reviewThreads"]
    assert threads["totalCount"] == 1 and threads["pageInfo"]["hasNextPage"] is False
    thread = threads["nodes"][0]
    assert (thread["isResolved"], thread["isOutdated"], thread["path"], thread["line"]) == (False, False, "eval.py", 1)
    assert [c["author"]["login"] for c in thread["comments"]["nodes"]] == ["torchreview[bot]", "alice"]

    mutation = "mutation($id: ID!) { resolveReviewThread(input: {threadId: $id}) { thread { id isResolved } } }"
    _, data = gh.requester.graphql_query(mutation, {"id": thread["id"]})
    assert data["data"]["resolveReviewThread"]["thread"] == {"id": thread["id"], "isResolved": True}
    assert state.threads_for(pr)[0].is_resolved

    state.push(pr, {"eval.py": "import numpy\n"})
    _, data = gh.requester.graphql_query(query, {"owner": "octo-org", "name": "models", "number": pr.number})
    assert data["data"]["repository"]["pullRequest"]["reviewThreads"]["nodes"][0]["isOutdated"] is True


def test_graphql_unknown_field_is_an_error(gh, world):
    with pytest.raises(GithubException) as excinfo:  # PyGithub raises on any GraphQL `errors`
        gh.requester.graphql_query("{ viewer { login nope } }", {})
    assert "data" not in excinfo.value.data
    assert excinfo.value.data["errors"][0]["message"] == "Field 'nope' doesn't exist on type 'Actor'"


# ----------------------------------------------------------------------------- checks


def _annotations(count: int) -> list[dict]:
    return [
        {"path": "model.py", "start_line": 11, "end_line": 11, "annotation_level": "warning", "message": f"issue {i}"}
        for i in range(count)
    ]


def test_check_run_annotations_accumulate_and_cap_at_50(world, repo, gh):
    state, _, _, pr = world
    run = repo.create_check_run(
        name="torchreview",
        head_sha=pr.head_sha,
        status="in_progress",
        output={"title": "Reviewing", "summary": "working", "annotations": _annotations(50)},
    )
    run.edit(conclusion="neutral", output={"title": "Done", "summary": "2 findings", "annotations": _annotations(3)})
    assert (run.status, run.conclusion, run.output.annotations_count) == ("completed", "neutral", 53)
    lazy_repo = gh.withLazy(True).get_repo("octo-org/models")  # lazy: no GET commits/{sha}
    assert [r.name for r in lazy_repo.get_commit(pr.head_sha).get_check_runs()] == ["torchreview"]
    assert len(state.check_runs_for(pr.head_sha)[0].annotations) == 53

    with pytest.raises(GithubException) as excinfo:
        run.edit(output={"title": "t", "summary": "s", "annotations": _annotations(51)})
    assert excinfo.value.status == 422
    with pytest.raises(GithubException) as excinfo:
        repo.create_check_run(name="x", head_sha=pr.head_sha, output={"title": "t", "summary": "s" * 65536})
    assert excinfo.value.status == 422


def test_check_run_for_unknown_sha_is_422(world, repo):
    with pytest.raises(GithubException) as excinfo:
        repo.create_check_run(name="x", head_sha="0" * 40)
    assert excinfo.value.status == 422


# ----------------------------------------------------------------------------- issue comments


def test_issue_comment_reaction_and_edit(world, repo):
    state, _, _, pr = world
    state.add_issue_comment(pr, "@torchreview review please", user="alice")
    pull = repo.get_pull(pr.number)
    human = list(pull.get_issue_comments())[0]
    assert human.user.login == "alice"
    assert human.create_reaction("eyes").content == "eyes"
    mine = pull.create_issue_comment("Working on it")
    mine.edit("Done")
    assert [c.body for c in state.issue_comments_for(pr)] == ["@torchreview review please", "Done"]


# ----------------------------------------------------------------------------- faults & rate limits


def test_502_is_retried_then_succeeds(world, repo):
    state, _, _, pr = world
    state.faults.fail("GET", f"/repos/octo-org/models/pulls/{pr.number}", status=502, times=1)
    assert repo.get_pull(pr.number).number == pr.number
    statuses = [r.status for r in state.requests_matching("GET", f"/repos/octo-org/models/pulls/{pr.number}")]
    assert statuses == [502, 200]


def test_secondary_rate_limit_with_retry_after(world, repo):
    state, _, _, pr = world
    state.faults.secondary_rate_limit("POST", "/repos/*/issues/*/comments", times=1, retry_after=1)
    started = time.monotonic()
    repo.get_pull(pr.number).create_issue_comment("hello")
    assert time.monotonic() - started >= 1.0  # PyGithub honoured Retry-After
    statuses = [r.status for r in state.requests_matching("POST", "/repos/*/issues/*/comments")]
    assert statuses == [403, 201]


def test_secondary_rate_limit_without_retries_raises(world, app_key):
    state, emulator, installation, pr = world
    client = integration(emulator, app_key[0], retry=None).get_github_for_installation(installation.id)
    pull = client.get_repo("octo-org/models").get_pull(pr.number)
    state.faults.secondary_rate_limit("GET", "*/files", times=1)
    with pytest.raises(RateLimitExceededException) as excinfo:
        list(pull.get_files())
    assert excinfo.value.headers["retry-after"] == "1"
    state.faults.too_many_requests("GET", "*/files", times=1)
    with pytest.raises(GithubException) as excinfo:
        list(pull.get_files())
    assert excinfo.value.status == 429


def test_primary_rate_limit_exhausted(world, app_key):
    state, emulator, installation, pr = world
    client = integration(emulator, app_key[0], retry=None).get_github_for_installation(installation.id)
    repo = client.get_repo("octo-org/models")
    bucket = state.rate_limit_bucket(f"installation:{installation.id}")
    bucket.used = bucket.limit
    with pytest.raises(RateLimitExceededException) as excinfo:
        repo.get_pull(pr.number)
    assert excinfo.value.headers["x-ratelimit-remaining"] == "0"


def test_rate_limit_headers_and_endpoint(world, repo, gh):
    state, _, installation, _ = world
    limit = gh.get_rate_limit().resources.core
    bucket = state.rate_limit_bucket(f"installation:{installation.id}")
    assert limit.remaining == bucket.remaining < 5000
    assert gh.rate_limiting[0] == bucket.remaining


# ----------------------------------------------------------------------------- plumbing


def test_every_described_operation_is_routed():
    described = {op["operationId"] for op in operations_index()}
    routed = {route.operation_id for route in ROUTES if route.operation_id}
    assert routed == described and len(described) == len(contract.OPERATIONS) == 32


def test_missing_contract_names_the_command_that_fetches_it(monkeypatch, tmp_path):
    monkeypatch.setenv(CONTRACT_DIR_ENV, str(tmp_path))
    with pytest.raises(ContractError) as error:
        require("openapi/operations.json")
    assert FETCH_COMMAND in str(error.value) and CONTRACT_DIR_ENV in str(error.value)


def test_diff_details():
    diffs = {
        d.filename: d
        for d in diff_trees(
            {"a.txt": b"one\ntwo", "img.bin": b"\0\1", "old_name.py": b"x = 1\ny = 2\nz = 3\n"},
            {"a.txt": b"one\nthree", "img.bin": b"\0\2", "new_name.py": b"x = 1\ny = 2\nz = 3\n"},
        )
    }
    assert diffs["a.txt"].patch == (
        "@@ -1,2 +1,2 @@\n one\n-two\n\\ No newline at end of file\n+three\n\\ No newline at end of file"
    )
    assert diffs["img.bin"].patch is None and diffs["img.bin"].changes == 0
    assert diffs["new_name.py"].status == "renamed" and diffs["new_name.py"].previous_filename == "old_name.py"


def test_pull_request_from_a_fork(world, repo):
    state, _, _, _ = world
    fork = state.fork("octo-org/models", owner="mallory")
    pr = state.open_pull_request("octo-org/models", {"train.py": "import os\n"}, head_repo=fork, user="mallory")
    pull = repo.get_pull(pr.number)
    assert pull.head.repo.full_name == "mallory/models" and pull.head.repo.fork
    assert [f.filename for f in pull.get_files()] == ["train.py"]
    assert repo.get_contents("train.py", ref=f"refs/pull/{pr.number}/head").decoded_content == b"import os\n"
    new_head = state.push(pr, {"train.py": "import sys\n"})
    assert repo.get_pull(pr.number).head.sha == new_head
