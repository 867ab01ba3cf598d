"""The GitHub Action's logic (action.yml runs ``torchreview-action``): check what a pull request changed.

Inputs come as ``INPUT_*`` environment variables (action.yml maps them), the event from
``GITHUB_EVENT_PATH``. On a pull request only the changed Python files and notebooks are analyzed and
only findings on changed lines are reported (``torchreview check --diff BASE``), as the App does; on a
push, the lines since the previous head; otherwise every file under ``paths``. The SARIF goes to
``sarif-file`` for ``github/codeql-action/upload-sarif``, the annotations to stdout, the counts to
``GITHUB_OUTPUT``. Exit status: torchreview's (1 at or above ``fail-on``; 0 with ``fail-on: never``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from analyzers.pickles import is_checkpoint

SEVERITIES = ("low", "medium", "high", "critical")
NULL_SHA = "0" * 40


class ActionError(Exception):
    pass


def _input(name: str, default: str = "") -> str:
    # action.yml passes INPUT_FAIL_ON (a dash is no shell name); GitHub's own convention keeps it: INPUT_FAIL-ON
    value = os.environ.get(f"INPUT_{name.upper().replace('-', '_')}") or os.environ.get(f"INPUT_{name.upper()}")
    return (value or "").strip() or default


def base_from_event(event_name: str, payload: dict) -> Optional[str]:
    """The commit to diff against: the PR's base, the push's previous head; None: check every file."""
    if event_name in ("pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment"):
        return (payload.get("pull_request") or {}).get("base", {}).get("sha")
    if event_name == "merge_group":
        return (payload.get("merge_group") or {}).get("base_sha")
    if event_name == "push":
        before = payload.get("before")
        return before if before and before != NULL_SHA else None  # a new branch: no previous head
    return None


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def ensure_commit(sha: str) -> None:
    """actions/checkout fetches one commit by default: fetch the base too, when it is missing."""
    if _git("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0:
        return
    fetched = _git("fetch", "--no-tags", "--depth=1", "origin", sha)
    if fetched.returncode != 0 or _git("cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
        raise ActionError(f"the base commit {sha} is not in the checkout and could not be fetched "
                          f"({fetched.stderr.strip() or 'unknown error'}); use actions/checkout with fetch-depth: 0")


def changed_files(base: str, paths: list[str]) -> list[str]:
    """Python files, notebooks and checkpoint files that differ from ``base`` in the working tree (deleted ones
    aside)."""
    proc = _git("diff", "--name-only", "-z", "--no-renames", "--diff-filter=d", "--relative", base, "--")
    if proc.returncode != 0:
        raise ActionError(f"git diff {base} failed: {proc.stderr.strip()}")
    roots = [Path(p).as_posix().strip("/") for p in paths]
    out = []
    for name in filter(None, proc.stdout.split("\0")):
        if not (name.endswith((".py", ".ipynb")) or is_checkpoint(name)) or not Path(name).is_file():
            continue
        if any(root in ("", ".") or name == root or name.startswith(root + "/") for root in roots):
            out.append(name)
    return sorted(out)


def _check(arguments: list[str], stdout) -> int:
    """``torchreview check`` in this process: ``python -m`` would import a ``bot`` package of the
    repository being checked (the working directory comes first on sys.path)."""
    from contextlib import redirect_stdout

    from bot.cli import main as cli

    with redirect_stdout(stdout):
        code = cli(["check", *arguments])
    stdout.flush()
    return code


def _empty_sarif() -> dict:
    from analyzers.engine import RunResult
    from analyzers.output import to_sarif

    return to_sarif(RunResult())


def _write_outputs(values: dict) -> None:
    target = os.environ.get("GITHUB_OUTPUT")
    if not target:
        return
    with open(target, "a", encoding="utf-8") as out:
        for key, value in values.items():
            out.write(f"{key}={value}\n")


def _summary(text: str) -> None:
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(text + "\n")


def run() -> int:
    fail_on = _input("fail-on").lower()  # empty: the configuration's fail_on (default high)
    if fail_on not in ("", *SEVERITIES, "never"):
        raise ActionError(f"fail-on: {fail_on!r} is not one of {', '.join(SEVERITIES)}, never")
    sarif_path = Path(_input("sarif-file", "torchreview.sarif"))
    paths = _input("paths", ".").split()
    config = _input("config")
    event_name = os.environ.get("GITHUB_EVENT_NAME", "")
    payload: dict = {}
    if os.environ.get("GITHUB_EVENT_PATH"):
        payload = json.loads(Path(os.environ["GITHUB_EVENT_PATH"]).read_text(encoding="utf-8"))
    base = _input("base") or base_from_event(event_name, payload)

    options = ["--color", "never"]
    if fail_on in SEVERITIES:
        options += ["--fail-on", fail_on]
    if config:
        options += ["--config", config]
    if base:
        ensure_commit(base)
        targets = changed_files(base, paths)
        options += ["--diff", base]
        scope = f"{len(targets)} changed file{'s' if len(targets) != 1 else ''} since {base[:12]}"
    else:
        targets = paths
        scope = " ".join(paths)
    sarif_path.parent.mkdir(parents=True, exist_ok=True)
    if base and not targets:
        sarif_path.write_text(json.dumps(_empty_sarif(), indent=2) + "\n", encoding="utf-8")
        _write_outputs({"sarif-file": sarif_path.as_posix(), "findings": 0, "base": base})
        _summary(f"torchreview: no Python files or notebooks changed since {base[:12]}")
        print(f"torchreview: no Python files or notebooks changed since {base[:12]}")
        return 0
    # two runs of the CLI, one per format: the SARIF for code scanning, the annotations for this log
    with sarif_path.open("w", encoding="utf-8") as sarif_out:
        code = _check([*targets, *options, "--format", "sarif"], sarif_out)
    if code not in (0, 1):
        raise ActionError(f"torchreview check failed (exit {code}); see the error above")
    code = _check([*targets, *options, "--format", "github"], sys.stdout)
    results = json.loads(sarif_path.read_text(encoding="utf-8"))["runs"][0]["results"]
    _write_outputs({"sarif-file": sarif_path.as_posix(), "findings": len(results), "base": base or ""})
    _summary(f"torchreview: {len(results)} finding{'s' if len(results) != 1 else ''} in {scope}")
    print(f"torchreview: {len(results)} finding{'s' if len(results) != 1 else ''} in {scope}; SARIF in {sarif_path}")
    return 0 if fail_on == "never" else code


def main() -> int:
    try:
        return run()
    except ActionError as exc:
        print(f"::error title=torchreview::{exc}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
