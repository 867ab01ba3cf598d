"""Head vs base on identical code: how often the runner flags a regression that is not there (it must be never).

Runs ``smoke()`` with the same tree as head and base ``--runs`` times, as ``torchreview smoke --base HEAD`` does,
optionally with ``--burners`` busy-looping processes in the background (bursts of work and sleep), and prints
every run's step-time and peak-memory change, how many runs were flagged, and the load average.

    python bench/compare_identical.py [--runs 20] [--burners 2] [--target tests/fixtures/models/mlp.py:MLP]
                                      [--no-sandbox]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BURNER = ("import random, time\nend = time.time() + {seconds}\nwhile time.time() < end:\n"
          "    stop = time.time() + random.uniform(0, 0.4)\n    while time.time() < stop: pass\n"
          "    time.sleep(random.uniform(0, 0.4))\n")


def main() -> int:
    from gpu_runner.runner import TargetRequest, smoke
    from gpu_runner.sandbox import SandboxLimits

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burners", type=int, default=2, help="background busy-loop processes (0: none)")
    parser.add_argument("--target", default="tests/fixtures/models/mlp.py:MLP",
                        help="a target under the repository root, run as both head and base")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-sandbox", action="store_true", help="plain child processes (no bwrap)")
    args = parser.parse_args()

    burners = [subprocess.Popen([sys.executable, "-c", BURNER.format(seconds=3600)]) for _ in range(args.burners)]
    flagged = 0
    started = time.perf_counter()
    try:
        for index in range(args.runs):
            run = smoke(ROOT, [TargetRequest(args.target)], base_dir=ROOT, steps=args.steps, device="cpu",
                        limits=SandboxLimits(timeout_s=120), sandbox=not args.no_sandbox)
            if run.refused:
                print(f"the sandbox refused: {run.refused}")
                return 2
            (outcome,) = run.outcomes
            rows = {row["measure"]: row for row in outcome.comparison}
            flagged += any(row["regression"] for row in rows.values())
            cells = ", ".join(f"{name} {row['base']:.4g} -> {row['head']:.4g} {row['change']}"
                              f"{' FLAGGED' if row['regression'] else ''}"
                              for name, row in rows.items() if name in ("step time", "peak memory"))
            print(f"run {index + 1:>2}: {outcome.status}; {cells or outcome.head.get('reason', '')[:200]}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print(f"flagged {flagged}/{args.runs} runs of identical head and base ({time.perf_counter() - started:.0f}s, "
          f"{args.burners} burner(s))")
    print(f"load average (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
