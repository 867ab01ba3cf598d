"""Which lines a change added or modified: the filter the CLI's ``--diff`` and the bot share."""
from __future__ import annotations

import os
import subprocess
from typing import Iterable, Mapping, Optional

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from analyzers.model import Finding
from analyzers.pickles import is_checkpoint

# path -> added/modified line numbers in the new file; None means "the whole file" (new notebook,
# or a file whose diff has no line information)
ChangedLines = dict[str, Optional[set[int]]]


class DiffError(RuntimeError):
    pass


def changed_lines_from_patch(patch_text: str) -> ChangedLines:
    """Parse a unified diff (``git diff`` output) into the new-side lines each file adds."""
    try:
        patch = PatchSet(patch_text)
    except UnidiffParseError as exc:
        raise DiffError(f"unreadable diff: {exc}") from None
    changed: ChangedLines = {}
    for patched in patch:
        if patched.is_removed_file:
            continue
        path = patched.path
        if is_checkpoint(path):  # scanned whole (analyzers.pickles): any change is a change of the file
            changed[path] = None
            continue
        if patched.is_binary_file:
            continue
        lines = {line.target_line_no for hunk in patched for line in hunk if line.is_added}
        changed[path] = None if path.endswith(".ipynb") else lines
    return changed


def git_changed_lines(ref: str, cwd: Optional[str] = None) -> ChangedLines:
    """Lines changed in the working tree since ``ref`` (committed or not), plus untracked files."""
    try:
        inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=cwd, capture_output=True, text=True)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            raise DiffError(f"--diff needs a git repository: {os.path.abspath(cwd or os.curdir)} is not inside one")
        diff = _git(["diff", "--no-color", "--no-ext-diff", "-U0", "--relative", ref, "--"], cwd)
        untracked = _git(["ls-files", "--others", "--exclude-standard"], cwd)
    except FileNotFoundError:
        raise DiffError("--diff needs git, which is not installed") from None
    changed = changed_lines_from_patch(diff) if diff.strip() else {}
    for path in untracked.splitlines():
        if path.endswith((".py", ".ipynb")) or is_checkpoint(path):
            changed[path] = None
    return changed


def _git(args: list[str], cwd: Optional[str]) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DiffError(f"git {' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def keep_changed(findings: Iterable[Finding], changed: Mapping[str, Optional[set[int]]]) -> list[Finding]:
    """Findings whose reported range touches a changed line of a changed file."""
    kept = []
    for finding in findings:
        path = finding.path[2:] if finding.path.startswith("./") else finding.path
        if path not in changed:
            continue
        lines = changed[path]
        if lines is None or any(n in lines for n in range(finding.line, finding.end_line + 1)):
            kept.append(finding)
    return kept


def keep_introduced(findings: Iterable[Finding], changed: Mapping[str, Optional[set[int]]], ref: str,
                    config, cwd: Optional[str] = None) -> list[Finding]:
    """Findings of changed files that the file at ``ref`` did not have (the App's ``introduced`` filter):
    a deleted ``zero_grad()`` counts though its finding sits on an untouched line; what ``ref`` already
    had does not, even on a touched line."""
    from pathlib import Path

    from analyzers.engine import analyze_text_bounded
    from analyzers.fingerprint import fingerprints_for

    findings = [f for f in findings if _changed_path(f.path) in changed]
    # A changed checkpoint is scanned whole and has no lines to compare: all its findings count, and its
    # bytes are never read as text.
    checkpoints = [f for f in findings if is_checkpoint(f.path)]
    findings = [f for f in findings if not is_checkpoint(f.path)]
    heads: dict[str, str] = {}
    bases: dict[str, str] = {}
    for path in {f.path for f in findings}:
        try:
            heads[path] = Path(cwd or ".", path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        shown = subprocess.run(["git", "show", f"{ref}:./{_changed_path(path)}"], cwd=cwd, capture_output=True)
        if shown.returncode == 0:  # else the file is new since ref: everything in it is introduced
            bases[path] = shown.stdout.decode("utf-8", errors="replace")
    # bounded like the head's analysis; a base that cannot be analyzed shows nothing it already had
    base_findings = [f for path, text in bases.items() for f in analyze_text_bounded(text, path, config).findings]
    before = set(fingerprints_for(base_findings, bases).values())
    now = fingerprints_for(findings, heads)
    return [f for f in findings if now.get(f) not in before] + checkpoints


def _changed_path(path: str) -> str:
    return path[2:] if path.startswith("./") else path
