"""The App on a pull request that adds checkpoint files: each is scanned (analyzers.pickles) from a temporary
copy, and its findings, which cannot be inline comments on a binary file, are in the summary and check run."""
from __future__ import annotations

import io
import os

import torch

from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for


class RunsShell:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_checkpoints_a_pull_request_adds_are_scanned(stack):
    state = stack["state"]
    repo, name = new_repo(state, {})
    clean = _saved(torch.nn.Linear(3, 2).state_dict())
    pr = state.open_pull_request(repo, {"weights/model.pt": _saved({"hook": RunsShell()}),
                                        "weights/clean.pt": clean,
                                        "train.py": "import torch\nx = torch.ones(2)\n"}, user="alice")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "failure"
    text = run.output_summary + (run.output_text or "")
    assert "TR620" in text and "weights/model.pt" in text and "system" in text
    assert all(c.path.endswith(".py") for c in state.review_comments_for(pr))  # no comment on a binary file
    [annotation] = [a for a in run.annotations if a["path"] == "weights/model.pt"]
    assert annotation["start_line"] == 1 and annotation["annotation_level"] == "failure"
    assert not [a for a in run.annotations if a["path"] == "weights/clean.pt"]

    # The author replaces it with a clean checkpoint: the check passes.
    new_head = state.push(pr, {"weights/model.pt": clean})
    assert deliver(stack, "pull_request", pr_payload("synchronize", name, pr)).status_code == 202
    assert completed_run(state, new_head).conclusion == "success"
