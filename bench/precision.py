"""Precision of the static engine on real code: a labeled dev set of public repositories.

The dev set is a directory with ``repos.txt`` (``owner/name commit`` per line) and ``labels.json`` (a
list of ``{repo, commit, path, cell, line, rule, severity, verdict, reason}``, ``verdict`` one of TP,
NOISE, FP). The repositories themselves are not part of this project: extract each one at its commit
under ``--repos`` as ``NAME`` (or ``owner+name`` or ``owner/name``) first; a git checkout there
at another commit gets a warning (an extracted archive cannot be checked).

    python bench/precision.py --dev-set DIR [--repos /tmp/realcode] [--list-new] [--judgments FILE]

It analyzes every repository in this process with the engine (``analyzers.engine.analyze_files``, the
default configuration, the same file discovery as ``torchreview check``), matches each finding to a
label by (repo, path, cell, rule) and a line within ``--line-tolerance`` (default 3; the nearest
label wins, one finding per label, exact lines first), and prints per rule and overall:

- TP: labeled TPs still found (recall of the TPs; ``--list-missed`` lists the lost ones), NOISE / FP:
  labeled ones still reported, new: findings no label matches (``--list-new`` lists them,
  ``path:line rule message``),
- precision over judged findings (labels and judgments), TP / (TP + NOISE + FP), and the strict
  precision, TP / all findings, where a new finding that nobody judged counts against it,
- the precision of what is reported at high or critical severity (current severity),
- per repository: findings, and what the App would post if one pull request added the whole
  repository: ``plan_review`` (the bot's own review composition, default settings) gives the inline
  comments (at most ``max_inline_comments``, notebook findings on their line of the .ipynb JSON); the
  other findings (over the limit, or in a notebook cell whose JSON line is unknown) go in its
  one summary comment. The same again for the findings of the rules 0.1.0 had (``--baseline-rules``,
  default the 30 rules of torchreview 0.1.0, which ``labels.json`` was made with), so that the comment
  volume compares with 0.1.0's rule for rule, and a total row.

``--judgments FILE``: your own verdicts on new findings, a JSON list shaped like ``labels.json``
(``repo, path, cell, line, rule, verdict``); they are matched the same way and counted like labels.
Keep it outside this repository, as the labels are.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzers.config import FILE_TIMEOUT_RANGE, Config  # noqa: E402
from analyzers.engine import analyze_files, discover  # noqa: E402
from analyzers.model import Finding, Severity  # noqa: E402

VERDICTS = ("TP", "NOISE", "FP")
# The rules torchreview 0.1.0 had: the comment volume of the same rules compares with its review.
RULES_0_1_0 = ("TR101", "TR102", "TR103", "TR104", "TR105", "TR106", "TR107", "TR108", "TR201", "TR202", "TR301",
               "TR302", "TR303", "TR401", "TR402", "TR403", "TR404", "TR405", "TR501", "TR601", "TR602", "TR701",
               "TR702", "TR703", "TR801", "TR802", "TR803", "TR901", "TR902", "TR951")


@dataclass
class Label:
    repo: str
    path: str
    cell: Optional[int]
    line: int
    rule: str
    verdict: str
    severity: str = ""
    reason: str = ""
    judged: bool = False  # from --judgments (a verdict on a finding the labels do not cover)

    @classmethod
    def from_dict(cls, data: dict, judged: bool = False) -> "Label":
        verdict = str(data["verdict"]).upper()
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {data['verdict']!r} in {data}")
        cell = data.get("cell")
        return cls(data["repo"], data["path"], int(cell) if cell is not None else None, int(data["line"]),
                   data["rule"], verdict, data.get("severity", ""), data.get("reason", ""), judged)


@dataclass
class RepoRun:
    repo: str
    commit: str
    root: Optional[Path]
    findings: list[Finding] = field(default_factory=list)
    errors: int = 0
    files: int = 0
    inline_comments: int = 0
    summary_only: int = 0
    baseline_findings: int = 0  # of the --baseline-rules
    baseline_inline_comments: int = 0


@dataclass
class Match:
    """One finding of the current run and the label (or judgment) it matched, if any."""

    repo: str
    finding: Finding
    label: Optional[Label] = None

    @property
    def verdict(self) -> Optional[str]:
        return self.label.verdict if self.label else None


# ---- the dev set -------------------------------------------------------------------------------

def read_repos(dev_set: Path) -> list[tuple[str, str]]:
    repos = []
    for raw in (dev_set / "repos.txt").read_text().splitlines():
        raw = raw.split("#", 1)[0].strip()
        if raw:
            name, commit = raw.split()[:2]
            repos.append((name, commit))
    return repos


def read_labels(path: Path, judged: bool = False) -> list[Label]:
    return [Label.from_dict(item, judged) for item in json.loads(path.read_text())]


def repo_dir(repos: Path, repo: str) -> Optional[Path]:
    owner, name = repo.split("/", 1)
    for candidate in (repos / name, repos / f"{owner}+{name}", repos / owner / name):
        if candidate.is_dir():
            return candidate
    return None


def checked_out_commit(root: Path) -> Optional[str]:
    """HEAD of a git checkout; None for an extracted archive (which cannot be checked)."""
    if not (root / ".git").exists():
        return None
    import subprocess

    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


# ---- running the engine --------------------------------------------------------------------------

def analyze_repo(repo: str, commit: str, root: Optional[Path], jobs: int = 1,
                 baseline_rules: Iterable[str] = RULES_0_1_0) -> RepoRun:
    run = RepoRun(repo, commit, root)
    if root is None:
        return run
    files, result = analyze_checkout(root, jobs)
    run.findings, run.errors, run.files = result.findings, len(result.errors), result.files
    sources = read_sources(files)
    run.inline_comments, run.summary_only = app_comments(run.findings, sources)
    baseline_rules = set(baseline_rules)
    baseline = [f for f in run.findings if f.rule in baseline_rules]
    run.baseline_findings = len(baseline)
    run.baseline_inline_comments, _ = app_comments(baseline, sources)
    return run


# what the benches measure: every rule, preview ones included, at the rule's own severity (no measured cap)
# The longest per-file budget the engine allows: a benchmark counts what the rules find, and a machine shared with
# other work must not cut a file that a quiet one analyzes in seconds (the App's own budget is its configuration's).
MEASURED_CONFIG = Config(preview=True, measured_severities=False, file_timeout=FILE_TIMEOUT_RANGE[1])


def analyze_checkout(root: Path, jobs: int = 1, only: Optional[Iterable[str]] = None):
    """(files, RunResult) of the whole catalog on a repository checked out at ``root``: every file
    ``torchreview check .`` finds there, or the paths ``only`` names (relative to ``root``). Preview rules
    included and each rule at its own severity: this is what measures them (analyzers/levels.py)."""
    config = MEASURED_CONFIG
    if only is None:
        files = [(p, Path(p).relative_to(root).as_posix()) for p, _ in discover([str(root)], config)]
    else:
        files = [(root / path, path) for path in only if (root / path).is_file()]
    # from the repository's root, as `torchreview check .` there and the App (whose paths are relative to its
    # checkout) see it: a display path then names the file, which the repository index needs to find the
    # scripts beside it (a folder with its own README.md is an index root of its own)
    here = os.getcwd()
    os.chdir(root)
    try:
        return files, analyze_files(files, config, jobs)
    finally:
        os.chdir(here)


def read_sources(files: list[tuple[Path, str]]) -> dict[str, str]:
    sources: dict[str, str] = {}
    for path, display in files:
        try:
            sources[display] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return sources


def app_comments(findings: list[Finding], sources: dict[str, str]) -> tuple[int, int]:
    """(inline comments, findings only in the summary) if one PR added every analyzed file; an inline
    comment may cover several findings (one rule in one file, one line, or one finding or rule repeated
    across files: see ``bot.review.group_findings``)."""
    from bot import review as compose

    diffs = {}
    for display, text in sources.items():
        lines = frozenset(range(1, len(text.splitlines()) + 1))
        diffs[display] = compose.FileDiff(display, lines, lines, (lines,))
    analysis = compose.PullRequestAnalysis(findings=findings, diffs=diffs, sources=sources,
                                           reviewed_files=list(sources))
    plan = compose.plan_review(analysis, compose.ReviewSettings())
    inline = sum(len(compose.parse_fingerprints(comment["body"])) for comment in plan.comments)
    return len(plan.comments), plan.findings_count - inline


# ---- matching ----------------------------------------------------------------------------------

def match(repo: str, findings: Iterable[Finding], labels: Iterable[Label], tolerance: int = 3
          ) -> tuple[list[Match], list[Label]]:
    """Pair findings with labels of the same (path, cell, rule) at most ``tolerance`` lines apart.

    Exact lines pair first, then the nearest; each label and each finding pairs at most once.
    Returns every finding as a :class:`Match` and the labels that no finding matched.
    """
    matches = [Match(repo, f) for f in findings]
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for index, m in enumerate(matches):
        by_key[(m.finding.path, m.finding.cell, m.finding.rule)].append(index)
    candidates = []
    labels = [lab for lab in labels if lab.repo == repo]
    for li, lab in enumerate(labels):
        for fi in by_key.get((lab.path, lab.cell, lab.rule), ()):
            distance = abs(matches[fi].finding.line - lab.line)
            if distance <= tolerance:
                candidates.append((distance, li, fi))
    used_labels: set[int] = set()
    for distance, li, fi in sorted(candidates):
        if li in used_labels or matches[fi].label is not None:
            continue
        matches[fi].label = labels[li]
        used_labels.add(li)
    missed = [lab for li, lab in enumerate(labels) if li not in used_labels]
    return matches, missed


# ---- figures -----------------------------------------------------------------------------------

@dataclass
class Tally:
    tp_labeled: int = 0
    tp_found: int = 0
    noise_labeled: int = 0
    noise_reported: int = 0
    fp_labeled: int = 0
    fp_reported: int = 0
    new: int = 0  # findings no label matches
    new_tp: int = 0  # of those, judged (--judgments)
    new_noise: int = 0
    new_fp: int = 0

    @property
    def reported(self) -> int:
        return self.tp_found + self.noise_reported + self.fp_reported + self.new

    @property
    def tp(self) -> int:
        return self.tp_found + self.new_tp

    @property
    def judged(self) -> int:
        return self.tp_found + self.noise_reported + self.fp_reported + self.new_tp + self.new_noise + self.new_fp

    @property
    def unjudged(self) -> int:
        return self.new - self.new_tp - self.new_noise - self.new_fp

    def precision(self) -> Optional[float]:
        """TP / findings with a verdict (labels and judgments)."""
        return self.tp / self.judged if self.judged else None

    def strict_precision(self) -> Optional[float]:
        """TP / every finding: an unjudged new finding counts as not a TP."""
        return self.tp / self.reported if self.reported else None


def tally(matches: Iterable[Match], labels: Iterable[Label], key=lambda rule: rule) -> dict[str, Tally]:
    """Per ``key(rule)``: labels (not judgments) give the denominators of recall; matches the rest."""
    out: dict[str, Tally] = defaultdict(Tally)
    for lab in labels:
        if lab.judged:
            continue
        t = out[key(lab.rule)]
        if lab.verdict == "TP":
            t.tp_labeled += 1
        elif lab.verdict == "NOISE":
            t.noise_labeled += 1
        else:
            t.fp_labeled += 1
    for m in matches:
        t = out[key(m.finding.rule)]
        lab = m.label
        if lab is None or lab.judged:
            t.new += 1
            if lab is not None:
                if lab.verdict == "TP":
                    t.new_tp += 1
                elif lab.verdict == "NOISE":
                    t.new_noise += 1
                else:
                    t.new_fp += 1
        elif lab.verdict == "TP":
            t.tp_found += 1
        elif lab.verdict == "NOISE":
            t.noise_reported += 1
        else:
            t.fp_reported += 1
    return out


def pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def rule_table(tallies: dict[str, Tally], with_judgments: bool) -> list[str]:
    head = "| rule | TP found | NOISE reported | FP reported | new |"
    sep = "|---|---:|---:|---:|---:|"
    if with_judgments:
        head += " new TP/NOISE/FP/unjudged |"
        sep += "---:|"
    head += " precision (judged) | strict precision |"
    sep += "---:|---:|"
    rows = [head, sep]
    total = Tally()
    for rule in sorted(tallies):
        t = tallies[rule]
        rows.append(tally_row(rule, t, with_judgments))
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(t, name))
    rows.append(tally_row("**all**", total, with_judgments))
    return rows


def tally_row(name: str, t: Tally, with_judgments: bool) -> str:
    row = (f"| {name} | {t.tp_found}/{t.tp_labeled} | {t.noise_reported}/{t.noise_labeled} | "
           f"{t.fp_reported}/{t.fp_labeled} | {t.new} |")
    if with_judgments:
        row += f" {t.new_tp}/{t.new_noise}/{t.new_fp}/{t.unjudged} |"
    return row + f" {pct(t.precision())} | {pct(t.strict_precision())} |"


def severity_lines(matches: list[Match]) -> list[str]:
    high = [m for m in matches if m.finding.severity >= Severity.HIGH]
    verdicts = Counter(m.verdict or "unjudged" for m in high)
    judged = sum(verdicts[v] for v in VERDICTS)
    return [
        f"high/critical severity (as reported now): {len(high)} findings: "
        f"TP {verdicts['TP']}, NOISE {verdicts['NOISE']}, FP {verdicts['FP']}, unjudged {verdicts['unjudged']}; "
        f"precision {pct(verdicts['TP'] / judged if judged else None)} of judged, "
        f"strict {pct(verdicts['TP'] / len(high) if high else None)}",
    ]


def repo_table(runs: list[RepoRun], matches: list[Match], missed: list[Label]) -> list[str]:
    """Labeled verdicts only: a finding that only a judgment covers counts as new here."""
    rows = ["| repository | files | errors | findings | TP | NOISE | FP | new | TP missed | "
            "App: inline comments | App: summary only | baseline rules: findings | baseline rules: inline comments |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    total = Counter()
    for run in runs:
        if run.root is None:
            rows.append(f"| {run.repo} | not found | | | | | | | | | | | |")
            continue
        mine = Counter("new" if m.label is None or m.label.judged else m.label.verdict
                       for m in matches if m.repo == run.repo)
        mine.update(files=run.files, errors=run.errors, findings=len(run.findings), inline=run.inline_comments,
                    summary=run.summary_only, base_findings=run.baseline_findings,
                    base_inline=run.baseline_inline_comments,
                    lost=sum(1 for lab in missed if lab.repo == run.repo and lab.verdict == "TP" and not lab.judged))
        rows.append(repo_row(run.repo, mine))
        total.update(mine)
    rows.append(repo_row("**all**", total))
    return rows


def repo_row(name: str, c: Counter) -> str:
    return (f"| {name} | {c['files']} | {c['errors']} | {c['findings']} | {c['TP']} | {c['NOISE']} | {c['FP']} | "
            f"{c['new']} | {c['lost']} | {c['inline']} | {c['summary']} | {c['base_findings']} | {c['base_inline']} |")


def location(repo: str, f: Finding) -> str:
    where = f"{f.path}:cell {f.cell}:{f.line}" if f.cell is not None else f"{f.path}:{f.line}"
    return f"{repo} {where}"


# ---- main --------------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev-set", required=True, type=Path, help="directory with repos.txt and labels.json")
    parser.add_argument("--repos", default=Path("/tmp/realcode"), type=Path,
                        help="where the repositories are extracted (NAME, owner+name or owner/name)")
    parser.add_argument("--judgments", type=Path, help="JSON verdicts on new findings (shaped like labels.json)")
    parser.add_argument("--list-new", action="store_true", help="list the findings no label or judgment matches")
    parser.add_argument("--list-missed", action="store_true", help="list labeled TPs no longer found")
    parser.add_argument("--line-tolerance", type=int, default=3, help="max line distance to a label (default 3)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", action="append", default=[], help="analyze only this owner/name (repeatable)")
    parser.add_argument("--baseline-rules", type=lambda text: [r.strip() for r in text.split(",") if r.strip()],
                        default=list(RULES_0_1_0), metavar="ID,ID,...",
                        help="rules whose findings and comments are also counted alone (default: 0.1.0's 30)")
    args = parser.parse_args(argv)

    repos = read_repos(args.dev_set)
    if args.only:
        repos = [(r, c) for r, c in repos if r in args.only]
    names = {r for r, _ in repos}
    labels = [lab for lab in read_labels(args.dev_set / "labels.json") if lab.repo in names]
    judgments = read_labels(args.judgments, judged=True) if args.judgments else []
    judgments = [j for j in judgments if j.repo in names]

    runs: list[RepoRun] = []
    matches: list[Match] = []
    missed: list[Label] = []
    for repo, commit in repos:
        root = repo_dir(args.repos, repo)
        if root is None:
            print(f"warning: {repo} not found under {args.repos}; its labels count as missed", file=sys.stderr)
        elif (head := checked_out_commit(root)) and not head.startswith(commit):
            print(f"warning: {repo} is at {head[:12]}, the labels are for {commit[:12]}", file=sys.stderr)
        run = analyze_repo(repo, commit, root, args.jobs, args.baseline_rules)
        runs.append(run)
        found, lost = match(repo, run.findings, labels, args.line_tolerance)
        matches_new = [m for m in found if m.label is None]
        # Judgments only cover what the labels do not.
        judged, _ = match(repo, [m.finding for m in matches_new], judgments, args.line_tolerance)
        matches += [m for m in found if m.label is not None] + judged
        missed += lost

    print(f"dev set: {len(repos)} repositories, {len(labels)} labels "
          f"({', '.join(f'{v} {sum(lab.verdict == v for lab in labels)}' for v in VERDICTS)})"
          + (f", {len(judgments)} judgments" if judgments else "")
          + f"; line tolerance {args.line_tolerance}")
    print(f"findings now: {len(matches)} in {sum(r.files for r in runs)} files "
          f"({sum(r.errors for r in runs)} file errors)\n")
    print("Per rule (found or reported / labeled):\n")
    print("\n".join(rule_table(tally(matches, labels), bool(judgments))))
    print()
    print("\n".join(severity_lines(matches)))
    print("\nPer repository (App: one PR adding the whole repository, default settings, via plan_review; "
          f"baseline rules: the {len(args.baseline_rules)} of --baseline-rules alone):\n")
    print("\n".join(repo_table(runs, matches, missed)))

    if args.list_missed:
        lost = [lab for lab in missed if lab.verdict == "TP" and not lab.judged]
        print(f"\nLabeled TPs no longer found ({len(lost)}):")
        for lab in lost:
            where = f"{lab.path}:cell {lab.cell}:{lab.line}" if lab.cell is not None else f"{lab.path}:{lab.line}"
            print(f"  {lab.repo} {where} {lab.rule}  ({lab.reason})")
    if args.list_new:
        new = [m for m in matches if m.label is None]
        print(f"\nNew findings, not judged ({len(new)}):")
        for m in new:
            f = m.finding
            print(f"  {location(m.repo, f)} {f.rule} [{f.severity.label}] {f.message}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
