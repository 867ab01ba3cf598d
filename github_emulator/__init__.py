"""A small, stateful GitHub REST (+ a bit of GraphQL) emulator for tests and demos.

    state = EmulatorState(app_public_key_pem=public_pem)
    installation = state.add_installation("octo-org")
    repo = state.add_repo("octo-org/models", files={"train.py": "..."})
    pr = state.open_pull_request(repo, {"train.py": "..."})
    with serve(state) as emulator:
        gh = github.Github(base_url=emulator.url, auth=...)
"""

from importlib import import_module

# Imported on first use, so `python -m github_emulator.contract` (which fetches the data the app needs) runs
# without loading the app, and without runpy's warning about a module imported twice.
_EXPORTS = {"RunningEmulator": "app", "create_app": "app", "serve": "app", "generate_app_key": "auth",
            "EmulatorState": "state"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EmulatorState",
    "RunningEmulator",
    "create_app",
    "generate_app_key",
    "serve",
]
