"""A small, stateful GitHub REST (+ a bit of GraphQL) emulator for tests and demos.

    state = EmulatorState(app_public_key_pem=public_pem)
    installation = state.add_installation("octo-org")
    repo = state.add_repo("octo-org/models", files={"train.py": "..."})
    pr = state.open_pull_request(repo, {"train.py": "..."})
    with serve(state) as emulator:
        gh = github.Github(base_url=emulator.url, auth=...)
"""

from .app import RunningEmulator, create_app, serve
from .auth import generate_app_key
from .spec import SPEC_DIR_ENV, SpecNotFoundError, spec_dir
from .state import EmulatorState

__all__ = [
    "EmulatorState",
    "RunningEmulator",
    "SPEC_DIR_ENV",
    "SpecNotFoundError",
    "create_app",
    "generate_app_key",
    "serve",
    "spec_dir",
]
