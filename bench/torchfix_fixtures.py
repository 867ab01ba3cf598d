"""TorchFix's own test fixtures through torchreview, via analyzers.torchfix_map.

TorchFix's repository (fetched, never committed) has ``tests/fixtures/**/checker/X.py`` with ``X.txt`` listing
what it flags (``LINE:COLUMN TORxxx message``) and ``**/codemod/X.in.py`` with the ``X.out.py`` its fixes give.
For every line TorchFix flags, this reports whether one of the rules the map gives for that code flags the
same line; for every change TorchFix's fixes make, whether our fixes (unsafe ones included, as its codemod
applies everything) make the same change. Both are measured two ways: with our default scope (every rule,
preview included, no TOR code selected: what a user who does not select TorchFix codes gets) and with every
TorchFix code selected (what a migrated TorchFix configuration gets: TorchFix's scope, analyzers.torchfix_map). Each fixture is analyzed alone, copied into an empty directory,
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
SCOPES = {
    # every rule at our own scope: the opt-in rules (TOR203/402/901's) do not run, no rule is widened
    "default": Config(preview=True),
    # every TorchFix code selected, as a migrated TorchFix configuration does
    "torchfix": Config().merged_with_cli(select=[e.code for e in TORCHFIX_CODES if e.rules]),
}


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
    results = {}
    for scope, config in SCOPES.items():
        results[scope] = analyze_file(isolated_copy(py, scratch), py.name, config)
        if results[scope].errors:
            raise SystemExit(f"{py}: {results[scope].errors}")
    rows = []
    for line, code in expected_flags(py.with_suffix(".txt")):
        covering = set(rules_for_torchfix(code))
        row = {"fixture": str(py.relative_to(fixtures)), "line": line, "code": code,
               "text": py.read_text().splitlines()[line - 1].strip()}
        for scope, result in results.items():
            row[scope] = sorted({f.rule for f in result.findings if f.line <= line <= f.end_line and f.rule in covering})
        rows.append(row)
    return rows


def check_codemod(source: Path, fixtures: Path, scratch: Path) -> list[dict]:
    before = source.read_text()
    after = source.with_name(source.name.replace(".in.py", ".out.py")).read_text()
    before_lines, after_lines = before.splitlines(), after.splitlines()
    # a change is the same when our output makes it at the same place: the same lines of the input replaced by
    # the same text (a content search would also find a repeated block of the fixture elsewhere)
    our_changes = {}
    for scope, config in SCOPES.items():
        ours_lines = fix_source(before, str(isolated_copy(source, scratch)), config, unsafe=True).text.splitlines()
        our_changes[scope] = {(i1, i2, tuple(ours_lines[j1:j2]))
                              for tag, i1, i2, j1, j2 in _changes(before_lines, ours_lines)}
    rows = []
    for tag, i1, i2, j1, j2 in _changes(before_lines, after_lines):
        wanted = after_lines[j1:j2]
        row = {"fixture": str(source.relative_to(fixtures)), "line": i1 + 1, "wanted": wanted}
        row.update({scope: (i1, i2, tuple(wanted)) in changes for scope, changes in our_changes.items()})
        rows.append(row)
    return rows


def _changes(old: list[str], new: list[str]) -> list[tuple]:
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [op for op in matcher.get_opcodes() if op[0] != "equal"]


def _share(hit: int, total: int) -> str:
    return f"{hit}/{total} = {100 * hit / max(total, 1):.1f} %"


def report(flags: list[dict], fixes: list[dict]) -> None:
    by_code: dict[str, list[dict]] = defaultdict(list)
    for row in flags:
        by_code[row["code"]].append(row)
    print(f"{'code':8} {'default':>9} {'torchfix':>9}  rules")
    for code in sorted(by_code):
        rows = by_code[code]
        hits = [f"{sum(bool(r[scope]) for r in rows)}/{len(rows)}" for scope in SCOPES]
        print(f"{code:8} {hits[0]:>9} {hits[1]:>9}  {', '.join(rules_for_torchfix(code)) or 'not covered'}")
    for scope, what in (("default", "our default scope (no TOR code selected)"),
                        ("torchfix", "every TorchFix code selected (TorchFix's scope)")):
        print(f"\n{what}:")
        print(f"  lines TorchFix flags that we flag through the map: {_share(sum(bool(r[scope]) for r in flags), len(flags))}")
        print(f"  changes TorchFix's fixes make that our fixes make the same: "
              f"{_share(sum(r[scope] for r in fixes), len(fixes))}")
        print("  not flagged:")
        for row in flags:
            if not row[scope]:
                print(f"    {row['code']} {row['fixture']}:{row['line']}  {row['text'][:80]}")
    print("\nfix differs (TorchFix's scope):")
    for row in fixes:
        if not row["torchfix"]:
            print(f"  {row['fixture']}:{row['line']}  TorchFix: {' / '.join(row['wanted'])[:90]}")


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

    report(flags, fixes)
    if args.json:
        args.json.write_text(json.dumps({"flags": flags, "fixes": fixes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
