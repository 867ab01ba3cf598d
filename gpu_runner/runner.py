"""Smoke-train targets from head (and base) revisions, each in a sandboxed child, and compare them.

The runner never holds a GitHub credential: it gets two directories of code and returns reports.
All targets of one revision run in one sandboxed child (one interpreter, one ``import torch``; a target
that crashes or times out costs only itself: the harness goes on with the rest in a fresh worker), head
first, then base, with the same seed and batch.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from gpu_runner.sandbox import SandboxLimits, SandboxRefused, run_sandboxed

log = logging.getLogger("torchreview.smoke")
# Only this package is bound into the sandbox (never the directory around it: a checkout may hold
# .torchreview-data, .env, keys).
PACKAGE_DIR = Path(__file__).resolve().parent
STATUSES = ("passed", "failed", "skipped", "error")
VERDICTS = ("confirmed", "refuted", "undecided")  # of gpu_runner.confirm's experiments on static findings
# gpu_runner.confirm has an experiment for each: on a built model, or (the TR1xx/TR2xx/TR7xx training-loop ones)
# while a step target runs the PR's training function
STEP_DECIDABLE_RULES = ("TR101", "TR104", "TR201", "TR713")
DECIDABLE_RULES = ("TR302", "TR401", "TR403", "TR513", "TR701") + STEP_DECIDABLE_RULES
CHECK_STATUSES = ("pass", "fail", "warn", "skip", "error")  # error: the check itself crashed (the runner's fault)
_MAX_TEXT = 4000  # characters per string of a report: the check run's summary has room for all targets
# One side (head or base) of one target's report, as the worker posts it and keeps it in Redis: PR code writes
# the report, so its size is bounded here (texts shortened, then checks left out), not by the child's 4 MiB.
MAX_REPORT_BYTES = 64 << 10
MAX_CHECKS = 40  # the runner's own checks are about a dozen
MAX_LOSS_POINTS = 500
MAX_STEP_TIMES = 100
# Rounds of step-time measurements after head's and base's own runs, base and head in fresh children in alternating
# order, so that a change of the machine's load between the two runs is not taken for a change of the code
# (gpu_runner.compare)
COMPARE_ROUNDS = 2


KINDS = ("model", "step")
# The operator's cap on one smoke job's wall time, head and base together: targets x smoke.timeout alone is
# unbounded (100 classes of a PR at 300 s each held the executor for 8 hours).
JOB_BUDGET_VARIABLE = "TORCHREVIEW_SMOKE_JOB_BUDGET_S"
DEFAULT_JOB_BUDGET_S = 1800.0


def job_budget_s(value: Optional[str] = None) -> float:
    """The job budget in seconds, from $TORCHREVIEW_SMOKE_JOB_BUDGET_S (a positive number) or the default."""
    raw = os.environ.get(JOB_BUDGET_VARIABLE, "") if value is None else value
    if not raw.strip():
        return DEFAULT_JOB_BUDGET_S
    try:
        budget = float(raw)
    except ValueError:
        budget = 0.0
    if not budget > 0 or budget == float("inf"):
        log.error("smoke: %s=%r is not a positive number of seconds; using %.0f", JOB_BUDGET_VARIABLE, raw,
                  DEFAULT_JOB_BUDGET_S)
        return DEFAULT_JOB_BUDGET_S
    return budget


BUDGET_REASON = (f"stopped when the smoke job's time budget ran out ({JOB_BUDGET_VARIABLE}, the operator's cap on "
                 "one job); its processes were killed")


@dataclass
class TargetRequest:
    target: str  # "path/to/file.py:Name"
    line: int = 1  # where the class is, for inline comments
    config: Optional[dict] = None  # the repo's smoke settings for it (factory, input, task, loss)
    kind: str = "model"  # "step": a training step (train.py:train_one_epoch, a Lightning module's training_step)
    # static findings of the target's file that a run can decide (gpu_runner.confirm's claims), head only
    findings: list = field(default_factory=list)


def configured_requests(smoke_settings: dict) -> list[TargetRequest]:
    """The requests that ``smoke.targets`` and ``smoke.steps`` (validated by analyzers.config) name; a table's
    other keys are the builder's options (``target`` / ``step`` name what to run, never an option)."""
    requests = []
    for kind, entries, name_key in (("model", smoke_settings.get("targets") or (), "target"),
                                    ("step", smoke_settings.get("steps") or (), "step")):
        for entry in entries:
            if isinstance(entry, str):
                requests.append(TargetRequest(entry, 1, None, kind))
                continue
            spec = entry.get(name_key) or entry.get("factory")
            options = {k: v for k, v in entry.items() if k != name_key}
            requests.append(TargetRequest(str(spec), 1, options or None, kind))
    return requests


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
    refused: Optional[str] = None  # why the sandbox refused to run PR code, and what the operator must do
    stopped: Optional[str] = None  # why the job stopped before every target ran (its time budget)

    @property
    def failed(self) -> bool:
        return any(o.status in ("failed", "error") for o in self.outcomes) or any(
            c.get("regression") for o in self.outcomes for c in o.comparison)

    def to_dict(self) -> dict:
        return {"device": self.device, "seconds": round(self.seconds, 2), "warnings": self.warnings,
                "refused": self.refused, "stopped": self.stopped,
                "targets": [{"target": o.target, "line": o.line, "status": o.status, "head": o.head, "base": o.base,
                             "comparison": o.comparison} for o in self.outcomes]}


def run_target(code_dir: Path, request: TargetRequest, *, device: str, steps: int, seed: int,
               limits: SandboxLimits, sandbox: bool = True, policy: Optional[str] = None) -> tuple[dict, list[str]]:
    """One target of one revision in a fresh child process; (report, sandbox warnings)."""
    reports, warnings = run_targets(code_dir, [request], device=device, steps=steps, seed=seed, limits=limits,
                                    sandbox=sandbox, policy=policy)
    return reports[0], warnings


def run_targets(code_dir: Path, requests: list[TargetRequest], *, device: str, steps: int, seed: int,
                limits: SandboxLimits, sandbox: bool = True, policy: Optional[str] = None,
                threads: Optional[int] = None, budget_s: Optional[float] = None,
                measure_only: bool = False) -> tuple[list[dict], list[str]]:
    """Every target of one revision in one sandboxed child: one interpreter and one ``import torch`` for all
    of them; (one report per request, sandbox warnings). ``limits.timeout_s`` holds per target (the harness
    kills a worker that runs past it and goes on with the next target in a fresh one); the sandbox's own
    wall-clock and CPU limits are that times the number of targets, or ``budget_s`` (what is left of the job's
    time budget) when that is less: then the targets not done by then are errors that say so. ``measure_only``:
    no checks, only the measures (a round of step times for comparing head and base).

    The reports come only from the result channel the trusted harness (gpu_runner.child) writes;
    the child's stdout and stderr are logs. Raises ``SandboxRefused`` when the sandbox refuses.
    """
    if not requests:
        return [], []
    count = len(requests)
    job = {"code_root": str(code_dir),
           "targets": [{"target": r.target, "config": r.config, "kind": r.kind, "findings": r.findings}
                       for r in requests],
           "device": device, "steps": steps, "seed": seed, "target_timeout_s": limits.timeout_s}
    if threads:
        job["threads"] = threads
    if measure_only:
        job["measure_only"] = True
    timeout_s = limits.timeout_s * count + 30
    over_budget = budget_s is not None and budget_s < timeout_s
    job_limits = replace(limits, timeout_s=budget_s if over_budget else timeout_s,
                         cpu_seconds=int(limits.cpu_seconds * count), result_bytes=limits.result_bytes * count)
    argv = [sys.executable, "-s", "-m", "gpu_runner.child"]
    payload = json.dumps(job).encode()
    threads_text = str(threads or 1)
    if sandbox:
        result = run_sandboxed(argv, code_dir=code_dir, limits=job_limits, packages=[PACKAGE_DIR], stdin=payload,
                               gpu=device.startswith("cuda"), result_channel=True, private_cwd=True, policy=policy,
                               env={"OMP_NUM_THREADS": threads_text, "MKL_NUM_THREADS": threads_text})
        stdout, stderr, warnings, channel = result.stdout, result.stderr, list(result.warnings), result.channel
        if result.timed_out and over_budget:
            return [_error(r.target, BUDGET_REASON) for r in requests], warnings
        if result.timed_out:
            reason = (f"timed out after {job_limits.timeout_s:.0f}s for {count} target(s) (smoke.timeout); the whole "
                      "process tree was killed")
            return [_error(r.target, reason) for r in requests], warnings
        returncode = result.returncode
    else:  # the benchmark's baseline: the same harness in a plain child process
        stdout, stderr, returncode, channel = _run_unsandboxed(argv, payload, code_dir, job_limits)
        warnings = []
    reports = _channel_reports(channel)
    if len(reports) == count:
        return [_sanitized(report, r.target) for report, r in zip(reports, requests)], warnings
    tail = (stderr or stdout).strip().splitlines()[-6:]
    detail = " | ".join(tail)[-800:] or f"exit status {returncode}"
    if returncode is not None and returncode < 0 or "MemoryError" in detail:
        detail = f"killed or out of memory (smoke.memory): {detail}"
    return [_error(r.target, f"the smoke child produced no result: {detail}") for r in requests], warnings


def _run_unsandboxed(argv: list[str], payload: bytes, code_dir: Path, limits: SandboxLimits):
    import tempfile

    read_end, write_end = os.pipe()
    try:
        with tempfile.TemporaryDirectory() as cwd:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=cwd, pass_fds=(write_end,),
                                    env={"PYTHONPATH": str(PACKAGE_DIR.parent), "PATH": "/usr/bin:/bin",
                                         "OMP_NUM_THREADS": "1", "TORCHREVIEW_RESULT_FD": str(write_end),
                                         "TORCHREVIEW_CODE_DIR": str(code_dir)})
            os.close(write_end)
            write_end = None
            stdout, stderr = proc.communicate(payload, timeout=limits.timeout_s)
            channel = b""
            while chunk := os.read(read_end, 1 << 16):
                channel += chunk
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)
    return stdout.decode(errors="replace"), stderr.decode(errors="replace"), proc.returncode, channel


def _channel_reports(channel: bytes) -> list[dict]:
    try:
        results = json.loads(channel.decode(errors="replace")).get("results")
    except (ValueError, AttributeError):
        return []
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []


def _text(value, limit: int = _MAX_TEXT) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def _sanitized(report: dict, target: str) -> dict:
    """The report in the shape the worker expects: known statuses, strings, numbers; under ``target``."""
    status = report.get("status") if report.get("status") in STATUSES else "error"
    checks = []
    for check in (report.get("checks") or [])[:MAX_CHECKS] if isinstance(report.get("checks"), list) else []:
        if isinstance(check, dict):
            checks.append({"name": _text(check.get("name", "?"), 200),
                           "status": check.get("status") if check.get("status") in CHECK_STATUSES else "fail",
                           "message": _text(check.get("message", "")),
                           "details": check["details"] if isinstance(check.get("details"), dict)
                           and len(json.dumps(check["details"], default=str)) <= 5 * _MAX_TEXT else {}})
    measures = {_text(k, 100): v for k, v in list((report.get("measures") or {}).items())[:50]
                if isinstance(k, str) and (isinstance(v, (int, float)) and not isinstance(v, bool) or v is None)} \
        if isinstance(report.get("measures"), dict) else {}
    clean = {"target": target, "status": status, "checks": checks, "measures": measures,
             "reason": _text(report.get("reason") or ""),
             "notes": [_text(n) for n in report.get("notes") or [] if isinstance(n, str)][:50]}
    clean["findings"] = [_sanitized_verdict(f) for f in report.get("findings") or [] if isinstance(f, dict)
                         and f.get("verdict") in VERDICTS and isinstance(f.get("line"), int)][:50]
    for key in ("seconds", "cpu_seconds"):
        if isinstance(report.get(key), (int, float)) and not isinstance(report.get(key), bool):
            clean[key] = float(report[key])
    times = report.get("step_times_ms")
    if isinstance(times, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in times):
        clean["step_times_ms"] = [float(x) for x in times[:MAX_STEP_TIMES]]
    for key in ("traceback", "loss_curve"):
        if key in report:
            clean[key] = report[key][:MAX_LOSS_POINTS] if key == "loss_curve" and isinstance(report[key], list) and all(
                isinstance(x, (int, float)) for x in report[key][:MAX_LOSS_POINTS]) else _text(report[key])
    return _within(clean, MAX_REPORT_BYTES)


def _within(clean: dict, max_bytes: int) -> dict:
    """``clean`` in at most ``max_bytes`` of JSON: every text shorter first (large details dropped), then checks,
    verdicts and the loss curve left out from the end, which a note says."""
    for limit in (1000, 250, 60):
        if _json_size(clean) <= max_bytes:
            return clean
        clean = _shortened(clean, limit)
    left_out = 0
    for key in ("checks", "findings", "loss_curve", "notes"):
        while clean.get(key) and _json_size(clean) > max_bytes - 200:  # room for the note
            clean[key] = clean[key][:-1]
            left_out += 1
    if left_out:
        clean["notes"] = [f"{left_out} entries of this report were left out: it was over {max_bytes >> 10} KiB"]
    return clean


def _shortened(value, limit: int):
    """Every string in ``value`` at most ``limit`` characters; a ``details`` table larger than a few of them, dropped."""
    if isinstance(value, str):
        return _text(value, limit)
    if isinstance(value, list):
        return [_shortened(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: {} if k == "details" and _json_size(v) > 4 * limit else _shortened(v, limit)
                for k, v in value.items()}
    return value


def _json_size(value) -> int:
    return len(json.dumps(value, default=str))


def _sanitized_verdict(verdict: dict) -> dict:
    details = verdict.get("details")
    return {"rule": _text(verdict.get("rule", "?"), 20), "path": _text(verdict.get("path", ""), 500),
            "line": verdict["line"], "verdict": verdict["verdict"],
            "evidence": _text(verdict.get("evidence", ""), 1000),
            "details": dict(list({_text(k, 50): _text(v, 200) if isinstance(v, str) else v
                                  for k, v in details.items() if isinstance(k, str) and (
                isinstance(v, (int, float, str)) and not isinstance(v, bool) or v is None)}.items())[:20])
            if isinstance(details, dict) else {}}


def _error(target: str, reason: str) -> dict:
    return {"target": target, "status": "error", "checks": [], "measures": {}, "reason": reason, "notes": []}


_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def runner_secrets() -> list[str]:
    """Secret values this process holds (credential-like environment variables, the App's key file): a
    report quoting one is redacted. Defence in depth: the sandbox already keeps them out of the child's reach."""
    found = [v for k, v in os.environ.items() if _SECRET_NAME.search(k) and not k.endswith(("_PATH", "_FILE", "_DIR"))
             and len(v) >= 8]  # (a path names a secret; it is not one)
    texts = [os.environ.get("GITHUB_PRIVATE_KEY", "")]
    key_path = os.environ.get("GITHUB_PRIVATE_KEY_PATH")
    if key_path:
        try:
            texts.append(Path(key_path).read_text(errors="replace"))
        except OSError:
            pass
    for text in texts:  # a key's every line, so a partial quote is caught too
        found += [line.strip() for line in text.splitlines() if len(line.strip()) >= 16 and "-----" not in line]
    return sorted(set(found), key=len, reverse=True)


def redact(value, secrets: list[str]):
    """``value`` (a report: dicts, lists, strings) with every secret replaced by ``[redacted]``."""
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, "[redacted]")
        return value
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    return value


def smoke(head_dir: Path, requests: list[TargetRequest], *, base_dir: Optional[Path] = None, device: str = "cpu",
          steps: int = 50, seed: int = 0, limits: SandboxLimits = SandboxLimits(),
          thresholds: Optional[dict] = None, sandbox: bool = True, policy: Optional[str] = None,
          budget_s: Optional[float] = None) -> SmokeRun:
    """Smoke every request on head (and base); a sandbox refusal stops the run and says why in ``refused``.
    ``budget_s`` (default: ``job_budget_s()``) caps the whole job's wall time; hitting it sets ``stopped``."""
    from gpu_runner.compare import compare_reports

    started = time.perf_counter()
    budget = job_budget_s() if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    outcomes: list[TargetOutcome] = []
    warnings: list[str] = []
    secrets = runner_secrets()
    stopped: list[str] = []

    def run_all(code_dir: Path, batch: list[TargetRequest], measure_only: bool = False) -> list[dict]:
        left = deadline - time.monotonic()
        if batch and left < 1:
            reports, new_warnings = [_error(r.target, BUDGET_REASON) for r in batch], []
        else:
            reports, new_warnings = run_targets(code_dir, batch, device=device, steps=steps, seed=seed,
                                                limits=limits, sandbox=sandbox, policy=policy, budget_s=left,
                                                measure_only=measure_only)
        _merge(warnings, new_warnings)
        if any(report.get("reason") == BUDGET_REASON for report in reports) and not stopped:
            stopped.append(f"The job's time budget of {budget:.0f}s ran out ({JOB_BUDGET_VARIABLE}, set by the "
                           "operator): targets of the head it stopped are errors, and those of the base are not compared.")
        return [redact(report, secrets) for report in reports]

    try:
        heads = run_all(head_dir, requests)
        outcomes = [TargetOutcome(r.target, r.line, head) for r, head in zip(requests, heads)]
        if base_dir is not None:
            again = [(o, r) for o, r in zip(outcomes, requests) if o.head.get("status") in ("passed", "failed")
                     and (base_dir / r.target.split(":", 1)[0]).is_file()]
            # the static findings are the head's: the base only gives the measures to compare
            for (outcome, _), base in zip(again, run_all(base_dir, [replace(r, findings=[]) for _, r in again])):
                if base.get("status") in ("passed", "failed"):
                    outcome.base = base
            compared = [(o, replace(r, findings=[])) for o, r in again if o.base is not None]
            _interleaved_rounds(compared, lambda code_dir, batch: run_all(code_dir, batch, measure_only=True),
                                head_dir, base_dir)
            for outcome, _ in compared:
                outcome.comparison = compare_reports(outcome.head, outcome.base, thresholds)
    except SandboxRefused as exc:
        log.error("smoke: %s", exc)
        reason = str(exc)
        outcomes = [TargetOutcome(r.target, r.line, _error(r.target, reason)) for r in requests]
        return SmokeRun(outcomes, device, time.perf_counter() - started, warnings, refused=reason)
    return SmokeRun(outcomes, device, time.perf_counter() - started, warnings, stopped=stopped[0] if stopped else None)


def _interleaved_rounds(compared: list[tuple[TargetOutcome, TargetRequest]], measure, head_dir: Path,
                        base_dir: Path, rounds: int = COMPARE_ROUNDS) -> None:
    """``COMPARE_ROUNDS`` more rounds of step times for each compared target, base and head back to back, in
    alternating order (``measure(code_dir, requests)``: measure-only reports); each side's ``step_time_rounds`` holds its samples of
    every round, its own run first, for gpu_runner.compare's decision."""
    for outcome, _ in compared:
        outcome.head["step_time_rounds"] = [outcome.head.get("step_times_ms") or []]
        outcome.base["step_time_rounds"] = [outcome.base.get("step_times_ms") or []]
    requests = [request for _, request in compared]
    for number in range(rounds if requests else 0):
        # base then head, then head then base: whatever being measured second does to a side, both sides get it
        order = (("base", base_dir), ("head", head_dir))
        for side, code_dir in (order if number % 2 == 0 else order[::-1]):
            for (outcome, _), report in zip(compared, measure(code_dir, requests)):
                times = report.get("step_times_ms") if report.get("status") == "passed" else None
                getattr(outcome, side)["step_time_rounds"].append(times or [])


def _merge(into: list[str], new: list[str]) -> None:
    for item in new:
        if item not in into:
            into.append(item)
