"""The smoke runner on the runner corpus: how many real models it builds, why it skips the rest, whether it cries wolf.

The corpus is ``bench/smoke_real/targets.tsv`` (tab-separated, a header line, ``#`` comments), one model
class a row:

- ``repo`` (owner/name) and ``commit`` (40 hex digits, the same on every row of a repository);
- ``target``: ``path/to/file.py:Class``, as the runner takes it;
- ``expected``: what a correct runner does with the unmodified class, unconfigured, on CPU with the runner's
  environment (torch, numpy, einops, pandas, Lightning, pyyaml): ``built``; ``skip:<kind>`` for a stated reason
  (``missing-package:<name>`` when the class itself uses a package the runner lacks, ``no-parameters`` for an
  activation or a fixed encoding, ``needs-cuda`` for a forward that calls ``.cuda()`` unconditionally,
  ``upstream-bug`` for a class that cannot run as published); ``fail:<check>`` only for a known bug: planted,
  or found in the published code by reading it (the note says where);
- ``side``: ``tune`` or ``holdout``, the side of ``bench/corpus/split.tsv`` for a repository of the static
  corpus, else the parity of sha256("owner/name") (``bench.corpus.corpus.side_of``), unless the note says
  ``moved to tune`` and why;
- ``tags`` (styles: vision, nlp, rl, ...) and ``note`` (why the expected outcome is what it is).

A ``failed`` report on a row not expected to fail is a **false FAIL**; ``error`` is the runner's own fault.
The repositories' code is not in this checkout: ``--mirrors DIR`` extracts each repository at its commit into
``--repos DIR`` as ``DIR/owner+name`` (the sources of ``bench/corpus/fetch.py``); a repository no source has
is left out and reported.

    python bench/smoke_real.py --repos /tmp/smokereal [--mirrors DIR] [--side holdout] [--only owner/name,...]
                               [--steps 10] [--device cpu|cuda] [--json OUT] [--no-sandbox]
    python bench/smoke_real.py --report OUT [OUT ...]   # the figures again from saved runs, current expectations
    python bench/smoke_real.py --compare CPU.json CUDA.json   # targets whose outcome differs, paired time ratios

``--json`` is rewritten after each repository, so a run stopped part way keeps what it finished. ``--compare``
pairs two saved runs target by target (typically the same commit on ``--device cpu`` and ``--device cuda``):
the outcomes that differ (a FAIL on one device only is a device-specific failure, or a false FAIL on one) and
the median ratio of the built targets' times.

Each repository's targets run as one job (one warm interpreter in one sandbox, as the runner does for the
targets of one revision), one repository at a time. Time per target is what the harness measured for that
target inside the child (import of the target's module, build, checks), in wall-clock and in CPU time (the
second hardly depends on what else the machine runs); each job's wall time (which adds one interpreter start,
``import torch`` and the first optimizer step's imports) is printed per repository.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.corpus.corpus import (COMMIT_SHA, REPO_NAME, SPLITS, CorpusError, CorpusRepo, read_split,  # noqa: E402
                                 side_of, slug)

TARGETS = ROOT / "bench" / "smoke_real" / "targets.tsv"
COLUMNS = ("repo", "commit", "target", "expected", "side", "tags", "note")
MOVED = "moved to tune"
SKIP_KINDS = ("missing-package", "no-parameters", "needs-cuda", "upstream-bug")
BUILT = ("passed", "failed")
_TARGET = re.compile(r"^[\w./-]+\.py:[A-Za-z_]\w*$")


class TargetsError(CorpusError):
    pass


@dataclass(frozen=True)
class RunnerTarget:
    repo: str
    commit: str
    target: str
    expected: str
    side: str
    tags: tuple[str, ...]
    note: str

    @property
    def expects_build(self) -> bool:
        return self.expected == "built" or self.expected.startswith("fail:")


def _check_expected(expected: str) -> Optional[str]:
    """Why ``expected`` is malformed, or None."""
    if expected == "built":
        return None
    kind, _, detail = expected.partition(":")
    if kind == "fail":
        return None if detail else "fail: names the check the known bug fails"
    if kind != "skip":
        return "expected is built, skip:<kind> or fail:<check>"
    skip_kind, _, package = detail.partition(":")
    if skip_kind not in SKIP_KINDS:
        return f"skip kind {skip_kind!r} is not one of {', '.join(SKIP_KINDS)}"
    if (skip_kind == "missing-package") != bool(package):
        return "skip:missing-package:<name> names the package (and only it takes a detail)"
    return None


def read_targets(path: Path = TARGETS, split: Optional[dict[str, str]] = None) -> list[RunnerTarget]:
    """Every row, checked: columns, names, one commit per repository, no duplicate, the side rule."""
    split = read_split() if split is None else split
    rows: list[RunnerTarget] = []
    commits: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    with path.open(newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), 1):
            if not row or not row[0].strip() or row[0].startswith("#") or row[0] == "repo":
                continue
            where = f"{path}:{number}"
            if len(row) != len(COLUMNS):
                raise TargetsError(f"{where}: expected {len(COLUMNS)} tab-separated columns, got {len(row)}")
            repo, commit, target, expected, side, tags, note = (cell.strip() for cell in row)
            if not REPO_NAME.match(repo):
                raise TargetsError(f"{where}: {repo!r} is not owner/name")
            if not COMMIT_SHA.match(commit):
                raise TargetsError(f"{where}: {commit!r} is not a 40-digit commit")
            if commits.setdefault(repo, commit) != commit:
                raise TargetsError(f"{where}: {repo} is pinned to {commits[repo][:12]} on an earlier row")
            if not _TARGET.match(target):
                raise TargetsError(f"{where}: target {target!r} is not path/to/file.py:Class")
            if (repo, target) in seen:
                raise TargetsError(f"{where}: {repo} {target} is listed twice")
            seen.add((repo, target))
            problem = _check_expected(expected)
            if problem:
                raise TargetsError(f"{where}: {expected!r}: {problem}")
            if side not in SPLITS:
                raise TargetsError(f"{where}: side {side!r} is not one of {', '.join(SPLITS)}")
            rule_side = side_of(repo, split)
            if side != rule_side and not (side == "tune" and note.startswith(MOVED)):
                raise TargetsError(f"{where}: {repo} is on {side} but its side is {rule_side} "
                                   f"(a repository moves to tune only with a note '{MOVED}: why')")
            rows.append(RunnerTarget(repo, commit, target, expected, side,
                                     tuple(t for t in tags.split(",") if t), note))
    return rows


# ---- the report ----------------------------------------------------------------------------------

def reason_kind(report: dict) -> str:
    """A short category for a skip or an error."""
    reason = report.get("reason") or ""
    if "not installed" in reason:
        missing = reason.split("needs '", 1)[-1].split("'", 1)[0].split(".")[0]
        return f"missing package {missing}"
    for needle, kind in (("cannot guess constructor argument", "constructor argument"),
                         ("could not infer an input", "input not found"),
                         ("memory budget", "memory budget"),
                         ("raised", "constructor rejected the guesses"),
                         ("importing", "import failed"),
                         ("timed out", "timeout"),
                         ("needs CUDA", "needs CUDA"),
                         ("no trainable parameters", "no trainable parameters")):
        if needle in reason:
            return kind
    return reason[:60] or "?"


def expected_reason_kind(expected: str) -> Optional[str]:
    """The runner's reason kind (:func:`reason_kind`) an expected skip should come with, where it has one."""
    kind, _, package = expected.removeprefix("skip:").partition(":")
    if not expected.startswith("skip:"):
        return None
    return {"missing-package": f"missing package {package}", "no-parameters": "no trainable parameters"}.get(kind)


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _times(values: list[float]) -> dict:
    if not values:
        return {"median": None, "p90": None, "max": None}
    return {"median": statistics.median(values), "p90": _p90(values), "max": max(values)}


def summarize(results: list[tuple[RunnerTarget, dict]]) -> dict:
    """Per side (and all): the figures the bench prints, from (row, the runner's head report) pairs.

    Only targets that ran count; a repository left out (no source) is reported by the caller."""
    summary = {}
    for side in (*SPLITS, "all"):
        mine = [(row, head) for row, head in results if side in ("all", row.side)]
        built = [(row, head) for row, head in mine if head.get("status") in BUILT]
        expected_build = [(row, head) for row, head in mine if row.expects_build]
        summary[side] = {
            "targets": len(mine),
            "repositories": len({row.repo for row, _ in mine}),
            "built": len(built),
            "expected_build": len(expected_build),
            "built_of_expected": sum(1 for _, head in expected_build if head.get("status") in BUILT),
            "skipped": dict(Counter(reason_kind(head) for _, head in mine
                                    if head.get("status") == "skipped").most_common()),
            "skipped_as_expected": sum(1 for row, head in mine
                                       if head.get("status") == "skipped" and row.expected.startswith("skip:")),
            # an expected skip with a runner reason to compare (a missing package, no parameters) for another reason
            "skipped_for_another_reason": [
                f"{row.repo}/{row.target} ({reason_kind(head)}, expected {row.expected})" for row, head in mine
                if head.get("status") == "skipped"
                and expected_reason_kind(row.expected) not in (None, reason_kind(head))],
            "false_fails": [f"{row.repo}/{row.target}" for row, head in mine
                            if head.get("status") == "failed" and not row.expected.startswith("fail:")],
            "known_bugs_caught": sum(1 for row, head in mine
                                  if row.expected.startswith("fail:") and head.get("status") == "failed"),
            "known_bugs": sum(1 for row, _ in mine if row.expected.startswith("fail:")),
            "errors": [f"{row.repo}/{row.target}" for row, head in mine if head.get("status") == "error"],
            "time_s": _times([head.get("seconds") or 0.0 for _, head in built]),
            "cpu_s": _times([head.get("cpu_seconds") or 0.0 for _, head in built]),
            "per_repository": {
                repo: {"targets": sum(1 for row, _ in mine if row.repo == repo),
                       "built": sum(1 for row, head in built if row.repo == repo),
                       "expected_build": sum(1 for row, _ in expected_build if row.repo == repo),
                       "false_fails": sum(1 for row, head in mine if row.repo == repo
                                          and head.get("status") == "failed" and not row.expected.startswith("fail:")),
                       "errors": sum(1 for row, head in mine if row.repo == repo and head.get("status") == "error")}
                for repo in sorted({row.repo for row, _ in mine}, key=str.lower)},
        }
    return summary


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}s"


def format_summary(summary: dict) -> str:
    lines = []
    for side in (*SPLITS, "all"):
        figures = summary[side]
        total = figures["targets"]
        if not total:
            lines.append(f"{side}: no targets ran")
            continue
        lines.append(f"{side}: {total} targets from {figures['repositories']} repositories")
        lines.append(f"  built (unconfigured) {figures['built']}/{total} ({100 * figures['built'] / total:.0f}%); "
                     f"of those expected to build {figures['built_of_expected']}/{figures['expected_build']}")
        skipped = figures["skipped"]
        lines.append(f"  skipped {sum(skipped.values())} ({figures['skipped_as_expected']} expected to skip): "
                     + (", ".join(f"{kind} {n}" for kind, n in skipped.items()) or "none"))
        if figures["skipped_for_another_reason"]:
            lines.append("  skipped, but not for the expected reason: "
                         + ", ".join(figures["skipped_for_another_reason"]))
        false_fails = figures["false_fails"]
        lines.append(f"  false FAILs {len(false_fails)}" + (f" ({', '.join(false_fails)})" if false_fails else ""))
        if figures["known_bugs"]:
            lines.append(f"  known bugs (planted, or confirmed by reading) caught {figures['known_bugs_caught']}/"
                         f"{figures['known_bugs']}")
        errors = figures["errors"]
        lines.append(f"  runner errors {len(errors)}" + (f" ({', '.join(errors)})" if errors else ""))
        wall, cpu = figures["time_s"], figures["cpu_s"]
        lines.append(f"  time per built target: wall median {_seconds(wall['median'])}, p90 {_seconds(wall['p90'])}, "
                     f"max {_seconds(wall['max'])}; CPU median {_seconds(cpu['median'])}, p90 {_seconds(cpu['p90'])}")
    lines.append("")
    lines.append(f"| {'repository':<48} | side    | built / expected / targets | false FAILs | errors |")
    lines.append(f"|{'-' * 50}|---------|---------------------------:|------------:|-------:|")
    for side in SPLITS:
        for repo, figures in summary[side]["per_repository"].items():
            lines.append(f"| {repo:<48} | {side:<7} | {figures['built']:>5} / {figures['expected_build']:>8} / "
                         f"{figures['targets']:>7} | {figures['false_fails']:>11} | {figures['errors']:>6} |")
    return "\n".join(lines)


# ---- running -------------------------------------------------------------------------------------

def materialise_repositories(rows: list[RunnerTarget], repos_dir: Path, mirrors: Path) -> list[str]:
    """Extract each repository at its commit into ``repos_dir/owner+name``; returns those no mirror has."""
    from bench.corpus.fetch import materialise

    entries = {row.repo: CorpusRepo(row.repo, row.commit) for row in rows}
    return materialise(entries.values(), repos_dir, mirrors, use_clone=False)


def run_repository(repo: str, root: Path, rows: list[RunnerTarget], args: argparse.Namespace) -> list[dict]:
    from bot.smoke import VERDICT_WORDS, static_claims, target_verdicts, with_claims
    from gpu_runner.runner import TargetRequest, smoke
    from gpu_runner.sandbox import SandboxLimits

    # as the App does: the static findings of the targets' files that a run can decide go with them
    files = {row.target.split(":", 1)[0] for row in rows}
    claims = static_claims({f: (root / f).read_text(errors="replace") for f in files if (root / f).is_file()},
                           root=root)
    requests_ = [TargetRequest(row.target) for row in rows]
    with_claims(requests_, claims)
    started = time.perf_counter()
    run = smoke(root, requests_, steps=args.steps, device=args.device,
                limits=SandboxLimits(timeout_s=args.timeout), sandbox=not args.no_sandbox)
    wall = time.perf_counter() - started
    if run.refused:
        raise SystemExit(f"{repo}: the sandbox refused: {run.refused}")
    print(f"{repo}: {len(rows)} targets in {wall:.1f}s (one job); {sum(map(len, claims.values()))} static "
          "finding(s) a run can decide in their files", flush=True)
    for target, claim, verdict in target_verdicts(run.to_dict(), claims):
        print(f"  {VERDICT_WORDS[verdict['verdict']]}: {claim['rule']} at {claim['line']} on {target['target']}: "
              f"{verdict['evidence']}")
    heads = [outcome.head for outcome in run.outcomes]
    for row, head in zip(rows, heads):
        checks = head.get("checks") or []
        counts = Counter(c["status"] for c in checks)
        reason = "" if head["status"] in BUILT else reason_kind(head)
        failing = ",".join(c["name"] for c in checks if c["status"] == "fail")
        mark = "" if row.expects_build == (head["status"] in BUILT) else "  (expected " + row.expected + ")"
        print(f"  {head['status']:<7} {row.target:<60} {counts['fail']}/{counts['warn']}/{counts['skip']} {failing} "
              f"{reason} {_seconds(head.get('seconds'))}{mark}", flush=True)
        if args.verbose:
            for check in checks:
                if check["status"] in ("fail", "warn"):
                    print(f"      {check['status']} {check['name']}: {check['message'][:300]}")
            if head.get("reason"):
                print(f"      reason: {head['reason'][:400]}")
    return heads


def report_saved(paths: list[Path], rows: list[RunnerTarget]) -> int:
    """The summary of saved runs, each report matched to its row by ``owner/name/target``."""
    by_key = {f"{row.repo}/{row.target}": row for row in rows}
    results, stale = [], []
    for path in paths:
        for key, head in json.loads(path.read_text())["reports"].items():
            if key in by_key:
                results.append((by_key[key], head))
            else:
                stale.append(key)
    print(format_summary(summarize(results)))
    if stale:
        print(f"\nreports of targets no longer listed, left out: {', '.join(stale)}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repos", type=Path, help="folder holding each repository as DIR/owner+name")
    parser.add_argument("--mirrors", type=Path, help="git mirrors to extract missing repositories from "
                        "(the layouts bench/corpus/fetch.py reads)")
    parser.add_argument("--targets", type=Path, default=TARGETS,
                        help="the corpus (default bench/smoke_real/targets.tsv)")
    parser.add_argument("--side", choices=SPLITS, help="only this side")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per target")
    parser.add_argument("--only", default="", help="comma-separated repositories (owner/name or name)")
    parser.add_argument("--match", default="", help="comma-separated substrings: only targets containing one")
    parser.add_argument("--device", default="cpu", help="where the targets run: cpu (default) or cuda")
    parser.add_argument("--json", type=Path, help="write every report and the summary here (after each repository)")
    parser.add_argument("--no-sandbox", action="store_true", help="plain child processes (development only)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every failing check and reason")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the figures of earlier --json runs against the current targets file")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("FIRST", "SECOND"),
                        help="run nothing: the targets whose outcome differs between two saved runs, and time ratios")
    args = parser.parse_args(argv)
    if args.compare:
        print(compare_runs(*(json.loads(path.read_text()) for path in args.compare),
                           names=tuple(path.name for path in args.compare)))
        return 0
    if args.report:
        return report_saved(args.report, read_targets(args.targets))
    if args.repos is None:
        parser.error("give --repos DIR (or --report JSON)")
    if args.mirrors is not None and not args.mirrors.is_dir():
        parser.error(f"--mirrors {args.mirrors}: not a directory")

    rows = read_targets(args.targets)
    only = {name.lower() for name in args.only.split(",") if name}
    patterns = [m for m in args.match.split(",") if m]
    rows = [row for row in rows if (not args.side or row.side == args.side)
            and (not only or row.repo.lower() in only or row.repo.split("/", 1)[1].lower() in only)
            and (not patterns or any(m in row.target for m in patterns))]
    if not rows:
        parser.error("no target matches --side / --only / --match")
    missing: list[str] = []
    if args.mirrors is not None:
        args.repos.mkdir(parents=True, exist_ok=True)
        missing = materialise_repositories(rows, args.repos, args.mirrors)

    results: list[tuple[RunnerTarget, dict]] = []
    reports: dict[str, dict] = {}
    started = time.perf_counter()
    for repo in dict.fromkeys(row.repo for row in rows):
        root = args.repos / slug(repo)
        if not root.is_dir():
            if repo not in missing:
                missing.append(repo)
            continue
        mine = [row for row in rows if row.repo == repo]
        for row, head in zip(mine, run_repository(repo, root, mine, args)):
            results.append((row, head))
            reports[f"{repo}/{row.target}"] = head
        if args.json:
            _write_run(args.json, summarize(results), reports, missing, args)

    summary = summarize(results)
    print()
    print(format_summary(summary))
    print(f"\nwall time of the whole run {time.perf_counter() - started:.0f}s; "
          f"mode: {'plain child processes (--no-sandbox)' if args.no_sandbox else 'sandboxed'}")
    try:
        print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{v:.1f}' for v in os.getloadavg())} "
              f"on {os.cpu_count()} cores")
    except OSError:
        pass
    if missing:
        print(f"left out, not under {args.repos} and no mirror had the commit: {', '.join(missing)}")
    if args.json:
        _write_run(args.json, summary, reports, missing, args, complete=True)
    return 0


def _write_run(path: Path, summary: dict, reports: dict, missing: list[str], args: argparse.Namespace, *,
               complete: bool = False) -> None:
    path.write_text(json.dumps({"summary": summary, "reports": reports, "missing": missing, "device": args.device,
                                "sandboxed": not args.no_sandbox, "complete": complete}, indent=1, default=str))


def compare_runs(first: dict, second: dict, *, names: tuple[str, str] = ("first", "second")) -> str:
    """The targets both runs reached whose outcome differs, and the paired time ratio of those built in both."""
    a_name, b_name = names
    lines, ratios = [], []
    both = [key for key in first["reports"] if key in second["reports"]]
    for key in both:
        a, b = first["reports"][key], second["reports"][key]
        failing = [sorted(c["name"] for c in (r.get("checks") or []) if c["status"] == "fail") for r in (a, b)]
        if a.get("status") != b.get("status") or failing[0] != failing[1]:
            sides = [f"{name} {r.get('status')} {','.join(fails)} {'' if r.get('status') in BUILT else reason_kind(r)}"
                     for name, r, fails in ((a_name, a, failing[0]), (b_name, b, failing[1]))]
            lines.append(f"  {key}: {' | '.join(sides)}")
        if a.get("status") in BUILT and b.get("status") in BUILT and a.get("seconds") and b.get("seconds"):
            ratios.append(b["seconds"] / a["seconds"])
    head = (f"{len(both)} targets in both runs ({len(first['reports'])} in {a_name}, {len(second['reports'])} in "
            f"{b_name}); {len(lines)} with a different outcome")
    if ratios:
        head += (f"; built in both: {len(ratios)}, time {b_name}/{a_name} median {statistics.median(ratios):.2f}, "
                 f"p10 {sorted(ratios)[len(ratios) // 10]:.2f}, p90 {_p90(ratios):.2f}")
    return "\n".join([head, *lines])


if __name__ == "__main__":
    sys.exit(main())
