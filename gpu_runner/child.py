"""The program that runs inside the sandbox: build each target from the PR's code and smoke it.

Reads a JSON job on stdin ``{"code_root", "targets": [{"target", "config"}], "device", "steps", "seed"}``
and prints one JSON line per target, prefixed with ``RESULT_PREFIX`` so that whatever the PR's code
prints itself can never be mistaken for a result.
"""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

RESULT_PREFIX = "@@torchreview-smoke-result@@ "


def _report(target: str, status: str, reason: str = "", **extra) -> dict:
    from gpu_runner.subject import TargetReport

    report = TargetReport(target=target, status=status, reason=reason)
    data = report.to_dict()
    data.update(extra)
    return data


def smoke_one(code_root: Path, target: str, config: dict | None, device: str, steps: int, seed: int) -> dict:
    from gpu_runner.build import CONFIGURE_HINT, Skip, build_subject, known_bug
    from gpu_runner.checks import run_checks

    try:
        subject = build_subject(code_root, target, device=device, config=config, seed=seed)
    except Exception as exc:  # noqa: BLE001 - the PR's code can raise anything while importing/constructing
        advice = known_bug(exc) or CONFIGURE_HINT
        return _report(target, "skipped", f"could not build {target}: {type(exc).__name__}: {exc}; {advice}",
                       traceback=traceback.format_exc(limit=5))
    if isinstance(subject, Skip):
        return _report(target, "skipped", subject.reason)
    try:
        report = run_checks(subject, steps=steps, seed=seed)
    except Exception as exc:  # noqa: BLE001
        return _report(target, "error", f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=5))
    data = report.to_dict()
    data["notes"] = list(subject.notes) + list(data.get("notes") or [])
    return data


def main() -> int:
    job = json.loads(sys.stdin.read())
    code_root = Path(job["code_root"])
    sys.path.insert(0, str(code_root))
    if not str(job.get("device", "cpu")).startswith("cuda"):
        import torch

        torch.set_num_threads(1)  # stable step times; spinning worker threads only slow a shared CPU
    for item in job["targets"]:
        result = smoke_one(code_root, item["target"], item.get("config"), job.get("device", "cpu"),
                           int(job.get("steps", 50)), int(job.get("seed", 0)))
        sys.stdout.write(RESULT_PREFIX + json.dumps(result, default=str) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
