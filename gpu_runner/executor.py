"""Execution apart from credentials: a smoke executor that receives only code and returns only a result.

The GPU job has two halves. The credentialed half stays in the worker (``bot/smoke.py``): it fetches the
head and base tarballs with the installation token and posts the check run. The executor half runs the
PR's code: it holds no secret, mounts none, needs no Redis and no egress, so even a sandbox escape finds
nothing to steal there. ``run_smoke`` is the worker's single entry point: with ``TORCHREVIEW_EXECUTOR_URL``
set it sends the job to an executor service; otherwise it runs the sandbox in-process (one machine).

Protocol (HTTP, one job at a time):

* ``POST /v1/smoke``: a gzip'd tar holding ``job.json`` (``{"targets": [{"target", "line", "config", "kind",
  "findings"}],
  "device", "steps", "seed", "limits": {"timeout_s", "memory_bytes"}, "thresholds"}``), ``head/...`` and,
  optionally, ``base/...``; answers ``200`` with the run (``SmokeRun.to_dict()``, ``refused`` set when the
  sandbox refuses) or ``400`` for a malformed request.
* ``GET /healthz``: ``200 {"sandbox": "ok"}``, or ``503`` with why the sandbox would refuse.

Run it with ``python -m gpu_runner.executor --port 8700`` (deploy/kubernetes/executor.yaml).
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Optional

from gpu_runner.sandbox import SandboxLimits

log = logging.getLogger("torchreview.executor")
EXECUTOR_URL_VARIABLE = "TORCHREVIEW_EXECUTOR_URL"
MAX_REQUEST_BYTES = 512 << 20  # two repository tarballs of at most 200 MiB each, plus the job
MAX_TIMEOUT_S = 3600.0
DEFAULT_MAX_MEMORY = 16 << 30  # TORCHREVIEW_EXECUTOR_MAX_MEMORY (bytes) caps what a repository may ask for


# --------------------------------------------------------------------------------------------------
# The worker's side
# --------------------------------------------------------------------------------------------------


def run_smoke(head_dir: Path, requests: list, *, base_dir: Optional[Path], device: str, limits: SandboxLimits,
              thresholds: Optional[dict] = None, steps: int = 50, seed: int = 0) -> dict:
    """The smoke run as a dict, from the executor service when one is configured, else run here."""
    from gpu_runner.runner import redact, runner_secrets

    url = os.environ.get(EXECUTOR_URL_VARIABLE)
    if url:
        run = _post_job(url, head_dir, requests, base_dir=base_dir, device=device, limits=limits,
                        thresholds=thresholds, steps=steps, seed=seed)
    else:
        run = _execute(head_dir, _job(requests, device, limits, thresholds, steps, seed), base_dir)
    return redact(run, runner_secrets())  # the worker holds the secrets: a last look before anything is posted


def _job(requests: list, device: str, limits: SandboxLimits, thresholds, steps: int, seed: int) -> dict:
    return {"targets": [{"target": r.target, "line": r.line, "config": r.config, "kind": r.kind,
                         "findings": r.findings} for r in requests],
            "device": device, "steps": steps, "seed": seed, "thresholds": thresholds,
            "limits": {"timeout_s": limits.timeout_s, "memory_bytes": limits.memory_bytes}}


def _post_job(url: str, head_dir: Path, requests: list, *, base_dir: Optional[Path], device: str,
              limits: SandboxLimits, thresholds, steps: int, seed: int) -> dict:
    import requests as http

    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w:gz") as archive:
        job = json.dumps(_job(requests, device, limits, thresholds, steps, seed)).encode()
        info = tarfile.TarInfo("job.json")
        info.size = len(job)
        archive.addfile(info, io.BytesIO(job))
        archive.add(str(head_dir), arcname="head")
        if base_dir is not None:
            archive.add(str(base_dir), arcname="base")
    # Each target runs at most twice (head, base), each child within its timeout.
    timeout = 60 + 2 * len(requests) * (limits.timeout_s + 30)
    response = http.post(url.rstrip("/") + "/v1/smoke", data=body.getvalue(), timeout=timeout,
                         headers={"Content-Type": "application/gzip"})
    response.raise_for_status()
    return response.json()


# --------------------------------------------------------------------------------------------------
# The executor's side
# --------------------------------------------------------------------------------------------------


def _resolve_device(configured: str) -> str:
    if configured in ("cpu", "cuda"):
        return configured
    return "cuda" if any(Path("/dev").glob("nvidia[0-9]*")) else "cpu"


def _limits(raw: dict) -> SandboxLimits:
    max_memory = int(os.environ.get("TORCHREVIEW_EXECUTOR_MAX_MEMORY") or DEFAULT_MAX_MEMORY)
    timeout = min(max(float(raw.get("timeout_s", 300)), 1.0), MAX_TIMEOUT_S)
    memory = min(max(int(raw.get("memory_bytes", 4 << 30)), 64 << 20), max_memory)
    return SandboxLimits(timeout_s=timeout, memory_bytes=memory)


def _execute(head_dir: Path, job: dict, base_dir: Optional[Path]) -> dict:
    from gpu_runner.runner import TargetRequest, smoke

    requests = [TargetRequest(str(t["target"]), int(t.get("line") or 1), t.get("config"),
                              "step" if t.get("kind") == "step" else "model",
                              [f for f in t.get("findings") or [] if isinstance(f, dict)]
                              if isinstance(t.get("findings"), list) else []) for t in job["targets"]]
    run = smoke(head_dir, requests, base_dir=base_dir, device=_resolve_device(str(job.get("device", "auto"))),
                steps=int(job.get("steps", 50)), seed=int(job.get("seed", 0)), limits=_limits(job.get("limits") or {}),
                thresholds=job.get("thresholds"))
    return run.to_dict()


class BadRequest(ValueError):
    pass


def unpack(data: bytes, into: Path) -> tuple[dict, Path, Optional[Path]]:
    """(job, head dir, base dir or None) from a request body: regular files and directories only, nothing
    outside ``into`` (tarfile's "data" filter), a job.json at the top."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = [m for m in archive.getmembers() if m.isfile() or m.isdir()]
            archive.extractall(into, members=members, filter="data")
        job = json.loads((into / "job.json").read_text())
    except (tarfile.TarError, OSError, ValueError, EOFError) as exc:
        raise BadRequest(f"not a smoke job: {type(exc).__name__}: {exc}") from exc
    targets = job.get("targets") if isinstance(job, dict) else None
    if not isinstance(targets, list) or not all(isinstance(t, dict) and isinstance(t.get("target"), str)
                                                 for t in targets):
        raise BadRequest("job.json: targets must be a list of {target: str}")
    head = into / "head"
    if not head.is_dir():
        raise BadRequest("no head/ directory")
    base = into / "base"
    return job, head, base if base.is_dir() else None


class _Handler(BaseHTTPRequestHandler):
    server_version = "torchreview-executor"

    def _answer(self, status: int, payload: dict) -> None:
        body = json.dumps(payload, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/healthz":
            return self._answer(404, {"error": "not found"})
        from gpu_runner.sandbox import check_sandbox

        problems = check_sandbox()
        self._answer(503 if problems else 200, {"sandbox": problems or "ok"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/smoke":
            return self._answer(404, {"error": "not found"})
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_REQUEST_BYTES:
            return self._answer(413 if length > 0 else 400, {"error": f"a body of 1 to {MAX_REQUEST_BYTES} bytes"})
        data = self.rfile.read(length)
        workdir = Path(tempfile.mkdtemp(prefix="torchreview-executor-"))
        try:
            job, head, base = unpack(data, workdir)
            # The children run as nobody: the extracted code must be readable to them.
            os.chmod(workdir, 0o755)
            self._answer(200, _execute(head, job, base))
        except BadRequest as exc:
            self._answer(400, {"error": str(exc)})
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        log.info("%s " + format, self.address_string(), *args)


def make_server(host: str, port: int) -> HTTPServer:
    """One job at a time: a GPU runs one smoke child at a time anyway."""
    return HTTPServer((host, port), _Handler)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_runner.executor", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8700)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from gpu_runner.sandbox import check_sandbox

    for problem in check_sandbox():  # loud at start; every job's result says it again
        log.error("sandbox: this executor will refuse smoke jobs: %s", problem)
    server = make_server(args.host, args.port)
    log.info("smoke executor on %s:%d", args.host, args.port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
