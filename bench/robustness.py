"""Does any program hang or break the analysis? Real files, mutated the way real code rebinds its values.

Each file of the corpus is analyzed as it is and as mutants that keep it valid Python but stress the program
model where it follows values: every assigned name or attribute rebound from itself (``x = x.to(d)``,
``x = f(x)``, ``self.m = self.m.cuda()``, ``x = x``, ``x += x``, a walrus), pairs of names bound from each
other (``a = b.to(d); b = a.to(d)``, ``a, b = b, a``, through ``self.`` attributes too), loops over
themselves (``for x in x:``), and statements shuffled, duplicated and deleted. Every analysis runs in a
forked child with a per-file limit (analyzers.isolation), so a hang is counted, never waited for.

    python bench/robustness.py PATH... [--mutants 4] [--seed 0] [--limit 20] [--jobs 2] [--slowest 15]
    python bench/robustness.py                  # the project's own examples and test fixtures

Prints files and mutants analyzed, hangs (over the limit), crashes, rule errors (internal errors), and the
slowest programs with their times; exits 1 when any program hung, crashed or broke a rule.
tests/test_generated_programs.py runs the same mutations over the rules' own examples.
"""
from __future__ import annotations

import argparse
import ast
import copy
import os
import random
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_REBINDINGS = (
    "{x} = {x}.to(device)",
    "{x} = {x}.cuda()",
    "{x} = helper({x})",
    "{x} = {x}",
    "{x} = ({x}, {x})[0]",
    "{x} = {x} if flag else {x}.float()",
    "{x} += {x}",
    "({x} := {x}.to(device))",
    "{x}.to(device)",
)
_PAIRS = (
    "{a} = {b}.to(device)\n{b} = {a}.to(device)",
    "{a}, {b} = {b}, {a}",
    "{a} = {b}\n{b} = {a}",
    "{a} = [{b}]\n{b} = {a}[0]",
)


def _targets(body: list[ast.stmt]) -> list[str]:
    """Names and ``self.x`` attributes a block assigns, in order."""
    found: list[str] = []
    for stmt in body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for node in ast.walk(target):
                text = None
                if isinstance(node, ast.Name):
                    text = node.id
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    text = ast.unparse(node)
                if text and text not in found:
                    found.append(text)
    return found


def _statements(text: str) -> list[ast.stmt]:
    return ast.parse(text).body


def _blocks(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def mutate(source: str, rng: random.Random, edits: int = 6) -> Optional[str]:
    """One mutant of ``source`` (valid Python), or None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    tree = copy.deepcopy(tree)
    blocks = list(_blocks(tree))
    if not blocks:
        return None
    for _ in range(edits):
        block = rng.choice(blocks)
        names = _targets(block)
        choice = rng.random()
        if names and choice < 0.4:
            x = rng.choice(names)
            template = rng.choice([t for t in _REBINDINGS if "." not in x or ":=" not in t])  # no walrus on attributes
            at = rng.randrange(len(block) + 1)
            block[at:at] = _statements(template.format(x=x))
        elif len(names) > 1 and choice < 0.6:
            a, b = rng.sample(names, 2)
            at = rng.randrange(len(block) + 1)
            block[at:at] = _statements(rng.choice(_PAIRS).format(a=a, b=b))
        elif names and choice < 0.7:
            x = rng.choice(names)
            if "." not in x:
                at = rng.randrange(len(block) + 1)
                block[at:at] = _statements(f"for {x} in {x}:\n    {x} = {x}.to(device)")
        elif len(block) > 1 and choice < 0.8:
            start = rng.randrange(len(block))
            end = min(len(block), start + rng.randint(2, 5))
            window = block[start:end]
            rng.shuffle(window)
            block[start:end] = window
        elif choice < 0.9:
            at = rng.randrange(len(block))
            block.insert(at, copy.deepcopy(block[at]))
        elif len(block) > 1:
            del block[rng.randrange(len(block))]
    try:
        return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    except (ValueError, RecursionError):
        return None


def programs(sources: dict[str, str], mutants: int, seed: int) -> list[tuple[str, str]]:
    """(name, source) for every source as it is and ``mutants`` mutants of each; deterministic for a seed."""
    out: list[tuple[str, str]] = []
    for name in sorted(sources):
        out.append((name, sources[name]))
        rng = random.Random(f"{seed}:{name}")
        for i in range(mutants):
            mutant = mutate(sources[name], rng)
            if mutant is not None:
                out.append((f"{name}~{i}", mutant))
    return out


def analyze_all(items: list[tuple[str, str]], limit: float, jobs: int):
    """{name: (seconds, errors)}: each program analyzed with every rule in a child bounded by ``limit``."""
    from analyzers.config import Config
    from analyzers.engine import analyze_source
    from analyzers.isolation import run_isolated
    from analyzers.model import FileError
    from analyzers.rules import all_rules

    all_rules()
    config = Config(preview=True)  # every rule, the preview ones too: a hang in any of them counts

    def timed(name: str, source: str):
        started = time.perf_counter()
        result = analyze_source(source, "program.py", config)
        return time.perf_counter() - started, [(e.kind, e.message) for e in result.errors]

    return run_isolated(items, timed, lambda name, kind, message: (limit, [(kind, message)]),
                        seconds=limit, jobs=jobs)


def problems(results) -> dict[str, list[tuple[str, str]]]:
    """The programs that hung, crashed the parser or broke a rule (a syntax error of the input is not ours)."""
    bad_kinds = {"timeout", "parser-crash", "rule-error"}
    return {name: [e for e in errors if e[0] in bad_kinds] for name, (_, errors) in results.items()
            if any(e[0] in bad_kinds for e in errors)}


def _corpus(paths: list[str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for raw in paths:
        root = Path(raw)
        candidates = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in candidates:
            inside = path.relative_to(root).parts if path != root else ()
            if any(part.startswith(".") or part == "__pycache__" for part in inside):
                continue
            try:
                files[str(path)] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return files


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=[str(ROOT / "examples"), str(ROOT / "tests" / "fixtures")])
    parser.add_argument("--mutants", type=int, default=4, help="mutants per file (besides the file itself)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=float, default=20.0, help="seconds per program before it counts as a hang")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args(argv)
    sources = _corpus(args.paths)
    items = programs(sources, args.mutants, args.seed)
    started = time.perf_counter()
    results = analyze_all(items, args.limit, args.jobs)
    wall = time.perf_counter() - started
    bad = problems(results)
    hangs = sum(1 for errors in bad.values() if any(kind == "timeout" for kind, _ in errors))
    crashes = sum(1 for errors in bad.values() if any(kind == "parser-crash" for kind, _ in errors))
    rule_errors = sum(1 for errors in bad.values() if any(kind == "rule-error" for kind, _ in errors))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{len(sources)} files, {len(items) - len(sources)} mutants, {len(items)} programs in {wall:.1f} s "
          f"(--jobs {args.jobs}, load average {load:.2f})")
    print(f"hangs (over {args.limit:g} s): {hangs}   parser crashes: {crashes}   rule errors: {rule_errors}")
    print(f"\nslowest {args.slowest}:")
    for name, (seconds, _) in sorted(results.items(), key=lambda kv: -kv[1][0])[:args.slowest]:
        print(f"  {seconds:7.3f} s  {name}")
    for name, errors in sorted(bad.items()):
        for kind, message in errors:
            print(f"{kind}: {name}: {message}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
