"""TorchFix's own test fixtures through torchreview, via analyzers.torchfix_map.

TorchFix's repository (fetched, never committed) has ``tests/fixtures/**/checker/X.py`` with ``X.txt`` listing
what it flags (``LINE:COLUMN TORxxx message``) and ``**/codemod/X.in.py`` with the ``X.out.py`` its fixes give.
For every line TorchFix flags, this reports whether one of the rules the map gives for that code flags the
same line; for every change TorchFix's fixes make, whether our fixes (unsafe ones included, as its codemod
applies everything) make the same change. Each fixture is analyzed alone, copied into an empty directory,
as TorchFix's tests check it (a repository around it would change what the version-aware rules say).

    git clone https://github.com/pytorch-labs/torchfix /tmp/torchfix
    python bench/torchfix_fixtures.py --fixtures /tmp/torchfix/tests/fixtures [--json out.json]
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzers.config import Config  # noqa: E402
from analyzers.engine import analyze_file  # noqa: E402
from analyzers.fixer import fix_source  # noqa: E402
from analyzers.torchfix_map import TORCHFIX_CODES, rules_for_torchfix  # noqa: E402

EXPECTED_LINE = re.compile(r"(\d+):(\d+) (TOR\d{3}) ")
# every TorchFix code we cover, as one selection: what a migrated configuration turns on
MAPPED = Config().merged_with_cli(select=[e.code for e in TORCHFIX_CODES if e.rules])


def expected_flags(txt: Path) -> list[tuple[int, str]]:
    flags = []
    for raw in txt.read_text().splitlines():
        match = EXPECTED_LINE.match(raw)
        if not match:
            raise SystemExit(f"{txt}: unexpected line {raw!r} (TorchFix writes LINE:COLUMN TORxxx message)")
        flags.append((int(match.group(1)), match.group(3)))
    return flags


def isolated_copy(source: Path, scratch: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=scratch))
    target = folder / source.name.replace(".in.py", ".py")
    shutil.copyfile(source, target)
    return target


def check_checker(py: Path, fixtures: Path, scratch: Path) -> list[dict]:
    result = analyze_file(isolated_copy(py, scratch), py.name, MAPPED)
    if result.errors:
        raise SystemExit(f"{py}: {result.errors}")
    rows = []
    for line, code in expected_flags(py.with_suffix(".txt")):
        covering = set(rules_for_torchfix(code))
        ours = sorted({f.rule for f in result.findings if f.line <= line <= f.end_line and f.rule in covering})
        rows.append({"fixture": str(py.relative_to(fixtures)), "line": line, "code": code,
                     "text": py.read_text().splitlines()[line - 1].strip(), "ours": ours})
    return rows


def check_codemod(source: Path, fixtures: Path, scratch: Path) -> list[dict]:
    before = source.read_text()
    after = source.with_name(source.name.replace(".in.py", ".out.py")).read_text()
    copy = isolated_copy(source, scratch)
    ours = fix_source(before, str(copy), MAPPED, unsafe=True).text
    before_lines, after_lines, ours_lines = before.splitlines(), after.splitlines(), ours.splitlines()
    # a change is the same when our output makes it at the same place: the same lines of the input replaced by
    # the same text (a content search would also find a repeated block of the fixture elsewhere)
    our_changes = {(i1, i2, tuple(ours_lines[j1:j2])) for tag, i1, i2, j1, j2 in _changes(before_lines, ours_lines)}
    rows = []
    for tag, i1, i2, j1, j2 in _changes(before_lines, after_lines):
        wanted = after_lines[j1:j2]
        rows.append({"fixture": str(source.relative_to(fixtures)), "line": i1 + 1,
                     "torchfix": wanted, "same_fix": (i1, i2, tuple(wanted)) in our_changes})
    return rows


def _changes(old: list[str], new: list[str]) -> list[tuple]:
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [op for op in matcher.get_opcodes() if op[0] != "equal"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, required=True, help="TorchFix's tests/fixtures directory")
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args(argv)
    fixtures = args.fixtures.resolve()
    checkers = sorted(fixtures.glob("**/checker/*.py"))
    codemods = sorted(fixtures.glob("**/codemod/*.in.py"))
    if not checkers:
        parser.error(f"{fixtures}: no **/checker/*.py fixtures (give TorchFix's tests/fixtures directory)")
    with tempfile.TemporaryDirectory() as scratch:
        flags = [row for py in checkers for row in check_checker(py, fixtures, Path(scratch))]
        fixes = [row for py in codemods for row in check_codemod(py, fixtures, Path(scratch))]

    by_code: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in flags:
        by_code[row["code"]][0] += bool(row["ours"])
        by_code[row["code"]][1] += 1
    print(f"{'code':8} {'flagged':>9}  rules")
    for code in sorted(by_code):
        hit, total = by_code[code]
        print(f"{code:8} {hit:>4}/{total:<4}  {', '.join(rules_for_torchfix(code)) or 'not covered'}")
    hit = sum(bool(r["ours"]) for r in flags)
    print(f"\nlines TorchFix flags that we flag through the map: {hit}/{len(flags)} = "
          f"{100 * hit / max(len(flags), 1):.1f} %")
    covered = [r for r in flags if rules_for_torchfix(r["code"])]
    covered_hit = sum(bool(r["ours"]) for r in covered)
    print(f"... of those whose code the map covers: {covered_hit}/{len(covered)} = "
          f"{100 * covered_hit / max(len(covered), 1):.1f} %")
    same = sum(r["same_fix"] for r in fixes)
    print(f"changes TorchFix's fixes make that our fixes make the same: {same}/{len(fixes)} = "
          f"{100 * same / max(len(fixes), 1):.1f} %")
    print("\nnot flagged:")
    for row in flags:
        if not row["ours"]:
            print(f"  {row['code']} {row['fixture']}:{row['line']}  {row['text'][:80]}")
    print("\nfix differs:")
    for row in fixes:
        if not row["same_fix"]:
            print(f"  {row['fixture']}:{row['line']}  TorchFix: {' / '.join(row['torchfix'])[:90]}")
    if args.json:
        args.json.write_text(json.dumps({"flags": flags, "fixes": fixes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
