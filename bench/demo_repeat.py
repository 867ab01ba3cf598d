"""The demo's static part, N times back to back: does one-machine mode ever lose its worker?

Each run is a fresh `torchreview demo --part static` process (its own emulator, `torchreview serve`
on the embedded broker, a new data directory), as `scripts/demo.sh` runs it. A run succeeds when it
exits 0 (both check runs completed and shown). Prints each run's outcome and seconds, then the count.
The log of every failed run is kept and its path printed.

    python bench/demo_repeat.py [--runs 20] [--timeout 600]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)  # the embedded broker is what is measured
    logs = Path(tempfile.mkdtemp(prefix="torchreview-demo-repeat-"))
    successes, seconds = 0, []
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for run in range(1, args.runs + 1):
        log = logs / f"run-{run}.log"
        started = time.perf_counter()
        with open(log, "w") as out:
            try:
                code = subprocess.run([sys.executable, "-m", "bot.cli", "demo", "--part", "static"], cwd=ROOT,
                                      env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        took = time.perf_counter() - started
        seconds.append(took)
        if code == 0:
            successes += 1
            log.unlink()
            print(f"run {run}: ok in {took:.1f}s", flush=True)
        else:
            print(f"run {run}: FAILED ({code}) in {took:.1f}s; log {log}", flush=True)
    print(f"{successes}/{args.runs} successes; median {sorted(seconds)[len(seconds) // 2]:.1f}s per run; "
          f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if successes == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
