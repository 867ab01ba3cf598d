"""Real-bug benchmark: buggy/fixed commit pairs from public history, replayed as pull requests.

``bench/realbugs/pairs.tsv`` lists the pairs (tab-separated, a header line, ``#`` comments):

- ``id``: a short name; ``repo``: owner/name; ``fixed`` / ``buggy``: the commit that fixed the bug and the
  commit before it (40 hex digits each);
- ``path``: the file the bug is in; ``lines``: where the bug is in the buggy commit, ``N`` or ``N-M`` (for a
  notebook, lines of the cell: ``cell:N`` or ``cell:N-M``);
- ``kind``: the bug in a few words; ``expected``: the rule that should report it (``TR101``), or
  ``out-of-scope`` when no rule of the catalog is about it; ``note``: how the pair was confirmed.

Each pair is replayed twice with the engine's ``introduced`` filter (``analyzers.diff.keep_introduced``, the
filter of ``torchreview check --diff`` and of the App):

- as the pull request that **introduces** the bug (base ``fixed``, head ``buggy``): *caught* when a finding
  of the expected rule, on the bug's file, overlaps its lines (2 lines of slack); every other finding the
  pull request gets is counted as *other*;
- as the pull request that **fixes** it (base ``buggy``, head ``fixed``): every finding it gets is counted
  (a fix should draw none).

Only the files the commit changes are analyzed, inside the tree at the head commit (the repository index
sees the files beside them). Mirrors come from ``bench/corpus/fetch.py``'s sources:

    python bench/realbugs.py --mirrors DIR [--clone] [--only ID ...] [--json OUT]

It prints caught / in scope / all for tune and holdout (a repository of the corpus is on its side in
``bench/corpus/split.tsv``; any other one on the side its name hashes to), the other findings per pull
request, and one line per pair.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.corpus.corpus import CorpusRepo, SPLITS, read_split, side_of  # noqa: E402
from bench.corpus.fetch import clone, find_mirror, write_tree  # noqa: E402
from analyzers.diff import DiffError  # noqa: E402

PAIRS = ROOT / "bench" / "realbugs" / "pairs.tsv"
COLUMNS = ("id", "repo", "fixed", "buggy", "path", "lines", "kind", "expected", "note")
OUT_OF_SCOPE = "out-of-scope"
SLACK = 2
_SHA = re.compile(r"^[0-9a-f]{40}$")
_LINES = re.compile(r"^(?:(\d+):)?(\d+)(?:-(\d+))?$")
_RULE = re.compile(r"^TR\d{3}$")
# what the replay writes of a tree: code, and the READMEs the repository index reads
_KEPT = (".py", ".ipynb", "README.md")


class PairError(ValueError):
    pass


@dataclass(frozen=True)
class Pair:
    id: str
    repo: str
    fixed: str
    buggy: str
    path: str
    cell: Optional[int]
    first: int
    last: int
    kind: str
    expected: str
    note: str = ""

    @property
    def in_scope(self) -> bool:
        return self.expected != OUT_OF_SCOPE


def read_pairs(path: Path = PAIRS) -> list[Pair]:
    pairs: list[Pair] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), 1):
            if not row or not row[0].strip() or row[0].startswith("#") or (number == 1 and row[0] == "id"):
                continue
            where = f"{path.name}:{number}"
            if len(row) < len(COLUMNS) - 1:
                raise PairError(f"{where}: expected the columns {', '.join(COLUMNS)}")
            pid, repo, fixed, buggy, file, lines, kind, expected = (cell.strip() for cell in row[:8])
            note = row[8].strip() if len(row) > 8 else ""
            if not _SHA.match(fixed) or not _SHA.match(buggy):
                raise PairError(f"{where}: fixed and buggy must be 40-digit commits")
            span = _LINES.match(lines)
            if not span:
                raise PairError(f"{where}: lines {lines!r} is not N, N-M, cell:N or cell:N-M")
            if expected != OUT_OF_SCOPE and not _RULE.match(expected):
                raise PairError(f"{where}: expected {expected!r} is neither a rule id nor {OUT_OF_SCOPE}")
            if any(p.id == pid for p in pairs):
                raise PairError(f"{where}: id {pid} is listed twice")
            cell = int(span.group(1)) if span.group(1) else None
            first = int(span.group(2))
            pairs.append(Pair(pid, repo, fixed, buggy, file, cell, first, int(span.group(3) or first), kind,
                              expected, note))
    return pairs


# ---- replaying a commit as a pull request ---------------------------------------------------------

def _git(args: list[str], cwd: Optional[Path] = None, git_dir: Optional[Path] = None) -> str:
    command = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    if git_dir is not None:
        command += ["--git-dir", str(git_dir)]
    done = subprocess.run(command + args, cwd=cwd, capture_output=True)
    if done.returncode != 0:
        raise PairError(f"git {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode("utf-8", errors="replace")


def replay(git_dir: Path, base: str, head: str, work: Path) -> list:
    """The findings a pull request from ``base`` to ``head`` gets (the introduced filter), as the App sees it."""
    from analyzers.diff import changed_lines_from_patch, keep_introduced
    from bench.precision import MEASURED_CONFIG, analyze_checkout

    patch = _git(["diff", "--no-color", "-U0", base, head, "--", "*.py", "*.ipynb"], git_dir=git_dir)
    changed = changed_lines_from_patch(patch) if patch.strip() else {}
    if not changed:
        return []
    tree = work / "tree"
    write_tree(git_dir, head, tree, keep=lambda path: path.endswith(_KEPT))
    # a throw-away repository whose HEAD holds the base side of the changed files beside the rest of the tree:
    # keep_introduced reads the base through `git show HEAD:path` and analyzes it in the tree at HEAD (the
    # files it imports, star imports included), as `torchreview check --diff HEAD` does in a user's checkout
    heads = {path: (tree / path).read_bytes() for path in changed if (tree / path).is_file()}
    _git(["init", "-q"], cwd=tree)
    for path in changed:
        try:
            base_text = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{base}:{path}"],
                                       capture_output=True, check=True).stdout
        except subprocess.CalledProcessError:
            (tree / path).unlink(missing_ok=True)  # new in head: absent from the base commit
            continue
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(base_text)
    _git(["add", "-A", "-f", "."], cwd=tree)
    _git(["commit", "-q", "--allow-empty", "-m", "base"], cwd=tree)
    for path, text in heads.items():
        (tree / path).write_bytes(text)
    _, result = analyze_checkout(tree, jobs=1, only=sorted(heads))
    return keep_introduced(result.findings, changed, "HEAD", MEASURED_CONFIG, cwd=str(tree))


def _hits(pair: Pair, finding) -> bool:
    """The expected rule on the bug's lines: at the finding's own site or one of its related sites (the other end
    of a two-site bug, where the App comments when the pull request changed that end: bot.review.finding_sites)."""
    if finding.rule != pair.expected or finding.path != pair.path or (finding.cell or None) != pair.cell:
        return False
    return any(line <= pair.last + SLACK and end >= pair.first - SLACK for line, end in
               [(finding.line, finding.end_line), *((site.line, site.end_line) for site in finding.related)])


@dataclass
class PairResult:
    id: str
    repo: str
    split: str
    kind: str
    expected: str
    caught: bool = False
    introducing_other: list[str] = field(default_factory=list)  # "path:line RULE" of the other findings
    fixing: list[str] = field(default_factory=list)
    error: str = ""


def run_pair(pair: Pair, git_dir: Path, split: str) -> PairResult:
    result = PairResult(pair.id, pair.repo, split, pair.kind, pair.expected)
    with tempfile.TemporaryDirectory(prefix="realbug-") as scratch:
        introduced = replay(git_dir, pair.fixed, pair.buggy, Path(scratch) / "introducing")
        fixing = replay(git_dir, pair.buggy, pair.fixed, Path(scratch) / "fixing")
    hits = [f for f in introduced if pair.in_scope and _hits(pair, f)]
    result.caught = bool(hits)
    result.introducing_other = [_where(f) for f in introduced if f not in hits]
    result.fixing = [_where(f) for f in fixing]
    return result


def _where(finding) -> str:
    cell = f"#{finding.cell}" if finding.cell else ""
    return f"{finding.path}{cell}:{finding.line} {finding.rule}"


# ---- the report ----------------------------------------------------------------------------------

def summarize(results: list[PairResult]) -> str:
    lines = []
    for side in (*SPLITS, "all"):
        chosen = [r for r in results if (side == "all" or r.split == side) and not r.error]
        if not chosen:
            continue
        in_scope = [r for r in chosen if r.expected != OUT_OF_SCOPE]
        caught = sum(r.caught for r in in_scope)
        other = sum(len(r.introducing_other) for r in chosen)
        fixing = sum(len(r.fixing) for r in chosen)
        lines.append(
            f"{side:8} pairs {len(chosen):3}  caught {caught} / in scope {len(in_scope)} / all {len(chosen)}"
            f"  |  other findings on the introducing PRs: {other} ({sum(bool(r.introducing_other) for r in chosen)}"
            f" PRs)  |  findings on the fixing PRs: {fixing} ({sum(bool(r.fixing) for r in chosen)} PRs)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=PAIRS)
    parser.add_argument("--split", type=Path, default=ROOT / "bench" / "corpus" / "split.tsv")
    parser.add_argument("--mirrors", type=Path, default=None, help="a directory of git mirrors (bench/corpus/fetch.py)")
    parser.add_argument("--clone", action="store_true", help="clone what no mirror has from GitHub")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "torchreview-realbugs",
                        help="where --clone keeps its clones")
    parser.add_argument("--only", nargs="*", default=None, help="only these pair ids")
    parser.add_argument("--json", type=Path, default=None, help="write every pair's result there")
    args = parser.parse_args(argv)
    if args.mirrors is None and not args.clone:
        parser.error("give --mirrors DIR, --clone, or both")
    pairs = read_pairs(args.pairs)
    if args.only:
        pairs = [p for p in pairs if p.id in set(args.only)]
    split = read_split(args.split)
    results = []
    for pair in pairs:
        entry = CorpusRepo(pair.repo, pair.fixed)
        git_dir = find_mirror(args.mirrors, entry) if args.mirrors else None
        if git_dir is None and args.clone:
            git_dir = clone(args.cache, entry)
        if git_dir is None:
            result = PairResult(pair.id, pair.repo, side_of(pair.repo, split), pair.kind, pair.expected,
                                error="no mirror has the commit")
        else:
            try:
                result = run_pair(pair, git_dir, side_of(pair.repo, split))
            except (PairError, DiffError) as exc:  # one pair the engine cannot replay does not stop the others
                result = PairResult(pair.id, pair.repo, side_of(pair.repo, split), pair.kind, pair.expected,
                                    error=str(exc))
        results.append(result)
        status = result.error or ("caught" if result.caught else ("missed" if pair.in_scope else "out of scope"))
        print(f"  {pair.id:28} {pair.expected:12} {status:12} other {len(result.introducing_other)}"
              f"  fix {len(result.fixing)}", flush=True)
    print()
    print(summarize(results))
    failed = [r for r in results if r.error]
    if failed:
        print(f"not replayed ({len(failed)}): " + ", ".join(f"{r.id} ({r.error})" for r in failed))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
