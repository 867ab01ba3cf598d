"""``torchreview check --fix``: apply the findings' mechanical fixes in place, as ruff does.

Each pass analyzes the current text, applies every chosen fix that does not overlap another (bottom
up, so line numbers above stay valid) and refuses one whose result does not parse; passes repeat
until nothing is left to apply, at most ``MAX_PASSES`` times. The last analysis, of the final text,
is what remains. Notebooks are fixed in their cells' sources inside the .ipynb JSON.
"""
from __future__ import annotations

import ast
import difflib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import libcst as cst

from analyzers.config import Config
from analyzers.diff import keep_changed
from analyzers.isolation import run_isolated
from analyzers.freed_imports import remove_freed_imports
from analyzers.engine import (MAX_FILE_BYTES, RunResult, analyze_notebook_text, analyze_source,
                              decode_source, read_source, source_encoding)
from analyzers.pickles import checkpoint_result, is_checkpoint
from analyzers.model import FileError, FileResult, Finding
from analyzers.notebook import cell_to_python
from analyzers.program.modules import index_for
from analyzers.rules.base import Rule

MAX_PASSES = 10  # fixes of one pass can enable others (two on one line); a cycle must still end
# which findings of the current text to fix and report (``--diff REF``: those on lines changed since REF)
Keep = Callable[[list[Finding], str], list[Finding]]


def _everything(findings: list[Finding], _text: str) -> list[Finding]:
    return findings


@dataclass
class FixedFile:
    path: str
    original: str
    text: str
    applied: list[Finding] = field(default_factory=list)  # as reported, in the pass that applied them
    refused: list[tuple[Finding, str]] = field(default_factory=list)  # (finding, why)
    result: Optional[FileResult] = None  # the analysis of ``text``: what remains

    @property
    def changed(self) -> bool:
        return self.text != self.original

    def diff(self) -> str:
        return "".join(difflib.unified_diff(self.original.splitlines(keepends=True), self.text.splitlines(keepends=True),
                                            f"a/{self.path}", f"b/{self.path}"))


def _parses(source: str) -> Optional[str]:
    """None when ``source`` parses, as Python and as the engine's parser; else why not."""
    try:
        compile(source, "<fixed>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        cst.parse_module(source)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except cst.ParserSyntaxError as exc:
        return f"line {exc.raw_line}: {exc.message}"
    except (ValueError, RecursionError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _fix_key(finding: Finding, lines: list[str]) -> tuple:
    """Identifies a fix across passes, whose line numbers shift: the rule, the text it replaces, the new text."""
    fix = finding.fix
    return (finding.rule, finding.cell, "".join(lines[fix.start_line - 1:fix.end_line]), fix.replacement)


def _non_overlapping(findings: list[Finding]) -> list[Finding]:
    chosen: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.fix.start_line, f.fix.end_line, f.rule)):
        if chosen and f.fix.start_line <= chosen[-1].fix.end_line:
            continue  # overlaps one already chosen: next pass, on the text that fix leaves
        chosen.append(f)
    return chosen


def _apply_to_source(source: str, findings: list[Finding], refused_keys: set, fixed: FixedFile,
                     check=_parses) -> str:
    """Apply non-overlapping fixes bottom up, each kept only when the result still parses."""
    lines = source.splitlines(keepends=True)
    for f in reversed(_non_overlapping(findings)):
        if f.fix.end_line > len(lines):
            continue
        key = _fix_key(f, lines)
        candidate = f.fix.apply(source)
        if candidate == source:
            refused_keys.add(key)  # changes nothing: offering it again each pass would only spin
            continue
        problem = check(candidate)
        if problem is not None:
            refused_keys.add(key)
            fixed.refused.append((f, problem))
            continue
        source = candidate
        lines = source.splitlines(keepends=True)
        fixed.applied.append(f)
    return source


def _without_freed_imports(unfixed: str, text: str, path: str) -> str:
    """``text`` without the imports this pass's fixes left unused (``Variable(x)`` -> ``x`` frees
    ``from torch.autograd import Variable``); unchanged should the removal not parse."""
    cleaned = remove_freed_imports(unfixed, text, path)
    return cleaned if cleaned == text or _parses(cleaned) is None else text


def _wanted(result: FileResult, unsafe: bool, refused_keys: set, lines_of) -> list[Finding]:
    return [f for f in result.findings if f.fix is not None and (f.fix.safe or unsafe)
            and _fix_key(f, lines_of(f)) not in refused_keys]


def fix_source(source: str, path: str, config: Config, *, unsafe: bool = False,
               rules: Optional[Sequence[type[Rule]]] = None, repository=None, keep: Keep = _everything) -> FixedFile:
    """Fix Python source text; ``rules`` overrides the config's selection (tests)."""
    fixed = FixedFile(path, source, source)
    refused: set = set()
    for number in range(MAX_PASSES + 1):
        result = analyze_source(fixed.text, path, config, rules=rules, repository=repository)
        result.findings = keep(result.findings, fixed.text)
        if number == MAX_PASSES:
            break
        lines = fixed.text.splitlines(keepends=True)
        wanted = _wanted(result, unsafe, refused, lambda f: lines)
        if not wanted:
            break
        before = len(fixed.applied)
        unfixed = fixed.text
        fixed.text = _apply_to_source(fixed.text, wanted, refused, fixed)
        if len(fixed.applied) == before:
            break  # every fix was refused: the text, and so this analysis, is unchanged
        fixed.text = _without_freed_imports(unfixed, fixed.text, path)
    fixed.result = result
    return fixed


# ---------------------------------------------------------------------------------------------
# Notebooks: fixes apply to one cell's source; the JSON is written back in the layout it had


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _set_cell_text(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True) if isinstance(cell.get("source"), list) else text


def _dump_notebook(notebook: dict, original: str) -> str:
    # nbformat writes indent=1 and raw UTF-8; keep whatever indent the file used so the diff is the fix only
    match = re.search(r"\n( +)\S", original)
    indent = len(match.group(1)) if match else 1
    escaped = "\\u" in original and original.isascii()  # written with \uXXXX escapes: keep writing them
    text = json.dumps(notebook, indent=indent, ensure_ascii=escaped)
    return text + ("\n" if original.endswith("\n") else "")


def _cell_parses(text: str) -> Optional[str]:
    # a cell parses as IPython runs it: magics and shell escapes are Python there
    python = cell_to_python(text)
    return _parses((python.source if python is not None else text) + "\n")


def _ipython_lines(text: str) -> set[int]:
    """The cell's lines that IPython rewrites (magics, shell escapes): a fix must not replace them."""
    python = cell_to_python(text)
    return set(python.rewritten) if python is not None else set(range(1, text.count("\n") + 2))


def fix_notebook(text: str, path: str, config: Config, *, unsafe: bool = False, repository=None,
                 keep: Keep = _everything) -> FixedFile:
    fixed = FixedFile(path, text, text)
    try:
        notebook = json.loads(text)
        cells = notebook["cells"]
        assert isinstance(cells, list)
    except (ValueError, KeyError, TypeError, AssertionError):
        fixed.result = analyze_notebook_text(text, path, config, repository)  # reports why it is unreadable
        return fixed
    refused: set = set()
    current = text
    for number in range(MAX_PASSES + 1):
        result = analyze_notebook_text(current, path, config, repository)
        result.findings = keep(result.findings, current)
        if number == MAX_PASSES:
            break
        sources = {i: _cell_text(c) for i, c in enumerate(cells, 1) if isinstance(c, dict)}
        wanted = _wanted(result, unsafe, refused, lambda f: sources.get(f.cell, "").splitlines(keepends=True))
        # a fix must stay inside its cell and off magic lines (rewritten for the analysis, so the fix lost them)
        wanted = [f for f in wanted if f.cell in sources and f.fix.end_line <= len(sources[f.cell].splitlines())
                  and not _ipython_lines(sources[f.cell]) & set(range(f.fix.start_line, f.fix.end_line + 1))]
        if not wanted:
            break
        before = len(fixed.applied)
        for cell_number in sorted({f.cell for f in wanted}):
            in_cell = [f for f in wanted if f.cell == cell_number]
            new = _apply_to_source(sources[cell_number], in_cell, refused, fixed, check=_cell_parses)
            if new.endswith("\n") and not sources[cell_number].endswith("\n"):
                new = new[:-1]  # a fix of a cell's last line ends in a newline the cell did not have
            _set_cell_text(cells[cell_number - 1], new)
        if len(fixed.applied) == before:
            break
        current = _dump_notebook(notebook, text)
    fixed.text = current
    fixed.result = result
    return fixed


# ---------------------------------------------------------------------------------------------
# Files


def _encoding(data: bytes, path: str) -> str:
    if path.endswith(".ipynb"):
        return "utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8"
    return source_encoding(data, path)[0]  # keeps a BOM and a coding cookie (UTF-8 for a codec we lack)


def changed_since(ref: str, display: str) -> Keep:
    """Keep findings on lines that differ from the file at ``ref`` (git), recomputed for each pass's text
    since fixes move lines; a file not in ``ref`` is new, all of it changed; a changed notebook, all of it
    (as ``--diff`` does)."""
    proc = subprocess.run(["git", "show", f"{ref}:./{display}"], capture_output=True)
    base = decode_source(proc.stdout, display)[0] if proc.returncode == 0 else None

    def keep(findings: list[Finding], text: str) -> list[Finding]:
        if base is None or (display.endswith(".ipynb") and text != base):
            return findings
        matcher = difflib.SequenceMatcher(None, base.splitlines(), text.splitlines(), autojunk=False)
        lines = {n + 1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert")
                 for n in range(j1, j2)}
        return keep_changed(findings, {display: lines})
    return keep


def _replace(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename: other workers read this file for their cross-file
    questions while it is being fixed, and must never see half of it."""
    import shutil
    import tempfile

    path = Path(os.path.realpath(path))  # a symlink stays a symlink: its target is what gets fixed
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".torchreview", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        shutil.copymode(path, temporary)  # mkstemp makes it 0600; keep the file's own mode
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def fix_file(path: Path, display: str, config: Config, *, unsafe: bool = False, write: bool = True,
             diff_ref: Optional[str] = None) -> FixedFile:
    if is_checkpoint(display):  # nothing to fix in a binary file: its scan's findings are reported
        fixed = FixedFile(display, "", "")
        fixed.result = checkpoint_result(path, display, config)
        return fixed
    text, note = read_source(path, display)
    if text is None:
        fixed = FixedFile(display, "", "")
        fixed.result = FileResult(display, errors=[note])
        return fixed
    repository = index_for(path)
    keep = changed_since(diff_ref, display) if diff_ref else _everything
    if display.endswith(".ipynb"):
        fixed = fix_notebook(text, display, config, unsafe=unsafe, repository=repository, keep=keep)
    else:
        fixed = fix_source(text, display, config, unsafe=unsafe, repository=repository, keep=keep)
    if note is not None:
        fixed.result.errors.append(note)
    if write and fixed.changed:
        data = path.read_bytes()
        # bytes, not text mode: newlines are written exactly as they were read (\r\n stays \r\n)
        encoded = fixed.text.encode(_encoding(data, display))
        if len(encoded) <= MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
            _replace(path, encoded)
        else:
            fixed.result.errors.append(FileError(display, "fix-error", "the fixed file would be over the size limit; not written"))
            fixed.text = fixed.original
    return fixed


def fix_files(files: list[tuple[Path, str]], config: Config, *, unsafe: bool = False, write: bool = True,
              jobs: Optional[int] = None, diff_ref: Optional[str] = None) -> tuple[list[FixedFile], RunResult]:
    """Fix every file (with ``diff_ref``, only findings on lines changed since it); returns each file's
    outcome and the run of what remains. Each file is fixed in a forked child bounded by ``config.file_timeout``
    (analyzers.isolation); a file past it is left as it was (fixes are written whole, by a rename)."""
    started = time.perf_counter()
    work = [(display, str(path)) for path, display in files]

    def not_fixed(display: str, kind: str, message: str) -> FixedFile:
        outcome = FixedFile(display, "", "")
        outcome.result = FileResult(display, errors=[FileError(display, kind, message)])
        return outcome

    done = run_isolated(work, lambda display, path: fix_file(Path(path), display, config, unsafe=unsafe, write=write,
                                                             diff_ref=diff_ref),
                        not_fixed, seconds=config.file_timeout, jobs=jobs or os.cpu_count() or 1)
    outcomes = [done[display] for display, _ in work]
    run = RunResult(files=len(work))
    for outcome in outcomes:
        run.findings.extend(outcome.result.findings)
        run.errors.extend(outcome.result.errors)
    run.findings.sort(key=lambda f: f.sort_key)
    run.errors.sort(key=lambda e: (e.path, e.kind))
    run.seconds = time.perf_counter() - started
    return outcomes, run


def unsafe_fixes_left(run: RunResult) -> int:
    return sum(1 for f in run.findings if f.fix is not None and not f.fix.safe)


__all__ = ["fix_source", "fix_notebook", "fix_file", "fix_files", "FixedFile", "MAX_PASSES", "unsafe_fixes_left"]
