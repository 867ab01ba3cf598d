"""Render a run's results: text (for people), json (the contract), sarif (code scanning), github."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from typing import IO

from analyzers.engine import RunResult
from analyzers.fingerprint import fingerprints_for
from analyzers.model import Finding, Severity

SEVERITY_STYLE = {
    Severity.CRITICAL: "bold white on red",
    Severity.HIGH: "bold red",
    Severity.MEDIUM: "yellow",
    Severity.LOW: "cyan",
}
FORMATS = ("text", "json", "sarif", "github")


def render(run: RunResult, fmt: str, stream: IO[str], *, color: bool | None = None) -> None:
    if fmt == "json":
        json.dump(run.to_dict(), stream, indent=2)
        stream.write("\n")
    elif fmt == "sarif":
        json.dump(to_sarif(run), stream, indent=2)
        stream.write("\n")
    elif fmt == "github":
        render_github(run, stream)
    else:
        render_text(run, stream, color=color)


def render_text(run: RunResult, stream: IO[str], *, color: bool | None = None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, force_terminal=color, no_color=color is False, highlight=False,
                      soft_wrap=True)
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in run.findings:
        by_file[finding.path].append(finding)
    for path in sorted(by_file):
        findings = sorted(by_file[path], key=lambda f: (-f.severity, f.cell or 0, f.line, f.column))
        console.print(Text(path, style="bold underline"))
        for f in findings:
            where = f"cell {f.cell}, line {f.line}" if f.cell else f"{f.line}:{f.column}"
            line = Text("  ")
            line.append(f"{f.severity.label.upper():<8}", style=SEVERITY_STYLE[f.severity])
            line.append(f" {where:<10} ", style="dim")
            line.append(f"{f.rule} ", style="bold")
            line.append(f"{f.slug}{' (preview)' if f.preview else ''}: ", style="magenta")
            line.append(f.message)
            if f.context:
                line.append(f" ({f.context})", style="dim")
            if f.fix is not None:  # unsafe: --fix applies it only with --unsafe-fixes
                line.append("  [fix available]" if f.fix.safe else "  [unsafe fix available]", style="green")
            console.print(line)
        console.print()
    for error in run.errors:
        console.print(Text.assemble(("error ", "bold red"), (f"{error.path}", "bold"), f" [{error.kind}] {error.message}"))
    counts = {s: sum(1 for f in run.findings if f.severity is s) for s in Severity}
    parts = [f"{counts[s]} {s.label}" for s in sorted(Severity, reverse=True) if counts[s]]
    summary = Text()
    total = len(run.findings)
    summary.append(f"{total} finding{'s' if total != 1 else ''}", style="bold red" if total else "bold green")
    if parts:
        summary.append(" (" + ", ".join(parts) + ")")
    summary.append(f" in {run.files} file{'s' if run.files != 1 else ''}")
    if run.cached:
        summary.append(f" ({run.cached} from the cache)", style="dim")
    if run.errors:
        summary.append(f", {len(run.errors)} file error{'s' if len(run.errors) != 1 else ''}", style="red")
    summary.append(f" · {run.seconds:.2f}s", style="dim")
    console.print(summary)


def render_github(run: RunResult, stream: IO[str]) -> None:
    """GitHub Actions workflow commands: annotations on the PR's Files view."""
    level = {Severity.CRITICAL: "error", Severity.HIGH: "error", Severity.MEDIUM: "warning", Severity.LOW: "notice"}
    in_notebooks = _notebook_json_lines(run.findings)
    for f in run.findings:
        title = _escape_property(f"{f.rule} {f.slug} ({f.severity.label}{', ' + f.context if f.context else ''})")
        if f.cell is not None:  # the annotation goes on the .ipynb's JSON line; the message names the cell
            json_line = in_notebooks.get((f.path, f.cell, f.line))
            where = f"line={json_line}," if json_line else ""
            stream.write(f"::{level[f.severity]} file={_escape_property(f.path)},{where}title={title}::"
                         f"{_escape_data(f'cell {f.cell}, line {f.line}: {f.message}')}\n")
            continue
        message = _escape_data(f.message)
        stream.write(f"::{level[f.severity]} file={_escape_property(f.path)},line={f.line},endLine={f.end_line},"
                     f"col={f.column},title={title}::{message}\n")
    for e in run.errors:
        stream.write(f"::warning file={_escape_property(e.path)},title=torchreview {e.kind}::{_escape_data(e.message)}\n")


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


SARIF_LEVEL = {Severity.CRITICAL: "error", Severity.HIGH: "error", Severity.MEDIUM: "warning", Severity.LOW: "note"}
# GitHub's bands: critical 9.0+, high 7.0-8.9, medium 4.0-6.9, low 0.1-3.9; only on rules marked `security`
SECURITY_SEVERITY = {Severity.CRITICAL: "9.5", Severity.HIGH: "7.5", Severity.MEDIUM: "5.0", Severity.LOW: "2.0"}
PROJECT_URL = "https://github.com/torchreview/torchreview"


def rule_help_uri(rule_id: str) -> str:
    """The rule's generated page (docs/rules/, scripts/gen_docs.py) on the project's repository."""
    return f"{PROJECT_URL}/blob/main/docs/rules/{rule_id}.md"


def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchreview")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0"


def _sources(findings) -> dict[str, str]:
    """The text of each file with findings, read again (the run keeps no sources)."""
    from pathlib import Path

    from analyzers.engine import read_source

    from analyzers.pickles import is_checkpoint

    sources = {}
    for path in {f.path for f in findings if not is_checkpoint(f.path)}:  # binary: never read as text
        text, _ = read_source(Path(path), path)
        if text is not None:
            sources[path] = text
    return sources


def _notebook_json_lines(findings, sources=None) -> dict[tuple[str, int, int], int]:
    """(path, cell, line in cell) -> the line of the .ipynb's JSON that holds it, for the cells of the
    notebook findings (their own lines and their related sites)."""
    from analyzers.notebook import json_source_lines

    notebooks = {f.path for f in findings if f.cell is not None}
    sources = sources if sources is not None else _sources([f for f in findings if f.path in notebooks])
    out = {}
    for path in notebooks:
        if path in sources:
            for cell, lines in json_source_lines(sources[path]).items():
                out.update(((path, cell, n), json_line) for n, json_line in enumerate(lines, 1))
    return out


def to_sarif(run: RunResult) -> dict:
    """SARIF 2.1.0 as GitHub code scanning accepts it."""
    from analyzers.rules import all_rules

    rules = all_rules()
    index = {r.id: i for i, r in enumerate(rules)}
    sources = _sources(run.findings)
    fingerprints = fingerprints_for(run.findings, sources)
    in_notebooks = _notebook_json_lines(run.findings, sources)
    descriptors = []
    for rule in rules:
        descriptors.append({
            "id": rule.id,
            "name": "".join(part.capitalize() for part in rule.slug.split("-")),
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": " ".join(rule.what.split())},
            "help": {"text": rule.docs(), "markdown": rule.docs()},
            "helpUri": rule_help_uri(rule.id),
            "defaultConfiguration": {"level": SARIF_LEVEL[rule.severity]},
            "properties": {
                "tags": [rule.category.value, "pytorch"] + (["security"] if rule.security else []),
                "precision": "high",
                **({"security-severity": SECURITY_SEVERITY[rule.severity]} if rule.security else {}),
            },
        })
    results = []
    for f in run.findings:
        region = {"startLine": f.line, "startColumn": f.column, "endLine": f.end_line, "endColumn": f.end_column}
        text = f.message
        related = [(site, {"startLine": site.line, "startColumn": site.column, "endLine": site.end_line,
                           "endColumn": site.end_column}) for site in f.related]
        if f.cell is not None:  # code scanning shows the .ipynb as JSON: its line there, the cell in words
            region = {"startLine": in_notebooks.get((f.path, f.cell, f.line), 1)}
            text = f"cell {f.cell}, line {f.line}: {f.message}"
            related = [(replace(site, message=f"cell {f.cell}, line {site.line}: {site.message}"),
                        {"startLine": in_notebooks.get((f.path, f.cell, site.line), 1)}) for site in f.related]
        result = {
            "ruleId": f.rule,
            "ruleIndex": index.get(f.rule, 0),
            "level": SARIF_LEVEL[f.severity],
            "message": {"text": text},
            "locations": [{
                "physicalLocation": {
                    "artifactLocation": {"uri": f.path, "uriBaseId": "%SRCROOT%"},
                    "region": region,
                }
            }],
            # line-independent, so an alert survives lines inserted above it (the App's fingerprint)
            "partialFingerprints": {"torchreview/v2": fingerprints[f]},
            "relatedLocations": [{
                "id": number,
                "message": {"text": site.message},
                "physicalLocation": {
                    "artifactLocation": {"uri": f.path, "uriBaseId": "%SRCROOT%"},
                    "region": site_region,
                },
            } for number, (site, site_region) in enumerate(related, 1)],
            "properties": {"severity": f.severity.label, "category": f.category,
                           **({"context": f.context} if f.context else {})},
        }
        if f.fix is not None and f.cell is None:  # a notebook fix is cell lines, not lines of its JSON
            result["fixes"] = [{
                "description": {"text": f"Apply the {f.slug} fix"},
                "artifactChanges": [{
                    "artifactLocation": {"uri": f.path, "uriBaseId": "%SRCROOT%"},
                    "replacements": [{
                        # a region with lines only covers those whole lines
                        "deletedRegion": {"startLine": f.fix.start_line, "endLine": f.fix.end_line},
                        "insertedContent": {"text": f.fix.replacement},
                    }],
                }],
            }]
        results.append(result)
    notifications = [{
        "level": "warning",
        "message": {"text": f"{e.path}: {e.kind}: {e.message}"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": e.path, "uriBaseId": "%SRCROOT%"}}}],
    } for e in run.errors]
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "torchreview", "version": tool_version(),
                                "informationUri": PROJECT_URL, "rules": descriptors}},
            "results": results,
            "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
        }],
    }
