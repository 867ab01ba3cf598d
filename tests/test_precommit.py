"""The pre-commit hook, run by the real pre-commit against a commit of this checkout (marker: packaging).

pre-commit clones the hook repository at ``rev`` and pip-installs it into an environment of its own,
so this needs the package index (or a pip cache) for torchreview's dependencies; torch is not one.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.packaging

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


def _git(*args, cwd):
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def snapshot_of_checkout(dest: Path) -> str:
    """Commit the checkout as it is now (uncommitted edits included) into a fresh repository at ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():  # a file deleted in the working tree is still listed as cached
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    _git("init", "-q", cwd=dest)
    _git("add", "-A", cwd=dest)
    _git("commit", "-q", "-m", "snapshot", cwd=dest)
    return _git("rev-parse", "HEAD", cwd=dest)


def _notebook(source: str) -> str:
    return json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                  "source": source}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_pre_commit_hook_fails_on_bugs_and_passes_when_fixed(tmp_path):
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).with_name("pre-commit"))
    if not Path(pre_commit).exists():
        pytest.fail("pre-commit is not installed; it is in the dev extra (pip install -e '.[dev]')")
    hook_repo = tmp_path / "hook"
    hook_repo.mkdir()
    rev = snapshot_of_checkout(hook_repo)
    project = tmp_path / "project"
    project.mkdir()
    _git("init", "-q", cwd=project)
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {hook_repo}\n  rev: {rev}\n  hooks:\n  - id: torchreview\n")
    # TR810 (a removed API): a stable rule at high, so the default hook fails on it
    (project / "train.py").write_text("import torch\nstate = torch.symeig(a)\n")
    (project / "explore.ipynb").write_text(_notebook("import torch\nx = 1\n"))
    (project / "notes.txt").write_text("import torch\ntorch.load('model.pt')\n")  # not Python: not checked

    # no PYTHONPATH: the hook must run the torchreview pre-commit installed, not this checkout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"), NO_COLOR="1")

    def run_hooks():
        _git("add", "-A", cwd=project)  # --all-files means every tracked file
        return subprocess.run([pre_commit, "run", "--all-files"], cwd=project, env=env, capture_output=True,
                              text=True, timeout=900)

    first = run_hooks()
    assert first.returncode == 1, first.stdout + first.stderr
    # pre-commit installed the base package only: none of the App's server stack, no IPython, no torch
    (hook_python,) = (tmp_path / "pre-commit-home").glob("repo*/py_env-*/bin/python")
    listed = subprocess.run([str(hook_python), "-m", "pip", "list", "--format", "json"], env=env,
                            capture_output=True, text=True, check=True)
    names = {re.sub(r"[-_.]+", "-", p["name"]).lower() for p in json.loads(listed.stdout)}
    assert "torchreview" in names
    assert not names & {"flask", "celery", "gunicorn", "sqlalchemy", "pygithub", "redis", "ipython", "torch"}
    assert "TR810" in first.stdout and "train.py" in first.stdout
    assert "notes.txt" not in first.stdout and "explore.ipynb" not in first.stdout

    # types_or: [python, jupyter]: a notebook is checked too
    (project / "train.py").write_text("import torch\nstate = torch.linalg.eigh(a)\n")
    (project / "explore.ipynb").write_text(_notebook("import torch\nstate = torch.symeig(a)\n"))
    second = run_hooks()
    assert second.returncode == 1, second.stdout + second.stderr
    assert "explore.ipynb" in second.stdout and "train.py" not in second.stdout

    (project / "explore.ipynb").write_text(_notebook("import torch\nstate = torch.linalg.eigh(a)\n"))
    third = run_hooks()
    assert third.returncode == 0, third.stdout + third.stderr
    assert "torchreview" in third.stdout and "Passed" in third.stdout

    # a rule caught in a loop (tests/fixtures/stalling_rule, imported at start-up from PYTHONPATH by the hook's
    # own interpreter) costs the commit one file at the configured limit, never a hung `git commit`
    from tests.test_bounded_analysis import STALL, STALLING_RULE

    (project / "slow.py").write_text(STALL)
    (project / ".torchreview.toml").write_text("preview = true\nfile_timeout = 2\n")  # TR999 is unmeasured: preview
    env["PYTHONPATH"] = str(STALLING_RULE)
    stalled = run_hooks()
    assert stalled.returncode == 1, stalled.stdout + stalled.stderr
    assert "slow.py [timeout] analysis took over 2 s; stopped" in stalled.stdout
