"""The /review command layer: parsing and reply text, then its GitHub calls (PyGithub, lazy client,
as the worker builds it) against the served emulator."""
from __future__ import annotations

import github
import pytest

from analyzers.config import Config, parse_toml_config
from bot import commands
from bot.commands import REPLY_MARKER, USAGE, Command, parse_command
from github_emulator import EmulatorState, generate_app_key, serve
from bot.github_client import GitHubClients
from bot.settings import Settings
from tests.markdown_render import render

# ------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("body, expected", [
    ("/review", Command("review", (), "/review")),
    ("/Review", Command("review", (), "/Review")),
    ("/REVIEW\n", Command("review", (), "/REVIEW")),
    ("  /review  ", Command("review", (), "/review")),
    ("/review   smoke", Command("smoke", (), "/review   smoke")),
    ("/review Smoke", Command("smoke", (), "/review Smoke")),
    ("/review\tsmoke now", Command("smoke", ("now",), "/review\tsmoke now")),
    ("/review config", Command("config", (), "/review config")),
    ("/review help", Command("help", (), "/review help")),
    ("/review frobnicate", Command("unknown", ("frobnicate",), "/review frobnicate")),
    ("/review frobnicate all the things", Command("unknown", ("frobnicate", "all", "the", "things"),
                                                  "/review frobnicate all the things")),
    ("/review\r\nplease look again, I rebased\r\n", Command("review", (), "/review")),
    ("/review smoke\n\nThe CUDA path changed, see above.", Command("smoke", (), "/review smoke")),
    ("\n\n   \n/review config\n", Command("config", (), "/review config")),
    # a reply quoting someone, then the command
    ("> can someone re-run this?\n\n/review", Command("review", (), "/review")),
])
def test_parse_commands(body, expected):
    assert parse_command(body) == expected


@pytest.mark.parametrize("body", [
    "", None, "   \n\n",
    "/reviewer", "/reviewer smoke", "/review-please", "/review.", "/reviews",
    "please /review", "LGTM\n/review",
    "> /review", ">/review smoke", "> > /review",
    "> can someone re-run this?\n/review",  # lazy continuation: still part of the quote
    "```\n/review\n```", "~~~text\n/review\n~~~", "````\n```\n/review\n```\n````",
    "    /review",  # indented code
    "review", "\\/review", "`/review`",
])
def test_not_commands(body):
    assert parse_command(body) is None


def test_text_after_a_fence_is_still_read():
    assert parse_command("> quoted\n```\nlog\n```\n/review smoke") == Command("smoke", (), "/review smoke")
    assert parse_command("```\ntrace\n```\n/review") == Command("review", (), "/review")
    assert parse_command("```\n/review\n") is None  # unclosed fence: all code


# ------------------------------------------------------------------------------- reply text


def test_usage_lists_the_commands_and_who_may_run_them():
    for command in ("`/review`", "`/review smoke`", "`/review config`", "`/review help`"):
        assert command in USAGE
    assert "write access" in USAGE
    assert commands.help_reply() == USAGE


@pytest.mark.parametrize("body, expected", [
    ("/review smoke", (None, None)),
    ("/review smoke 0123abc", ("0123abc", None)),
    ("/review smoke 0123ABCDEF0123abcdef0123abcdef0123abcdef", ("0123abcdef0123abcdef0123abcdef0123abcdef", None)),
])
def test_smoke_sha_argument(body, expected):
    assert commands.smoke_sha_argument(parse_command(body)) == expected


@pytest.mark.parametrize("body", ["/review smoke 0123ab", "/review smoke main", "/review smoke abc1234 now",
                                  "/review smoke `@everyone`\n# x"])
def test_smoke_sha_argument_problems_are_mention_safe(body):
    sha, problem = commands.smoke_sha_argument(parse_command(body))
    assert sha is None and "7 to 40 hex" in problem
    assert "\n" not in problem and problem.count("`") % 2 == 0


def test_smoke_replies_name_the_command_to_run():
    head = "a" * 40
    assert f"`/review smoke {head}`" in commands.smoke_head_moved_reply("b" * 40, head)
    assert f"`/review smoke {head}`" in commands.smoke_unknown_head_reply(head)
    rendered = render(commands.smoke_not_in_pr_reply("`@x`"))  # in a code span: no mention
    assert rendered.code[0] == "`@x`" and not rendered.mentions


def test_unknown_reply_names_the_word_safely_and_shows_usage():
    text = commands.unknown_reply(parse_command("/review `@octocat`"))
    first = render(text.split("\n\n", 1)[0])
    assert first.text == "I don't know the command /review `@octocat`." and first.code == ["/review `@octocat`"]
    assert not first.mentions  # inside a code span
    assert text.endswith(USAGE)


def _block(text: str, lang: str) -> str:
    return text.split(f"```{lang}\n", 1)[1].split("\n```", 1)[0]


def test_config_reply_defaults_as_yaml():
    yaml = pytest.importorskip("yaml")
    config = Config()
    text = commands.config_reply(config, "main", "abc1234def5678")
    assert "No torchreview configuration was found on the base branch `main` at `abc1234`" in text
    assert "defaults" in text and "abc1234d" not in text
    assert yaml.safe_load(_block(text, "yaml")) == config.to_dict()


@pytest.mark.parametrize("filename, text", [
    (".torchreview.toml", 'fail_on = "low"\nmax_inline_comments = 5\n'),
    ("pyproject.toml", '[project]\nname = "x"\n\n[tool.torchreview]\nfail_on = "low"\n'),
])
def test_config_reply_from_a_toml_file_renders_valid_toml(filename, text):
    import tomllib

    config = parse_toml_config(text, filename)
    reply = commands.config_reply(config, "release/2.5", "0123456789abcdef")
    assert f"Read from `{config.source}` on the base branch `release/2.5` at `0123456`." in reply
    assert tomllib.loads(_block(reply, "toml")) == config.to_dict()


def test_toml_and_yaml_rendering_of_nested_values():
    import tomllib

    yaml = pytest.importorskip("yaml")
    data = {"select": ["ALL"], "empty": [], "none": {}, "n": 3, "on": True, "weird key": "a \"quoted\" `x`",
            "smoke": {"enabled": False, "targets": ["a.py"], "regression": {"step_time": 0.25}},
            "severity": {"TR702": "medium"}}
    assert tomllib.loads(commands._to_toml(data)) == data
    assert yaml.safe_load(commands._to_yaml(data)) == data


def test_config_reply_yaml_source_renders_yaml():
    yaml = pytest.importorskip("yaml")

    class YamlConfig:
        source = ".github/torchreview.yml"

        def to_dict(self):
            return {"select": ["ALL"], "severity": {"TR702": "medium"}, "smoke": {"enabled": True, "gpu": None},
                    "max_inline_comments": 5, "note": "yes: no"}

    text = commands.config_reply(YamlConfig(), "main", "abc1234")
    assert "Read from `.github/torchreview.yml` on the base branch `main` at `abc1234`." in text
    assert yaml.safe_load(_block(text, "yaml")) == YamlConfig().to_dict()


def test_own_reply_detection():
    assert commands.is_own_reply("done\n\n" + REPLY_MARKER)
    assert not commands.is_own_reply("/review")
    assert not commands.is_own_reply(None)


# ------------------------------------------------------------------------------- against the emulator


@pytest.fixture(scope="module")
def world():
    private, public = generate_app_key()
    state = EmulatorState(app_public_key_pem=public, app_id=4242)
    running = serve(state, check_responses=True)
    state.add_installation("octo-org", installation_id=1)
    repo = state.add_repo("octo-org/models", files={"train.py": "import torch\n"})
    state.add_collaborator(repo, "writer", "write")
    state.add_collaborator(repo, "maintainer", "maintain")
    state.add_collaborator(repo, "admin-person", "admin")
    state.add_collaborator(repo, "reader", "read")
    state.add_collaborator(repo, "triager", "triage")
    state.user("passer-by")  # a GitHub user with no role: permission "read" on a public repository
    pr = state.open_pull_request(repo, {"train.py": "import torch\nx = 1\n"}, user="contributor")
    settings = Settings(app_id=4242, private_key=private, webhook_secret="s", api_url=running.url,
                        github_write_interval=0)
    client = GitHubClients(settings).for_installation(1)
    yield {"state": state, "running": running, "repo": repo, "pr": pr, "gh": client,
           "gh_repo": client.get_repo("octo-org/models"), "private": private}
    assert running.app.config["RESPONSE_PROBLEMS"] == []
    running.shutdown()


@pytest.fixture
def expect_errors(world):
    """Statuses >= 400 a test expects; any other error response during the test fails it."""
    state = world["state"]
    start = len(state.requests)
    expected: list[tuple[str, str, int]] = []
    yield expected
    failed = [(r.method, r.path, r.status) for r in state.requests[start:] if r.status >= 400]
    assert failed == expected


def _new_requests(state, start):
    return [r for r in state.requests[start:] if not r.path.startswith("/app/")]


@pytest.mark.parametrize("login, allowed", [
    ("octo-org", True),        # the owner
    ("writer", True),
    ("maintainer", True),      # maintain reports as the legacy "write"
    ("admin-person", True),
    ("reader", False),
    ("triager", False),
    ("passer-by", False),      # "read"
    ("ghost-who-never-was", False),  # 404
])
def test_may_run_asks_for_the_permission(world, login, allowed, expect_errors):
    state = world["state"]
    start = len(state.requests)
    assert commands.may_run(world["gh_repo"], login, "NONE") is allowed
    made = _new_requests(state, start)
    assert [(r.method, r.path) for r in made] == [
        ("GET", f"/repos/octo-org/models/collaborators/{login}/permission")]
    expected_status = 404 if login == "ghost-who-never-was" else 200
    assert made[0].status == expected_status
    if expected_status == 404:
        expect_errors.append(("GET", made[0].path, 404))


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR", "member", "CONTRIBUTOR", "NONE", None])
def test_may_run_never_trusts_the_association(world, association, expect_errors):
    """An org member or collaborator with read access only is MEMBER / COLLABORATOR in the payload."""
    state = world["state"]
    start = len(state.requests)
    assert commands.may_run(world["gh_repo"], "writer", association) is True
    assert commands.may_run(world["gh_repo"], "reader", association) is False
    assert commands.may_run(world["gh_repo"], "triager", association) is False
    assert len(_new_requests(state, start)) == 3


@pytest.mark.parametrize("login, level", [
    ("octo-org", "admin"), ("admin-person", "admin"), ("maintainer", "maintain"), ("writer", "write"),
    ("triager", "triage"), ("reader", "read"), ("passer-by", "read"), ("ghost-who-never-was", "none"),
])
def test_permission_level_tells_maintain_from_write(world, login, level, expect_errors):
    assert commands.permission_level(world["gh_repo"], login) == level
    if level == "none":
        expect_errors.append(("GET", f"/repos/octo-org/models/collaborators/{login}/permission", 404))
    maintainer = commands.may_run(world["gh_repo"], login, allowed=commands.MAINTAINER_PERMISSIONS)
    assert maintainer is (level in ("admin", "maintain"))
    if level == "none":
        expect_errors.append(("GET", f"/repos/octo-org/models/collaborators/{login}/permission", 404))


def test_may_run_propagates_server_errors(world, expect_errors):
    state = world["state"]
    state.faults.fail("GET", "/repos/octo-org/models/collaborators/writer/permission", status=502, times=None)
    try:
        with pytest.raises(github.GithubException) as info:
            commands.may_run(world["gh_repo"], "writer", "NONE")
    finally:
        state.faults.clear()
    assert info.value.status == 502  # not a refusal: the job retries
    # a read is first retried in place (bot.github_client.server_error_retry): 1 + 3 attempts
    expect_errors.extend([("GET", "/repos/octo-org/models/collaborators/writer/permission", 502)] * 4)


def test_acknowledge_adds_eyes_once(world, expect_errors):
    state, pr = world["state"], world["pr"]
    comment = state.add_issue_comment(pr, "/review", "writer")
    start = len(state.requests)
    reaction = commands.acknowledge(world["gh_repo"], comment.id)
    assert reaction.content == "eyes"
    again = commands.acknowledge(world["gh_repo"], comment.id)  # a retried job
    assert again.id == reaction.id
    assert [(r.content, r.user.login) for r in comment.reactions] == [("eyes", "torchreview[bot]")]
    made = _new_requests(state, start)
    path = f"/repos/octo-org/models/issues/comments/{comment.id}/reactions"
    assert [(r.method, r.path, r.status) for r in made] == [("POST", path, 201), ("POST", path, 200)]


def test_reply_posts_a_marked_comment_without_fetching_the_issue(world, expect_errors):
    state, pr = world["state"], world["pr"]
    start = len(state.requests)
    posted = commands.reply(pr.number, world["gh_repo"], "Sorry `mallory`, not now.")
    assert posted.body.endswith(REPLY_MARKER)
    (mine,) = [c for c in state.issue_comments_for(pr) if c.id == posted.id]
    assert mine.user.login == "torchreview[bot]"
    assert mine.body.startswith("Sorry `mallory`") and mine.body.endswith("\n\n" + REPLY_MARKER)
    assert commands.is_own_reply(mine.body)
    made = _new_requests(state, start)
    assert [(r.method, r.path, r.status) for r in made] == [
        ("POST", f"/repos/octo-org/models/issues/{pr.number}/comments", 201)]


def test_reply_keeps_a_single_marker(world, expect_errors):
    posted = commands.reply(world["pr"].number, world["gh_repo"], "already marked\n\n" + REPLY_MARKER + "\n")
    assert posted.body.count(REPLY_MARKER) == 1 and posted.body.endswith(REPLY_MARKER)


def test_reply_with_dedupe_key_answers_once(world, expect_errors):
    state, pr = world["state"], world["pr"]
    command = state.add_issue_comment(pr, "/review help", "writer")
    start = len(state.requests)
    first = commands.reply(pr.number, world["gh_repo"], commands.help_reply(), dedupe_key=command.id)
    second = commands.reply(pr.number, world["gh_repo"], commands.help_reply(), dedupe_key=command.id)
    assert second.id == first.id
    replies = [c for c in state.issue_comments_for(pr) if f"reply-key {command.id} " in c.body]
    assert len(replies) == 1 and replies[0].body.endswith(REPLY_MARKER) and replies[0].body.startswith(USAGE)
    made = _new_requests(state, start)
    assert [r.method for r in made] == ["GET", "POST", "GET"]
    assert all(r.status < 400 for r in made)


def test_calls_work_with_a_non_lazy_client_too(world, expect_errors):
    """A client built without lazy=True still makes only the App's operations (no GET of issue/comment)."""
    state, pr = world["state"], world["pr"]
    auth = github.Auth.AppAuth(4242, world["private"]).get_installation_auth(1)
    gh = github.Github(base_url=world["running"].url, auth=auth, retry=None)
    repo = gh.get_repo("octo-org/models")  # GET /repos/{o}/{r}: not lazy
    comment = state.add_issue_comment(pr, "/review config", "writer")
    start = len(state.requests)
    commands.acknowledge(repo, comment.id)
    posted = commands.reply(pr.number, repo, "config here")
    assert posted.body.endswith(REPLY_MARKER)
    made = _new_requests(state, start)
    assert [(r.method, r.status) for r in made] == [("POST", 201), ("POST", 201)]
