"""Job descriptions (bot.jobs): what goes on the queue comes back the same, and bot/ has no import circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bot.jobs import CommandJob, ReviewJob, SmokeJob, job_from_dict

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("job", [
    ReviewJob(installation_id=1, repository="o/r", pull_number=2, head_sha="a" * 40, reason="pull_request.opened",
              delivery="d1", pr_updated_at="2026-01-01T10:00:00Z"),
    CommandJob(installation_id=1, repository="o/r", pull_number=2, delivery="d2", comment_id=9,
               command="/review smoke", requested_by="x", comment_created_at="2026-01-01T10:00:00Z",
               head_sha="b" * 40),
    SmokeJob(installation_id=1, repository="o/r", pull_number=2, head_sha="c" * 40, reason="command.smoke",
             delivery="d3", requested_by="x", comment_id=9),
])
def test_jobs_survive_the_queue(job):
    assert job_from_dict(job.to_dict()) == job


def test_jobs_queued_before_kinds_still_load():
    legacy = {"installation_id": 1, "repository": "o/r", "pull_number": 2, "head_sha": "c" * 40, "delivery": "d",
              "requested_by": None, "comment_id": None, "author_association": None, "command": None}
    assert isinstance(job_from_dict({**legacy, "reason": "smoke.auto"}), SmokeJob)
    assert isinstance(job_from_dict({**legacy, "reason": "pull_request.opened"}), ReviewJob)
    command = job_from_dict({**legacy, "reason": "command", "head_sha": None, "command": "/review smoke"})
    assert isinstance(command, CommandJob) and command.head_sha is None  # unpinned: the worker asks for a sha


def test_a_smoke_job_always_names_its_commit():
    with pytest.raises(ValueError):
        SmokeJob(installation_id=1, repository="o/r", pull_number=2, head_sha="", reason="smoke.auto", delivery="d")


def _bot_imports() -> dict[str, set[str]]:
    """Every import of a bot module by a bot module, at module level or inside functions."""
    graph = {}
    for path in sorted((ROOT / "bot").glob("*.py")):
        name = f"bot.{path.stem}"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "bot":
                deps.update(f"bot.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bot."):
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith("bot."))
        graph[name] = deps - {name}
    return graph


def test_bot_has_no_import_circle():
    graph = _bot_imports()
    assert "bot.tasks" not in graph["bot.webhook"] and "bot.tasks" not in graph["bot.pipeline"]
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in graph.get(node, ()):
            assert state.get(dep) != "open", " -> ".join(path + [dep])
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
