"""Precision of the static engine on the evaluation corpus, tune and holdout apart (docs/evaluation.md).

The corpus is ``bench/corpus/repos.tsv`` (extract it first with ``bench/corpus/fetch.py``), split into tune and
holdout by ``bench/corpus/split.tsv``. Three steps:

    python bench/corpus_precision.py analyze [--cache DIR] [--findings DIR] [--jobs 2]
    python bench/corpus_precision.py sheet   [--findings DIR] [--out sheet.tsv] [--unjudged]
    python bench/corpus_precision.py report  [--findings DIR] [--verdicts bench/corpus/verdicts] [--markdown]

``analyze`` runs the engine (default configuration, the file discovery of ``torchreview check``, from each
repository's root) and keeps one JSON per repository under ``--findings`` (default
``$TORCHREVIEW_CORPUS_FINDINGS`` or ``/tmp/torchreview-corpus-findings``); a repository already analyzed at its
commit is not analyzed again unless ``--rerun``.

Each finding gets a stable id: a hash of the repository, the path, the notebook cell, the rule and the text of
the flagged lines (whitespace-normalised), with an occurrence number for identical ones; no line number and
nothing of the engine's version, so a verdict keeps applying when the engine moves a line or changes its
message, and judges cannot tell which version produced a finding.

``sheet`` draws the sample to judge: in each stratum (split, rule, severity) every finding on holdout at high
or critical, otherwise the ``--per-stratum`` findings (default 3) that rank first by a seeded hash of their
id. A seeded hash, not a shuffle: the draw does not depend on the order of the findings, and a finding
stays drawn when other findings come or go, so verdicts carry over between engine versions. The sheet lists
holdout first, then goes round the strata (each one's best-ranked finding, then each one's second, ...): a
judge who stops anywhere has judged, in every stratum, the findings that rank first there, a uniform random
subset of it, and covered as many strata as possible (the weights follow what was judged).

``report`` reads the verdict files (``bench/corpus/verdicts/*.tsv``: ``id  verdict  reason  judge``, verdict
TP / NOISE / FP) and prints, for tune and holdout apart, per rule, per severity and overall: findings,
judged (of the sample), TP / NOISE / FP, strict precision TP / judged and FP rate FP / judged with 95 %
Wilson intervals, and the same weighted back to all findings: each judged finding stands for
``findings in its stratum / judged in its stratum`` findings (an interval on Kish's effective sample size).
A stratum with no verdict is left out of the weighted figure and counted as not covered.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzers.levels import LEVELS_FILE, Measure, decide, wilson  # noqa: E402
from bench.corpus.corpus import (  # noqa: E402
    CORPUS_DIR, SPLITS, CorpusRepo, default_cache, read_repos, read_split, slug, split_of,
)

VERDICTS = ("TP", "NOISE", "FP")
SEVERITIES = ("critical", "high", "medium", "low", "info")
ALWAYS_JUDGED = ("critical", "high")  # on holdout, every one of these is in the sample
DEFAULT_SEED = "issue-24"
DEFAULT_PER_STRATUM = 3
MEASURED = CORPUS_DIR / "measured.tsv"  # the judged holdout findings levels.json was derived from
SHEET_COLUMNS = ("id", "split", "repo", "commit", "path", "cell", "line", "end_line", "rule", "severity",
                 "message", "weight")


class VerdictError(ValueError):
    pass


def default_findings_dir() -> Path:
    return Path(os.environ.get("TORCHREVIEW_CORPUS_FINDINGS", "/tmp/torchreview-corpus-findings"))


# ---- findings and their ids ----------------------------------------------------------------------

@dataclass(frozen=True)
class CorpusFinding:
    id: str
    repo: str
    commit: str
    path: str
    cell: Optional[int]
    line: int
    end_line: int
    rule: str
    severity: str
    message: str


def finding_key(repo: str, path: str, cell: Optional[int], rule: str, flagged: str) -> str:
    return "\0".join([repo, path, str(cell or 0), rule, " ".join(flagged.split())])


def assign_ids(keys: list[str]) -> list[str]:
    """One id per key, in order; identical keys (the same text flagged twice) are told apart by occurrence."""
    seen: Counter = Counter()
    ids = []
    for key in keys:
        ids.append(hashlib.blake2b(f"{key}\0{seen[key]}".encode("utf-8", "surrogatepass"),
                                   digest_size=8).hexdigest())
        seen[key] += 1
    return ids


def _flagged_lines(lines: list[str], line: int, end_line: int) -> str:
    return "\n".join(lines[max(line, 1) - 1: max(end_line, line)])


def _source_lines(root: Path, path: str, cache: dict) -> dict[Optional[int], list[str]]:
    """Lines of a file, or of each notebook cell (keyed by cell number); None keys a plain file."""
    if path not in cache:
        full = root / path
        try:
            if path.endswith(".ipynb"):
                from analyzers import notebook

                with full.open("rb") as stream:
                    cache[path] = {c.number: c.source.splitlines() for c in notebook.read_cells(stream)}
            else:
                cache[path] = {None: full.read_text(encoding="utf-8", errors="replace").splitlines()}
        except (OSError, ValueError):
            cache[path] = {}
    return cache[path]


def analyze_repo(entry: CorpusRepo, root: Path, jobs: int) -> dict:
    from bench.precision import analyze_checkout

    _, result = analyze_checkout(root, jobs)
    sources: dict = {}
    ordered = sorted(result.findings, key=lambda f: f.sort_key)
    keys = []
    for f in ordered:
        lines = _source_lines(root, f.path, sources).get(f.cell, [])
        keys.append(finding_key(entry.repo, f.path, f.cell, f.rule, _flagged_lines(lines, f.line, f.end_line)))
    findings = [asdict(CorpusFinding(fid, entry.repo, entry.commit, f.path, f.cell, f.line, f.end_line, f.rule,
                                     f.severity.label, f.message))
                for fid, f in zip(assign_ids(keys), ordered)]
    failed = Counter(e.kind for e in result.errors if e.kind in ENGINE_FAILURES)
    return {"repo": entry.repo, "commit": entry.commit, "files": result.files, "errors": len(result.errors),
            "failed_files": dict(sorted(failed.items())), "seconds": round(result.seconds, 2), "findings": findings}


# File errors that say nothing about the file's code: the engine ran out of time on it (a busy machine does that),
# its child died, or a rule raised. A repository with any has incomplete findings, and a figure counting it is low.
ENGINE_FAILURES = ("timeout", "parser-crash", "rule-error")


def engine_failures(out: Path, entries: list[CorpusRepo]) -> dict[str, dict[str, int]]:
    """repo -> {kind: files} for the listed repositories whose recorded run has files the engine failed on."""
    found = {}
    for entry in entries:
        target = out / f"{slug(entry.repo)}.json"
        run = json.loads(target.read_text()) if target.is_file() else {}
        if run.get("failed_files"):
            found[entry.repo] = run["failed_files"]
    return found


def analyze_corpus(entries: list[CorpusRepo], cache: Path, out: Path, jobs: int, rerun: bool,
                   timeout: Optional[float] = None) -> list[str]:
    """Analyze every extracted repository into ``out``; returns the repositories not in the cache.

    With ``timeout``, each repository runs in a child process (its own process group, the engine's workers
    included) that is killed after that many seconds; the run is then recorded as timed out, so one file the
    engine is slow on does not stall the corpus and the report names it."""
    out.mkdir(parents=True, exist_ok=True)
    absent = []
    for entry in entries:
        root = cache / slug(entry.repo)
        target = out / f"{slug(entry.repo)}.json"
        marker = root / ".torchreview-corpus-commit"
        if not marker.is_file() or marker.read_text().strip() != entry.commit:
            absent.append(entry.repo)
            continue
        recorded = json.loads(target.read_text()) if target.is_file() and not rerun else {}
        if recorded.get("commit") == entry.commit and not recorded.get("failed_files", {}).get("timeout"):
            continue  # done, unless a file ran out of time: analyzing again redoes that repository
        for attempt in range(2):
            if timeout is None:
                _analyze_into(entry, root, jobs, target)
            else:
                _analyze_with_timeout(entry, root, jobs, target, timeout)
            run = json.loads(target.read_text())
            if attempt or not run.get("failed_files", {}).get("timeout"):
                break
            # a file ran out of time: on a busy machine that is the load, not the file; once more, then it stands
            print(f"  {entry.repo}: {run['failed_files']['timeout']} files ran out of time; analyzing it again",
                  flush=True)
        state = f"timed out after {timeout:.0f} s" if run.get("timed_out") else f"{run['seconds']} s"
        if run.get("failed_files"):
            state += "; files the engine failed on: " + ", ".join(f"{k} {n}" for k, n in run["failed_files"].items())
        print(f"  {entry.repo}: {run['files']} files, {len(run['findings'])} findings, {state}", flush=True)
    return absent


def _analyze_into(entry: CorpusRepo, root: Path, jobs: int, target: Path) -> None:
    target.write_text(json.dumps(analyze_repo(entry, root, jobs)))


def _analyze_in_own_group(entry: CorpusRepo, root: Path, jobs: int, target: Path) -> None:
    os.setsid()  # the engine's worker processes join this group, so a timeout can end them all
    _analyze_into(entry, root, jobs, target)


def _analyze_with_timeout(entry: CorpusRepo, root: Path, jobs: int, target: Path, timeout: float) -> None:
    import multiprocessing
    import signal

    child = multiprocessing.get_context("fork").Process(target=_analyze_in_own_group, args=(entry, root, jobs, target))
    child.start()
    child.join(timeout)
    if child.is_alive():
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.join()
        target.write_text(json.dumps({"repo": entry.repo, "commit": entry.commit, "files": 0, "errors": 0,
                                      "seconds": timeout, "timed_out": True, "findings": []}))
    elif child.exitcode != 0 or not target.is_file():
        raise RuntimeError(f"analyzing {entry.repo} failed (exit code {child.exitcode})")


def load_findings(out: Path, entries: list[CorpusRepo]) -> tuple[list[CorpusFinding], list[str]]:
    """The findings of the listed repositories at their listed commit; and the repositories without a
    complete run (none, another commit, or timed out)."""
    findings, absent = [], []
    for entry in entries:
        target = out / f"{slug(entry.repo)}.json"
        run = json.loads(target.read_text()) if target.is_file() else None
        if run is None or run.get("commit") != entry.commit or run.get("timed_out"):
            absent.append(entry.repo)
            continue
        findings.extend(CorpusFinding(**item) for item in run["findings"])
    return findings, absent


def timed_out(out: Path, entries: list[CorpusRepo]) -> list[str]:
    runs = [out / f"{slug(e.repo)}.json" for e in entries]
    return [e.repo for e, run in zip(entries, runs) if run.is_file() and json.loads(run.read_text()).get("timed_out")]


# ---- the sample ----------------------------------------------------------------------------------

Stratum = tuple[str, str, str]  # split, rule, severity


def stratum_of(finding: CorpusFinding, sides: dict[str, str]) -> Stratum:
    return sides[finding.repo], finding.rule, finding.severity


def draw_rank(seed: str, finding_id: str) -> str:
    return hashlib.sha256(f"{seed}\0{finding_id}".encode()).hexdigest()


def draw_sample(findings: Iterable[CorpusFinding], sides: dict[str, str], per_stratum: int = DEFAULT_PER_STRATUM,
                seed: str = DEFAULT_SEED) -> tuple[list[CorpusFinding], Counter]:
    """The findings to judge, and the number of findings in each stratum (for the weights)."""
    strata: dict[Stratum, list[CorpusFinding]] = defaultdict(list)
    for f in findings:
        strata[stratum_of(f, sides)].append(f)
    drawn: list[tuple[tuple, CorpusFinding]] = []
    for (side, _rule, severity), members in sorted(strata.items()):
        ranked = sorted(members, key=lambda f: draw_rank(seed, f.id))
        if not (side == "holdout" and severity in ALWAYS_JUDGED):
            ranked = ranked[:per_stratum]
        # judging order: holdout first, then every stratum's first finding, every stratum's second, ...: a
        # judge who stops anywhere has judged, in each stratum, the findings that rank first there (a
        # uniform random subset of it), and as many strata as possible
        drawn.extend(((side != "holdout", position, draw_rank(seed, f.id)), f) for position, f in enumerate(ranked))
    drawn.sort(key=lambda item: item[0])
    return [f for _, f in drawn], Counter({key: len(members) for key, members in strata.items()})


def write_sheet(path: Path, sample: list[CorpusFinding], sides: dict[str, str], totals: Counter) -> None:
    drawn = Counter(stratum_of(f, sides) for f in sample)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(SHEET_COLUMNS)
        for f in sample:
            key = stratum_of(f, sides)
            writer.writerow([f.id, sides[f.repo], f.repo, f.commit, f.path, f.cell or "", f.line, f.end_line, f.rule,
                             f.severity, " ".join(f.message.split()), f"{totals[key] / drawn[key]:.2f}"])


# ---- verdicts ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    id: str
    verdict: str
    reason: str
    judge: str
    source: str  # file:line


def read_verdicts(directory: Path) -> dict[str, Verdict]:
    """Every ``*.tsv`` in ``directory``; a malformed line or two different verdicts on one id is an error."""
    verdicts: dict[str, Verdict] = {}
    for path in sorted(directory.glob("*.tsv")):
        with path.open(newline="", encoding="utf-8") as handle:
            for number, row in enumerate(csv.reader(handle, delimiter="\t"), 1):
                if not row or not row[0].strip() or row[0].startswith("#") or (number == 1 and row[0] == "id"):
                    continue
                where = f"{path.name}:{number}"
                if len(row) != 4:
                    raise VerdictError(f"{where}: expected 4 tab-separated columns (id, verdict, reason, judge), "
                                       f"got {len(row)}")
                fid, verdict, reason, judge = (cell.strip() for cell in row)
                if verdict.upper() not in VERDICTS:
                    raise VerdictError(f"{where}: verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
                if not reason or not judge:
                    raise VerdictError(f"{where}: a verdict needs a reason and a judge")
                entry = Verdict(fid, verdict.upper(), reason, judge, where)
                previous = verdicts.get(fid)
                if previous and previous.verdict != entry.verdict:
                    raise VerdictError(f"{where}: {fid} is {entry.verdict} here but {previous.verdict} at "
                                       f"{previous.source}")
                verdicts.setdefault(fid, entry)
    return verdicts


# ---- figures -------------------------------------------------------------------------------------

@dataclass
class Figures:
    findings: int = 0
    judged: int = 0
    tp: int = 0
    noise: int = 0
    fp: int = 0
    weight: float = 0.0  # the judged findings' weights: the findings they stand for
    weight_squares: float = 0.0
    weighted_tp: float = 0.0
    weighted_fp: float = 0.0
    uncovered: int = 0  # findings in strata with no verdict at all

    @property
    def precision(self) -> Optional[float]:
        return self.tp / self.judged if self.judged else None

    @property
    def fp_rate(self) -> Optional[float]:
        return self.fp / self.judged if self.judged else None

    @property
    def effective_n(self) -> float:
        return self.weight ** 2 / self.weight_squares if self.weight_squares else 0.0

    @property
    def weighted_precision(self) -> Optional[float]:
        return self.weighted_tp / self.weight if self.weight else None

    @property
    def weighted_fp_rate(self) -> Optional[float]:
        return self.weighted_fp / self.weight if self.weight else None

    def interval(self, kind: str) -> tuple[float, float]:
        if kind == "precision":
            return wilson(self.tp, self.judged)
        if kind == "fp":
            return wilson(self.fp, self.judged)
        n = self.effective_n
        share = self.weighted_precision if kind == "weighted_precision" else self.weighted_fp_rate
        return wilson((share or 0.0) * n, n)


def tally(findings: list[CorpusFinding], sides: dict[str, str], sample: list[CorpusFinding],
          verdicts: dict[str, Verdict]) -> dict[tuple[str, str, str], Figures]:
    """Figures keyed by (split, dimension, value): dimension ``rule``, ``severity`` or ``all``."""
    totals = Counter(stratum_of(f, sides) for f in findings)
    judged = [f for f in sample if f.id in verdicts]
    judged_per_stratum = Counter(stratum_of(f, sides) for f in judged)
    figures: dict[tuple[str, str, str], Figures] = defaultdict(Figures)

    def groups(side: str, rule: str, severity: str):
        return (side, "rule", rule), (side, "severity", severity), (side, "all", "all")

    for (side, rule, severity), count in totals.items():
        for key in groups(side, rule, severity):
            figures[key].findings += count
            if not judged_per_stratum[(side, rule, severity)]:
                figures[key].uncovered += count
    for f in judged:
        stratum = stratum_of(f, sides)
        weight = totals[stratum] / judged_per_stratum[stratum]
        verdict = verdicts[f.id].verdict
        for key in groups(*stratum):
            fig = figures[key]
            fig.judged += 1
            fig.tp += verdict == "TP"
            fig.noise += verdict == "NOISE"
            fig.fp += verdict == "FP"
            fig.weight += weight
            fig.weight_squares += weight * weight
            fig.weighted_tp += weight * (verdict == "TP")
            fig.weighted_fp += weight * (verdict == "FP")
    return dict(figures)


def _share(value: Optional[float], interval: tuple[float, float]) -> str:
    if value is None:
        return "–"
    return f"{value:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def render(figures: dict[tuple[str, str, str], Figures], markdown: bool) -> str:
    columns = ("findings", "judged", "TP", "NOISE", "FP", "precision (sample)", "FP rate (sample)",
               "precision (all findings)", "FP rate (all findings)", "not covered")
    out = []
    for dimension in ("all", "severity", "rule"):
        values = sorted({key[2] for key in figures if key[1] == dimension},
                        key=lambda v: (SEVERITIES.index(v) if v in SEVERITIES else 99, v))
        for side in SPLITS:
            rows = []
            for value in values:
                fig = figures.get((side, dimension, value))
                if fig is None:
                    continue
                rows.append([value, fig.findings, fig.judged, fig.tp, fig.noise, fig.fp,
                             _share(fig.precision, fig.interval("precision")),
                             _share(fig.fp_rate, fig.interval("fp")),
                             _share(fig.weighted_precision, fig.interval("weighted_precision")),
                             _share(fig.weighted_fp_rate, fig.interval("weighted_fp")), fig.uncovered])
            if not rows:
                continue
            title = f"{side}: " + ("overall" if dimension == "all" else f"per {dimension}")
            header = [dimension if dimension != "all" else "", *columns]
            out.append(_table(title, header, rows, markdown))
    return "\n".join(out)


def _table(title: str, header: list, rows: list[list], markdown: bool) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines) + "\n"
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


# ---- levels (analyzers/levels.py) ---------------------------------------------------------------

def measured_rows(sample: list[CorpusFinding], sides: dict[str, str], verdicts: dict[str, Verdict]) -> list[tuple]:
    """(id, rule, severity) of every judged holdout finding of the sample: what the levels are measured on."""
    return sorted((f.id, f.rule, f.severity) for f in sample if sides[f.repo] == "holdout" and f.id in verdicts)


def read_measured(path: Path = MEASURED) -> list[tuple]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [tuple(row) for row in csv.reader(handle, delimiter="\t") if row and row[0] != "id"]


def write_measured(path: Path, rows: list[tuple]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(("id", "rule", "severity"))
        writer.writerows(rows)


def rule_levels(rows: list[tuple], verdicts: dict[str, Verdict]) -> dict:
    """levels.json's content: every rule's level, severity cap and holdout measure (analyzers.levels.decide)."""
    from analyzers.rules import all_rules, canonical_rule_id

    overall: dict[str, Measure] = defaultdict(Measure)
    by_severity: dict[str, dict[str, Measure]] = defaultdict(lambda: defaultdict(Measure))
    for fid, rule, severity in rows:
        rule = canonical_rule_id(rule)  # a merged rule's findings count for the rule it was folded into
        overall[rule].add(verdicts[fid].verdict)
        by_severity[rule][severity].add(verdicts[fid].verdict)
    return {"rules": {rule.id: decide(rule, overall[rule.id], by_severity[rule.id])
                      for rule in sorted(all_rules(), key=lambda r: r.id)}}


def write_levels(path: Path, levels: dict) -> None:
    path.write_text(json.dumps(levels, indent=1, sort_keys=True) + "\n", encoding="utf-8")


# ---- the command ---------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("analyze", "sheet", "report", "levels"))
    parser.add_argument("--list", type=Path, default=CORPUS_DIR / "repos.tsv")
    parser.add_argument("--split", type=Path, default=CORPUS_DIR / "split.tsv")
    parser.add_argument("--cache", type=Path, default=None, help="the extracted corpus (bench/corpus/fetch.py)")
    parser.add_argument("--findings", type=Path, default=None, help="the engine's findings, one JSON per repository")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rerun", action="store_true", help="analyze again what was analyzed at its commit")
    parser.add_argument("--repo-timeout", type=float, default=1800,
                        help="analyze: seconds one repository may take (0: no limit, in this process)")
    parser.add_argument("--per-stratum", type=int, default=DEFAULT_PER_STRATUM)
    parser.add_argument("--seed", default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=None, help="sheet: where to write it (default stdout)")
    parser.add_argument("--unjudged", action="store_true", help="sheet: only the findings no verdict covers")
    parser.add_argument("--verdicts", type=Path, default=CORPUS_DIR / "verdicts")
    parser.add_argument("--markdown", action="store_true", help="report: Markdown tables")
    args = parser.parse_args(argv)

    entries = read_repos(args.list)
    sides = split_of(entries, read_split(args.split))
    out = args.findings or default_findings_dir()
    if args.step == "analyze":
        # holdout first: its figures are the ones published, and a long run may be cut short
        ordered = sorted(entries, key=lambda e: sides[e.repo] != "holdout")
        absent = analyze_corpus(ordered, args.cache or default_cache(), out, args.jobs, args.rerun,
                                args.repo_timeout or None)
        if absent:
            print(f"not extracted at their commit ({len(absent)}; run bench/corpus/fetch.py): {' '.join(absent)}")
        return 1 if absent else 0

    findings, absent = load_findings(out, entries)
    slow = timed_out(out, entries)
    if slow:
        print(f"note: the engine did not finish on {len(slow)} repositories within the analyze step's timeout, "
              "left out: " + " ".join(slow), file=sys.stderr)
    if absent:
        print(f"note: {len(absent)} of {len(entries)} repositories have no findings in {out} (run analyze): "
              + " ".join(absent), file=sys.stderr)
    sample, totals = draw_sample(findings, sides, args.per_stratum, args.seed)
    verdicts = read_verdicts(args.verdicts) if args.verdicts.is_dir() else {}
    if args.step == "sheet":
        if args.unjudged:
            sample = [f for f in sample if f.id not in verdicts]
        target = args.out or Path("/dev/stdout")
        write_sheet(target, sample, sides, totals)
        if args.out:
            print(f"{len(sample)} findings to judge in {args.out}")
        return 0

    if args.step == "levels":
        rows = measured_rows(sample, sides, verdicts)
        write_measured(MEASURED, rows)
        write_levels(LEVELS_FILE, rule_levels(rows, verdicts))
        print(f"{len(rows)} judged holdout findings in {MEASURED}; levels in {LEVELS_FILE}")
        return 0

    known = {f.id for f in findings}
    counted = {f.id for f in sample} & set(verdicts)
    stale = set(verdicts) - known
    repos = {side: sum(1 for e in entries if sides[e.repo] == side and e.repo not in absent) for side in SPLITS}
    print(f"corpus: {len(entries) - len(absent)} repositories analyzed (tune {repos['tune']}, holdout "
          f"{repos['holdout']}), {len(findings)} findings; sample {len(sample)} (seed {args.seed!r}, "
          f"{args.per_stratum} a stratum, all high/critical on holdout); {len(counted)} judged")
    if slow:
        print(f"left out, the engine did not finish them within the analyze timeout: {' '.join(slow)}")
    failures = engine_failures(out, [e for e in entries if e.repo not in absent])
    if failures:
        print(f"incomplete, files the engine failed on (analyze again on a quieter machine redoes the ones that ran "
              f"out of time; quote no figure before): " + "; ".join(
                  f"{repo} ({', '.join(f'{k} {n}' for k, n in kinds.items())})" for repo, kinds in failures.items()))
    if stale or set(verdicts) - stale - counted:
        print(f"verdicts not counted: {len(stale)} on findings the engine no longer reports, "
              f"{len(set(verdicts) - stale - counted)} on findings outside the sample")
    print()
    print(render(tally(findings, sides, sample, verdicts), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
