"""A finding's identity that survives unrelated edits: no line numbers, only content.

The App marks each review comment with it (a re-review never comments twice); the CLI's SARIF
output gives it to code scanning as ``partialFingerprints``, so an alert stays one alert when
lines are inserted above it.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Iterable, Mapping, Sequence

from analyzers.model import Finding


def is_notebook_finding(finding: Finding) -> bool:
    # Notebook line numbers count inside a cell, not in the .ipynb JSON a diff shows.
    return finding.cell is not None or finding.path.endswith(".ipynb")


def flagged_text(finding: Finding, source_lines: Sequence[str]) -> str:
    """Whitespace-normalised text of the flagged lines; the message when lines are unknown."""
    if is_notebook_finding(finding) or finding.line > len(source_lines):
        return " ".join(finding.message.split())
    return " ".join("\n".join(source_lines[finding.line - 1: finding.end_line]).split())


def fingerprint(finding: Finding, source_lines: Sequence[str], occurrence: int = 0) -> str:
    """``occurrence`` tells apart identical (rule, path, text) findings in one file, in file order."""
    key = "\0".join([finding.rule, finding.path, flagged_text(finding, source_lines), str(occurrence)])
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def fingerprints_for(findings: Iterable[Finding], sources: Mapping[str, str]) -> dict[Finding, str]:
    """The fingerprint of each finding; ``sources`` maps a path to its text."""
    # A notebook's findings are fingerprinted by message (see flagged_text): its JSON is not split.
    lines_by_path = {path: text.splitlines() for path, text in sources.items() if not path.endswith(".ipynb")}
    seen: Counter = Counter()
    result: dict[Finding, str] = {}
    for finding in sorted(set(findings), key=lambda f: f.sort_key):
        lines = lines_by_path.get(finding.path, [])
        key = (finding.rule, finding.path, flagged_text(finding, lines))
        result[finding] = fingerprint(finding, lines, seen[key])
        seen[key] += 1
    return result
