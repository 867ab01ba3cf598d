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


def _installation_repo(emulator, app_key, name: str):
    from bot.github_client import GitHubClients
    from bot.settings import Settings

    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret="unused", api_url=emulator.url)
    return GitHubClients(settings).for_installation(1, name).get_repo(name)


def test_a_checkpoint_is_streamed_to_disk_never_held_as_base64(emulator, app_key, tmp_path):
    """GitHub's raw media type for blobs, through the job's own scoped token: the bytes land in the file as they
    arrive; past the reader's budget the partial copy is removed; an unknown blob is None, not an error."""
    from bot.github_client import BlobTooLarge, stream_blob
    from github_emulator.diffing import blob_sha

    state = emulator.state
    payload = _saved(torch.nn.Linear(64, 64).state_dict())
    _repo, name = new_repo(state, {}, extra_base={"weights/head.pt": payload})
    repo = _installation_repo(emulator, app_key, name)
    into = tmp_path / "head.pt"
    assert stream_blob(repo, blob_sha(payload), into, max_bytes=len(payload)) == len(payload)
    assert into.read_bytes() == payload
    # the JSON form (PyGithub's own call) is unchanged: the raw answer needs the raw media type
    assert repo.get_git_blob(blob_sha(payload)).encoding == "base64"

    over = tmp_path / "over.pt"
    try:
        stream_blob(repo, blob_sha(payload), over, max_bytes=len(payload) - 1)
    except BlobTooLarge:
        pass
    else:
        raise AssertionError("a blob past its budget was accepted")
    assert not over.exists()
    assert stream_blob(repo, "0" * 40, tmp_path / "missing.pt", max_bytes=1 << 20) is None


def test_a_checkpoint_past_the_review_budget_is_listed_not_scanned(emulator, app_key):
    """What the review has left of its checkpoint budget bounds the download itself: the file is reported as
    skipped with the reason, and nothing of it stays in the review's scratch directory."""
    from analyzers.config import Config
    from bot import pipeline

    state = emulator.state
    payload = _saved(torch.nn.Linear(64, 64).state_dict())
    _repo, name = new_repo(state, {})
    pr = state.open_pull_request(_repo, {"weights/a.pt": payload}, user="alice")
    repo = _installation_repo(emulator, app_key, name)
    [changed_file] = list(repo.get_pull(pr.number).get_files())
    changed = pipeline.ChangedFiles()
    try:
        spent = pipeline.MAX_REVIEW_CHECKPOINT_BYTES - len(payload) + 1
        assert pipeline._collect_checkpoint(repo, changed_file, pr.head_sha, Config(), changed, spent) == 0
        [note] = changed.notes
        assert note.path == "weights/a.pt" and note.kind == "skipped" and "budget" in note.message
        assert not changed.checkpoints and not list(changed.scratch.iterdir())

        assert pipeline._collect_checkpoint(repo, changed_file, pr.head_sha, Config(), changed, 0) == len(payload)
        assert changed.checkpoints["weights/a.pt"].read_bytes() == payload
    finally:
        changed.close()
