"""The base branch's configuration is asked of GitHub once per base commit, not once per job."""
from __future__ import annotations

import pytest

from analyzers.config import ConfigError
from bot.github_client import GitHubClients
from bot.pipeline import load_base_config
from bot.settings import Settings
from bot.store import SqliteStore
from tests.conftest import WEBHOOK_SECRET, new_repo


@pytest.fixture
def setup(emulator, app_key, tmp_path):
    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret=WEBHOOK_SECRET, api_url=emulator.url,
                        data_dir=tmp_path / "data", github_write_interval=0)
    gh = GitHubClients(settings).for_installation(1)
    return emulator.state, gh, SqliteStore(tmp_path / "state.sqlite")


def contents_requests(state, name: str) -> int:
    return len(state.requests_matching("GET", f"/repos/{name}/contents/*"))


@pytest.mark.parametrize("files, fail_on", [
    ({}, "high"),  # no configuration: every candidate file is asked for, then nothing more
    ({".github/torchreview.yml": "fail_on: medium\n"}, "medium"),
    ({"pyproject.toml": "[project]\nname = 'x'\n", ".torchreview.toml": "fail_on = 'low'\n"}, "low"),
])
def test_a_second_job_on_the_same_base_asks_github_nothing(setup, files, fail_on):
    state, gh, store = setup
    repo, name = new_repo(state, {}, files)
    remote = gh.get_repo(name)
    base = repo.branches[repo.default_branch]
    first = load_base_config(remote, base, store)
    asked = contents_requests(state, name)
    assert asked >= 1 and first.fail_on.name.lower() == fail_on
    again = load_base_config(remote, base, store)
    assert contents_requests(state, name) == asked and again == first
    assert load_base_config(remote, base) == first  # without a store: asked again, same answer
    assert contents_requests(state, name) == 2 * asked


def test_an_invalid_configuration_is_not_remembered(setup):
    state, gh, store = setup
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "fail_on: sometimes\n"})
    remote = gh.get_repo(name)
    base = repo.branches[repo.default_branch]
    for _ in range(2):
        with pytest.raises(ConfigError):
            load_base_config(remote, base, store)
    assert contents_requests(state, name) == 2
