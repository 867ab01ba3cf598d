"""Which lines a change added or modified: the filter the CLI's ``--diff`` and the bot share."""
from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping, Optional

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from analyzers.model import FileError, Finding
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
    had does not, even on a touched line. The file at ``ref`` is analyzed in the tree at ``ref`` (its other
    files, its pins), as the working tree's file is in the working tree: a finding that depends on another
    file or a pin is new only when the change made the difference, not because its file was edited."""
    from dataclasses import replace

    from analyzers.engine import analyze_text_bounded
    from analyzers.fingerprint import fingerprints_for
    from analyzers.program.modules import RepositoryIndex

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
    base_findings = []
    if bases:
        with tempfile.TemporaryDirectory(prefix="torchreview-base-") as scratch:
            top, prefix = tree_at(ref, Path(scratch), cwd)
            index = RepositoryIndex(top)
            for path, text in bases.items():
                # under its place in that tree (absolute: a relative path would name the working tree's file);
                # bounded like the head's analysis; a base that cannot be analyzed shows nothing it already had
                where = str(top / prefix / _changed_path(path))
                result = analyze_text_bounded(text, where, config, repository=index)
                base_findings += [replace(f, path=path) for f in result.findings]
    before = set(fingerprints_for(base_findings, bases).values())
    now = fingerprints_for(findings, heads)
    return [f for f in findings if now.get(f) not in before] + checkpoints


def tree_at(ref: str, into: Path, cwd: Optional[str] = None) -> tuple[Path, str]:
    """The code (``.py``) and requirement files of the repository at ``ref``, written under ``into``; returns
    the repository's root there and the working folder's place in it (``src/``, or "" at the top)."""
    from analyzers.program.versions import is_pin_file

    if ref.startswith("-"):
        raise DiffError(f"{ref!r} is not a git revision")  # never an option of git archive (--remote, --exec)
    top = _git(["rev-parse", "--show-toplevel"], cwd).strip()
    prefix = _git(["rev-parse", "--show-prefix"], cwd).strip()
    proc = subprocess.Popen(["git", "archive", "--format=tar", ref], cwd=top, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    unreadable: Optional[Exception] = None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            for member in archive:
                relative = PurePosixPath(member.name)
                if (not member.isreg() or relative.is_absolute() or ".." in relative.parts
                        or not (member.name.endswith(".py") or is_pin_file(member.name))):
                    continue  # regular files in the tree only; what the analysis reads of a repository
                target = Path(into, *relative.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.extractfile(member).read())
        # tarfile stops at the end-of-archive blocks, git pads the stream past them: read it to the end, or
        # git dies of SIGPIPE writing the padding (exit -13, no message) and a good archive looks failed
        while proc.stdout.read(1 << 16):
            pass
    except tarfile.TarError as exc:  # a stream cut short: git's own message says why (a missing object...)
        unreadable = exc
        proc.kill()
    except BaseException:
        proc.kill()
        raise
    finally:
        proc.stdout.close()
        error = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        status = proc.wait()
    if status != 0 or unreadable is not None:
        raise DiffError(f"git archive {ref} failed: {error.strip() or unreadable or f'exit status {status}'}")
    return Path(into), prefix


def keep_changed_files_errors(errors: Iterable[FileError], changed: Mapping[str, Optional[set[int]]]) -> list[FileError]:
    """The errors of the files the change touched: an unchanged file that cannot be analyzed (a syntax error
    in a module the changed code imports, a timeout) is not the change's doing, neither listed nor failing."""
    return [e for e in errors if _changed_path(e.path) in changed]


def _changed_path(path: str) -> str:
    return path[2:] if path.startswith("./") else path
