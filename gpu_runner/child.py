"""The trusted harness that runs inside the sandbox, and the worker it forks to build and smoke each target.

The harness (``main``) starts before any of the PR's code is imported. It takes the job from stdin and the
result channel (a pipe's write end, ``$TORCHREVIEW_RESULT_FD``) from the sandbox, makes itself
non-dumpable (so that its memory and file descriptors are out of reach through /proc of a same-uid
process), and forks a worker that closes the result channel before it imports anything of the PR. The
worker sends its reports back over a pipe of its own, each line framed with a nonce drawn for this run;
the harness keeps exactly one report per requested target (under that target's name) and writes them to
the result channel. Whatever the PR's code prints, or writes to the file descriptors it can find, is
never taken as a result: stdout is only a log.

The limit of this (docs/security.md): the worker runs the PR's code in its own process, so a
hostile PR can still make the checks of *its own* models report what it likes (as it could by changing
the model); the smoke check is a review aid, not a security gate.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import traceback
from pathlib import Path

RESULT_FD_VARIABLE = "TORCHREVIEW_RESULT_FD"  # gpu_runner.sandbox sets these two
CODE_DIR_VARIABLE = "TORCHREVIEW_CODE_DIR"
_WORKER_OUTPUT_CAP = 4 << 20
_PR_SET_DUMPABLE = 4


def _report(target: str, status: str, reason: str = "", **extra) -> dict:
    from gpu_runner.subject import TargetReport

    report = TargetReport(target=target, status=status, reason=reason)
    data = report.to_dict()
    data.update(extra)
    return data


CHECKS_SHARE_OF_TIMEOUT = 0.6  # what the checks may plan to use of the per-target timeout (the rest: margin)
# What one target plans to take, import and build included: a slower model is checked on smaller batches (then
# fewer steps) rather than taking minutes of a shared worker or being killed at the timeout.
TARGET_BUDGET_S = 20.0
# The experiments on static findings (gpu_runner.confirm) run after the checks, until the checks' deadline plus this
# much, and never past this share of the per-target timeout: a target killed at its timeout loses its whole report.
FINDINGS_BUDGET_S = 20.0
# A note says what the import and build spent of the budget when it was at least this share (the checks, planned
# on the rest, may have been made smaller for it)
BUILD_SHARE_SHOWN = 0.25
FINDINGS_SHARE_OF_TIMEOUT = 0.8



def smoke_one(code_root: Path, target: str, config: dict | None, device: str, steps: int, seed: int,
              deadline: float | None = None, findings: list | None = None,
              findings_deadline: float | None = None, measure_only: bool = False,
              limit: float | None = None) -> dict:
    """Build and check one target; ``deadline`` (a time.perf_counter() value) is when its checks should be done
    (the per-target budget, well before the timeout kills it): a slow model is checked on smaller batches, and
    with fewer steps if it must. ``findings``: static findings of the target's file that a run can decide
    (gpu_runner.confirm); their verdicts are the report's ``findings``, decided until ``findings_deadline`` (a
    time.perf_counter() value). The experiments never cost the target its checks' report: one that fails
    outside the PR's code leaves the findings out and says so in the notes. ``measure_only``: no checks, only
    the measures (another round of step times for comparing head and base). ``limit`` (a time.perf_counter()
    value): when the target would be killed; a model too slow to be checked before it, even shrunk, is skipped
    with its step time and input."""
    from gpu_runner.build import CONFIGURE_HINT, BuiltWithBug, Skip, build_subject, known_bug
    from gpu_runner.checks import measure_subject, run_checks

    from gpu_runner.subject import phase

    phase("the import and build of the model (its constructor, then its input inferred by running its forward)")
    build_started = time.perf_counter()
    try:
        subject = build_subject(code_root, target, device=device, config=config, seed=seed)
    except Exception as exc:  # noqa: BLE001 - the PR's code can raise anything while importing/constructing
        advice = known_bug(exc) or CONFIGURE_HINT
        return _report(target, "skipped", f"could not build {target}: {type(exc).__name__}: {exc}; {advice}",
                       traceback=traceback.format_exc(limit=5))
    if isinstance(subject, Skip):
        return _report(target, "skipped", subject.reason)
    if isinstance(subject, BuiltWithBug):
        from dataclasses import asdict

        return _report(target, "failed", checks=[asdict(subject.check)])
    try:
        budget = None if deadline is None else max(0.0, deadline - time.perf_counter())
        report = (measure_subject if measure_only else run_checks)(subject, steps=steps, seed=seed, budget_s=budget,
                                                                      limit_s=None if limit is None else
                                                                      limit - time.perf_counter())
    except Exception as exc:  # noqa: BLE001
        return _report(target, "error", f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=5))
    data = report.to_dict()
    shown = budget is not None and deadline - budget - build_started >= BUILD_SHARE_SHOWN * (deadline - build_started)
    share = [_build_share(build_started, deadline, budget)] if shown else []  # no budget: nothing to share out
    data["notes"] = list(subject.notes) + share + list(data.get("notes") or [])
    if findings and not measure_only:
        from gpu_runner.confirm import confirm_findings

        phase("the experiments deciding the static findings of its file")
        try:
            data["findings"] = confirm_findings(subject, target.split(":", 1)[0], findings, seed, findings_deadline,
                                                str(code_root))
        except Exception as exc:  # noqa: BLE001 - the runner's fault, or the PR's code outside an experiment
            data["notes"].append(f"the static findings could not be checked by running: {type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:200]}")
    return data


def _build_share(build_started: float, deadline: float, left: float) -> str:
    """What the import and build spent of the per-target time budget (for a target checked smaller: the checks
    had only the rest)."""
    took = deadline - left - build_started
    return (f"the import and build took {took:.1f}s of the {deadline - build_started:.0f}s time budget, leaving "
            f"{left:.1f}s for the checks")


def _worker(job: dict, code_root: Path, out: int, nonce: str) -> None:
    """Runs the PR's code: builds and smokes each target, one framed line per report on ``out``."""
    os.chdir(code_root)
    sys.path.insert(0, str(code_root))
    from gpu_runner.subject import _PHASE_LISTENERS

    _PHASE_LISTENERS.append(lambda text: _write_all(out, (nonce + PHASE_MARK + " ".join(text.split()) + "\n").encode()))
    torch_ready = False
    threads = 0  # what the worker's own targets have been running on: part of the load average
    for item in job["targets"]:
        started, cpu_started = time.perf_counter(), time.process_time()
        # a step's file may be a script whose top level uses the package only in its script part, which the step
        # path leaves out (steps._script_definitions): it judges its own imports
        missing = None if item.get("config") or item.get("kind") == "step" \
            else missing_import(code_root, item["target"])
        if missing is not None:  # decided before paying for `import torch`
            path, name = missing
            result = _report(item["target"], "skipped", f"importing {path} needs '{name}', which is not installed on "
                                                        "the smoke runner; install it in the runner image")
        else:
            import torch

            if not torch_ready:  # paid once per job, like the interpreter's start: not part of this target's time
                _warm_up_torch()
                torch_ready = True
                started, cpu_started = time.perf_counter(), time.process_time()
            threads = torch_threads(job.get("threads"), own=threads)  # per target: the load changes
            torch.set_num_threads(threads)
            if item.get("kind") == "step":
                from gpu_runner.confirm import confirm_step
                from gpu_runner.steps import smoke_step

                findings = item.get("findings") if isinstance(item.get("findings"), list) else []
                result = confirm_step(lambda: smoke_step(code_root, item["target"], item.get("config"),
                                                         device=job.get("device", "cpu"), seed=int(job.get("seed", 0))),
                                      str(code_root), item["target"], findings)
            else:
                timeout = job.get("target_timeout_s")
                budget = min(TARGET_BUDGET_S, CHECKS_SHARE_OF_TIMEOUT * float(timeout)) if timeout else TARGET_BUDGET_S
                deadline = started + budget
                findings_deadline = deadline + FINDINGS_BUDGET_S
                if timeout:
                    findings_deadline = min(findings_deadline, started + FINDINGS_SHARE_OF_TIMEOUT * float(timeout))
                findings = item.get("findings") if isinstance(item.get("findings"), list) else []
                result = smoke_one(code_root, item["target"], item.get("config"), job.get("device", "cpu"),
                                   int(job.get("steps", 50)), int(job.get("seed", 0)), deadline,
                                   [f for f in findings if isinstance(f, dict)], findings_deadline,
                                   measure_only=bool(job.get("measure_only")),
                                   limit=started + float(timeout) if timeout else None)
        result["seconds"] = round(time.perf_counter() - started, 3)  # import, build and checks of this target
        result["cpu_seconds"] = round(time.process_time() - cpu_started, 3)  # the same, in CPU time (all threads)
        _write_all(out, (nonce + json.dumps(result, default=str) + "\n").encode())


def torch_threads(requested: int | None, own: int = 0) -> int:
    """Intra-op threads for the worker: ``requested`` (the job's ``threads``), else the cores the sandbox allows that
    the machine's load leaves free (the 1-minute load average less ``own``, the threads this worker has been
    running), at least one. The models are small (their sizes are shrunk) and gain little from threads, while
    OpenMP workers spinning on cores that other processes hold make every step several times slower (README, "On
    real models")."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if requested:
        return max(1, min(allowed, int(requested)))
    try:
        others = max(0.0, os.getloadavg()[0] - own)
    except OSError:  # no load average in this sandbox
        others = 0.0
    return max(1, min(allowed, int(allowed - others + 0.5)))


def _warm_up_torch() -> None:
    """The first optimizer step of a process imports much of torch (about 2.6 s); paid here once per job, like
    ``import torch``, instead of by whichever target's check comes first."""
    import torch

    parameter = torch.nn.Parameter(torch.zeros(2))
    (parameter * 2).sum().backward()
    torch.optim.Adam([parameter], lr=1e-3).step()


def missing_import(code_root: Path, target: str) -> tuple[str, str] | None:
    """(path, module) when the target's file unconditionally imports, at its top level, a module that is neither
    installed nor part of the code (``import timm``) and uses it when imported (a base class, a call at the top
    level); None when every such import can be found or is only used inside functions (the build imports the
    file with a stand-in for it: gpu_runner.absent). Imports inside ``try:`` or functions are not judged: the
    file may do without them."""
    import ast
    import importlib.util

    from gpu_runner.absent import used_when_imported

    path = target.split(":", 1)[0]
    file_path = code_root / path
    try:
        tree = ast.parse(file_path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    for name in names:
        local = [code_root / name, code_root / f"{name}.py", file_path.parent / name, file_path.parent / f"{name}.py",
                 code_root / "src" / name]
        if name in sys.builtin_module_names or any(candidate.exists() for candidate in local):
            continue
        try:
            if importlib.util.find_spec(name) is not None:
                continue
        except (ImportError, ValueError):
            continue
        if used_when_imported(tree, name):
            return path, name
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


PHASE_MARK = "~"  # after the nonce: a progress line (what the current target is doing), not a report
CRASH_MARK = "!"  # after the nonce: the exception that ended the worker, so the error names its cause
_PHASE_WINDOW = 4096  # bytes of the worker's latest output searched for its last progress line


def _collect(fd: int, pid: int, cap: int, nonce: str,
             per_target_s: float | None) -> tuple[bytes, int, bool, str | None]:
    """The worker's output, exit status, whether it was killed for taking longer than ``per_target_s``
    on one target (the clock restarts with every report), and what that target was doing then (its last
    progress line, None when it sent none). Reading stops when the worker has exited and the pipe is drained,
    even if a process it left behind still holds the pipe open."""
    import select

    chunks, kept, status, reports, timed_out = [], 0, None, 0, False
    marker = nonce.encode()
    report_marker, phase_marker = marker + b"{", marker + PHASE_MARK.encode()
    deadline = time.monotonic() + per_target_s if per_target_s else None
    tail, window, current = b"", b"", None
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            if kept < cap:
                chunks.append(chunk[:cap - kept])
                kept += len(chunks[-1])
            seen = (tail + chunk).count(report_marker)
            tail = (tail + chunk)[-len(report_marker):]
            window = (window + chunk)[-_PHASE_WINDOW:]
            last_phase, last_report = window.rfind(phase_marker), window.rfind(report_marker)
            end = window.find(b"\n", last_phase)
            if last_report > last_phase:
                current = None
            elif last_phase >= 0 and end > 0:
                current = window[last_phase + len(phase_marker):end].decode(errors="replace")[:200]
            if seen and deadline is not None:
                reports += seen
                deadline = time.monotonic() + per_target_s
            continue
        if status is None:
            done, status_now = os.waitpid(pid, os.WNOHANG)
            if done:
                status = status_now
            elif deadline is not None and time.monotonic() > deadline:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)  # the worker and whatever it started
                except OSError:
                    os.kill(pid, signal.SIGKILL)
        else:
            break  # exited, and nothing more to read
    if status is None:
        _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status, timed_out, current


def _framed_reports(data: bytes, nonce: str) -> list[dict]:
    reports = []
    for line in data.decode(errors="replace").splitlines():
        if not line.startswith(nonce):
            continue  # not the worker's own framing
        try:
            report = json.loads(line[len(nonce):])
        except ValueError:
            continue
        if isinstance(report, dict):
            reports.append(report)
    return reports


def _not_dumpable() -> None:
    # A non-dumpable process's /proc/PID/{mem,fd,environ} need CAP_SYS_PTRACE, which nothing in the sandbox has.
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _crash_summary(exc: BaseException, code_root: Path) -> str:
    """One line: the exception and the innermost frame that raised it, named as the repository's code (a path
    under ``code_root``) or as the runner's (``gpu_runner/...``), so an error says whose code ended the worker."""
    text = " ".join(traceback.format_exception_only(type(exc), exc)[-1].split())[:300]
    frames = traceback.extract_tb(exc.__traceback__)
    root = str(code_root).rstrip("/") + "/"
    own = [f for f in frames if f.filename.startswith(root)]
    runner = [f for f in frames if "/gpu_runner/" in f.filename]
    if own:
        where = f"{own[-1].filename[len(root):]}:{own[-1].lineno}, the repository's code"
    elif runner:
        where = f"gpu_runner/{runner[-1].filename.rsplit('/gpu_runner/', 1)[1]}:{runner[-1].lineno}, the runner's own code"
    else:
        where = ""
    return f"{text} (at {where})" if where else text


def _crash_line(output: bytes, nonce: str) -> str:
    marker = (nonce + CRASH_MARK).encode()
    at = output.rfind(marker)
    if at < 0:
        return ""
    return output[at + len(marker):].split(b"\n", 1)[0].decode(errors="replace")


def _describe_exit(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _run_worker(job: dict, code_root: Path, result_fd: int, nonce: str, targets: list[dict]) -> tuple[list[dict], str]:
    """Forks a worker for ``targets``; their reports (in order, possibly fewer) and, when it ended early,
    why (its exit status, or the per-target timeout)."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.close(result_fd)  # before the PR's code exists in this process
        status = 0
        try:
            os.setpgid(0, 0)
            _worker({**job, "targets": targets}, code_root, write_end, nonce)
        except BaseException as exc:  # noqa: BLE001 - report whatever ended the worker, then leave
            traceback.print_exc()
            _write_all(write_end, (nonce + CRASH_MARK + _crash_summary(exc, code_root) + "\n").encode())
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    os.close(write_end)
    per_target = job.get("target_timeout_s")
    output, status, timed_out, doing = _collect(read_end, pid, _WORKER_OUTPUT_CAP, nonce,
                                                float(per_target) if per_target else None)
    os.close(read_end)
    during = f" during {doing}" if doing else ""
    crash = _crash_line(output, nonce)
    if timed_out:
        why = f"timed out after {float(per_target):.0f}s (smoke.timeout){during}; its processes were killed"
    elif crash:
        why = f"the smoke child ended with {crash}{during}"
    else:
        why = f"the model's code ended the smoke child ({_describe_exit(status)}){during}"
    return _framed_reports(output, nonce)[:len(targets)], why


def main() -> int:
    """Runs every target of the job in one warm worker (one ``import torch`` for all of them). A target that
    crashes the worker or runs past the per-target timeout is reported as an error, and the targets after it
    go on in a fresh worker."""
    job = json.loads(sys.stdin.read())
    result_fd = int(os.environ.pop(RESULT_FD_VARIABLE))
    code_root = Path(os.environ.get(CODE_DIR_VARIABLE) or job["code_root"])
    _not_dumpable()
    nonce = "@" + secrets.token_hex(16) + "@"
    targets = list(job["targets"])
    results: list[dict] = []
    while len(results) < len(targets):
        remaining = targets[len(results):]
        reports, why = _run_worker(job, code_root, result_fd, nonce, remaining)
        for item, report in zip(remaining, reports):
            report["target"] = item["target"]  # one report per requested target, under its own name
            results.append(report)
        if len(reports) < len(remaining):
            target = remaining[len(reports)]["target"]
            results.append(_report(target, "error", f"{why} before {target} was reported"))
    _write_all(result_fd, json.dumps({"results": results}, default=str).encode())
    os.close(result_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
