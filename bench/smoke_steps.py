"""Training steps run unconfigured: in how many repositories of the runner corpus that train, the runner finds a
training step and runs it, with nothing configured (issue 27's target: at least 60 % of those that have one).

A repository **trains** when a file outside its tests calls ``.backward(`` (read with ``ast``: a call of an
attribute named ``backward``), the same reading for every repository, so the denominator does not depend on what
the runner finds. In each such repository the runner's own discovery (``gpu_runner.targets.find_step_targets``
over every file, as on a PR that adds them all) names the candidate steps; each runs as the App runs one
(``smoke`` with ``kind="step"``, sandboxed, one job per repository). Per repository: steps found, steps that ran
(``passed`` or ``failed``: the step's own code ran for its iterations), the skip reasons, the failures (a step that
fails on published code is a finding to read: a real bug, or a false FAIL to fix).

    python bench/smoke_steps.py --repos /tmp/smokereal [--mirrors DIR] [--side holdout] [--only owner/name,...]
                                [--json OUT] [--no-sandbox]

The repositories are those of ``bench/smoke_real/targets.tsv`` (their sides as there), extracted as
``bench/smoke_real.py`` does.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.corpus.corpus import SPLITS, slug  # noqa: E402
from bench.smoke_real import TARGETS, materialise_repositories, read_targets  # noqa: E402

RAN = ("passed", "failed")
_SKIPPED_DIRS = {".git", "node_modules", "__pycache__", "site-packages", ".venv", "venv"}


def python_sources(root: Path) -> dict[str, str]:
    sources = {}
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _SKIPPED_DIRS]
        for name in files:
            if name.endswith(".py"):
                path = Path(directory, name)
                try:
                    sources[path.relative_to(root).as_posix()] = path.read_text(errors="replace")
                except OSError:
                    continue
    return sources


def _is_test_path(path: str) -> bool:
    parts = path.lower().split("/")
    return any(p in ("test", "tests", "testing") for p in parts[:-1]) or parts[-1].startswith("test_") \
        or parts[-1].endswith("_test.py") or parts[-1] == "conftest.py"


def trains(sources: dict[str, str]) -> list[str]:
    """The non-test files that call ``<something>.backward(...)``."""
    found = []
    for path, text in sources.items():
        if _is_test_path(path):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"
               for node in ast.walk(tree)):
            found.append(path)
    return sorted(found)


def run_repository(root: Path, args: argparse.Namespace) -> dict:
    from gpu_runner.runner import TargetRequest, smoke
    from gpu_runner.sandbox import SandboxLimits
    from gpu_runner.targets import find_step_targets

    sources = python_sources(root)
    training_files = trains(sources)
    result: dict = {"training_files": training_files, "steps": {}}
    if not training_files:
        return result
    candidates = find_step_targets(sources, {path: None for path in sources if not _is_test_path(path)})
    if not candidates:
        return result
    requests = [TargetRequest(f"{t.path}:{t.name}", line=t.line, kind="step") for t in candidates]
    run = smoke(root, requests, steps=args.steps, device=args.device, limits=SandboxLimits(timeout_s=args.timeout),
                sandbox=not args.no_sandbox)
    if run.refused:
        raise SystemExit(f"{root.name}: the sandbox refused: {run.refused}")
    for request, outcome in zip(requests, run.outcomes):
        head = outcome.head
        failing = [c["name"] for c in head.get("checks") or [] if c.get("status") == "fail"]
        result["steps"][request.target] = {"status": head.get("status"), "reason": (head.get("reason") or "")[:300],
                                           "failing": failing, "seconds": head.get("seconds")}
    return result


def summarize(results: dict[str, dict], sides: dict[str, str]) -> str:
    lines = []
    for side in (*SPLITS, "all"):
        mine = {repo: r for repo, r in results.items() if side == "all" or sides[repo] == side}
        training = [repo for repo, r in mine.items() if r["training_files"]]
        found = [repo for repo in training if mine[repo]["steps"]]
        ran = [repo for repo in found if any(s["status"] in RAN for s in mine[repo]["steps"].values())]
        steps = [s for repo in training for s in mine[repo]["steps"].values()]
        reasons = Counter(s["reason"].split(";")[0][:90] for s in steps if s["status"] not in RAN)
        share = f"{100 * len(ran) / len(training):.0f}%" if training else "-"
        lines.append(f"{side}: {len(mine)} repositories, {len(training)} train (a .backward( outside tests); a step "
                     f"found in {len(found)}, a step ran in {len(ran)} ({share} of those that train)")
        lines.append(f"  steps: {len(steps)} found, {sum(s['status'] in RAN for s in steps)} ran "
                     f"({sum(s['status'] == 'failed' for s in steps)} failed), "
                     f"{sum(s['status'] == 'skipped' for s in steps)} skipped, "
                     f"{sum(s['status'] == 'error' for s in steps)} errors")
        for reason, count in reasons.most_common(8):
            lines.append(f"    {count} x {reason}")
    lines.append("")
    for repo, r in sorted(results.items(), key=lambda item: (sides[item[0]], item[0].lower())):
        if not r["training_files"]:
            lines.append(f"{sides[repo]:<7} {repo}: does not train")
            continue
        lines.append(f"{sides[repo]:<7} {repo}: {len(r['steps'])} step(s) found")
        for target, step in r["steps"].items():
            detail = ",".join(step["failing"]) if step["status"] == "failed" else step["reason"][:120]
            lines.append(f"          {step['status']:<8} {target} {detail}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repos", type=Path, help="folder holding each repository as DIR/owner+name")
    parser.add_argument("--mirrors", type=Path, help="git mirrors to extract missing repositories from")
    parser.add_argument("--targets", type=Path, default=TARGETS)
    parser.add_argument("--side", choices=SPLITS)
    parser.add_argument("--only", default="", help="comma-separated repositories (owner/name or name)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-sandbox", action="store_true", help="plain child processes (development only)")
    args = parser.parse_args(argv)
    if args.repos is None:
        parser.error("give --repos DIR")
    rows = read_targets(args.targets)
    only = {name.lower() for name in args.only.split(",") if name}
    rows = [row for row in rows if (not args.side or row.side == args.side)
            and (not only or row.repo.lower() in only or row.repo.split("/", 1)[1].lower() in only)]
    if not rows:
        parser.error("no repository matches --side / --only")
    if args.mirrors is not None:
        args.repos.mkdir(parents=True, exist_ok=True)
        materialise_repositories(rows, args.repos, args.mirrors)
    sides = {row.repo: row.side for row in rows}
    results: dict[str, dict] = {}
    started = time.perf_counter()
    for repo in sides:
        root = args.repos / slug(repo)
        if not root.is_dir():
            print(f"{repo}: not under {args.repos}, left out", flush=True)
            continue
        results[repo] = run_repository(root, args)
        print(f"{repo}: {len(results[repo]['steps'])} step(s)", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"results": results, "sides": sides}, indent=1))
    print()
    print(summarize(results, {repo: sides[repo] for repo in results}))
    print(f"\nwall time {time.perf_counter() - started:.0f}s; load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
