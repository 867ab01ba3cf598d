"""Smoke-train targets from head (and base) revisions, each in a sandboxed child, and compare them.

The runner never holds a GitHub credential: it gets two directories of code and returns reports.
Children run one target of one revision each (a crash or a timeout costs only that run), head and
base alternating, with the same seed and batch, so their timings see the same machine state.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from gpu_runner.child import RESULT_PREFIX
from gpu_runner.sandbox import SandboxLimits, run_sandboxed

log = logging.getLogger("torchreview.smoke")
PACKAGE_PARENT = Path(__file__).resolve().parents[1]  # makes ``gpu_runner`` importable in the child


@dataclass
class TargetRequest:
    target: str  # "path/to/file.py:Name"
    line: int = 1  # where the class is, for inline comments
    config: Optional[dict] = None  # the repo's smoke settings for it (factory, input, task, loss)


@dataclass
class TargetOutcome:
    target: str
    line: int
    head: dict
    base: Optional[dict] = None
    comparison: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.head.get("status", "error")


@dataclass
class SmokeRun:
    outcomes: list[TargetOutcome]
    device: str
    seconds: float
    warnings: list[str] = field(default_factory=list)  # sandbox layers that were unavailable, etc.

    @property
    def failed(self) -> bool:
        return any(o.status in ("failed", "error") for o in self.outcomes) or any(
            c.get("regression") for o in self.outcomes for c in o.comparison)

    def to_dict(self) -> dict:
        return {"device": self.device, "seconds": round(self.seconds, 2), "warnings": self.warnings,
                "targets": [{"target": o.target, "line": o.line, "status": o.status, "head": o.head, "base": o.base,
                             "comparison": o.comparison} for o in self.outcomes]}


def run_target(code_dir: Path, request: TargetRequest, *, device: str, steps: int, seed: int,
               limits: SandboxLimits, sandbox: bool = True) -> tuple[dict, list[str]]:
    """One target of one revision in a fresh child process; (report, sandbox warnings)."""
    job = {"code_root": str(code_dir), "targets": [{"target": request.target, "config": request.config}],
           "device": device, "steps": steps, "seed": seed}
    argv = [sys.executable, "-m", "gpu_runner.child"]
    payload = json.dumps(job).encode()
    if sandbox:
        result = run_sandboxed(argv, code_dir=code_dir, limits=limits, python_paths=[PACKAGE_PARENT, code_dir],
                               stdin=payload, gpu=device.startswith("cuda"),
                               env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        stdout, stderr, warnings = result.stdout, result.stderr, list(result.warnings)
        if result.timed_out:
            return _error(request.target, f"timed out after {limits.timeout_s:.0f}s (smoke.timeout); the whole process "
                                          "tree was killed"), warnings
        returncode = result.returncode
    else:
        proc = subprocess.run(argv, input=payload, capture_output=True, cwd=code_dir,
                              env={"PYTHONPATH": f"{PACKAGE_PARENT}:{code_dir}", "PATH": "/usr/bin:/bin",
                                   "OMP_NUM_THREADS": "1"}, timeout=limits.timeout_s)
        stdout, stderr, warnings = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"), []
        returncode = proc.returncode
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX):]), warnings
            except ValueError:
                break
    tail = (stderr or stdout).strip().splitlines()[-6:]
    detail = " | ".join(tail)[-800:] or f"exit status {returncode}"
    if returncode is not None and returncode < 0 or "MemoryError" in detail:
        detail = f"killed or out of memory (smoke.memory): {detail}"
    return _error(request.target, f"the smoke child produced no result: {detail}"), warnings


def _error(target: str, reason: str) -> dict:
    return {"target": target, "status": "error", "checks": [], "measures": {}, "reason": reason, "notes": []}


def smoke(head_dir: Path, requests: list[TargetRequest], *, base_dir: Optional[Path] = None, device: str = "cpu",
          steps: int = 50, seed: int = 0, limits: SandboxLimits = SandboxLimits(),
          thresholds: Optional[dict] = None, sandbox: bool = True) -> SmokeRun:
    from gpu_runner.compare import compare_reports

    started = time.perf_counter()
    outcomes: list[TargetOutcome] = []
    warnings: list[str] = []
    for request in requests:
        head, head_warnings = run_target(head_dir, request, device=device, steps=steps, seed=seed, limits=limits,
                                         sandbox=sandbox)
        outcome = TargetOutcome(request.target, request.line, head)
        _merge(warnings, head_warnings)
        path = request.target.split(":", 1)[0]
        if base_dir is not None and (base_dir / path).is_file() and head.get("status") in ("passed", "failed"):
            base, base_warnings = run_target(base_dir, request, device=device, steps=steps, seed=seed, limits=limits,
                                             sandbox=sandbox)
            _merge(warnings, base_warnings)
            if base.get("status") in ("passed", "failed"):
                outcome.base = base
                outcome.comparison = compare_reports(head, base, thresholds)
        outcomes.append(outcome)
    return SmokeRun(outcomes, device, time.perf_counter() - started, warnings)


def _merge(into: list[str], new: list[str]) -> None:
    for item in new:
        if item not in into:
            into.append(item)
