"""The smoke runner's cost per target, and what the sandbox adds.

For each fixture model (tests/fixtures/models) it prints the seconds for:
- in-process: ``smoke_one`` called in this process, torch already imported (the work itself);
- plain child: a fresh Python process without any sandbox layer (adds interpreter + ``import torch``);
- sandboxed: the same child inside the sandbox (namespaces, uid, read-only code, rlimits);
and the ratios sandboxed / plain child (the sandbox's own overhead) and sandboxed / in-process.

    python bench/smoke.py [--steps 50] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "models"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import torch

    from gpu_runner.child import smoke_one
    from gpu_runner.runner import TargetRequest, run_target
    from gpu_runner.sandbox import SandboxLimits, available_layers
    from gpu_runner.targets import find_targets

    print(f"torch {torch.__version__}, device cpu, {args.steps} steps, median of {args.repeat}")
    print(f"sandbox layers: {', '.join(k for k, v in available_layers().items() if v) or 'none'}")
    unavailable = [k for k, v in available_layers().items() if not v]
    if unavailable:
        print(f"unavailable here: {', '.join(unavailable)}")
    print()
    print(f"| {'target':<34} | status | in-process s | plain child s | sandboxed s | sandbox/child | sandbox/in-process |")
    print(f"|{'-' * 36}|--------|-------------:|--------------:|------------:|--------------:|-------------------:|")
    limits = SandboxLimits(timeout_s=300)
    totals = {"inproc": 0.0, "child": 0.0, "sandbox": 0.0}
    for file in sorted(FIXTURES.glob("*.py")):
        relative = file.relative_to(FIXTURES).as_posix()
        for target in find_targets({relative: file.read_text()}, {relative: None}):
            name = f"{relative}:{target.name}"
            request = TargetRequest(name, target.line)
            inproc, child, sandboxed = [], [], []
            status = "?"
            for _ in range(args.repeat):
                started = time.perf_counter()
                status = smoke_one(FIXTURES, name, None, "cpu", args.steps, 0)["status"]
                inproc.append(time.perf_counter() - started)
                started = time.perf_counter()
                run_target(FIXTURES, request, device="cpu", steps=args.steps, seed=0, limits=limits, sandbox=False)
                child.append(time.perf_counter() - started)
                started = time.perf_counter()
                run_target(FIXTURES, request, device="cpu", steps=args.steps, seed=0, limits=limits, sandbox=True)
                sandboxed.append(time.perf_counter() - started)
            i, c, s = statistics.median(inproc), statistics.median(child), statistics.median(sandboxed)
            totals["inproc"] += i
            totals["child"] += c
            totals["sandbox"] += s
            print(f"| {name:<34} | {status:<6} | {i:>12.2f} | {c:>13.2f} | {s:>11.2f} | {s / c:>13.2f} | {s / i:>18.2f} |")
    t = totals
    print(f"| {'all targets':<34} |        | {t['inproc']:>12.2f} | {t['child']:>13.2f} | {t['sandbox']:>11.2f} | "
          f"{t['sandbox'] / t['child']:>13.2f} | {t['sandbox'] / t['inproc']:>18.2f} |")


if __name__ == "__main__":
    main()
