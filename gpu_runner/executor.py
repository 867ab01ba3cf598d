"""Execution apart from credentials: a smoke executor that receives only code and returns only a result.

The GPU job has two halves. The credentialed half stays in the worker (``bot/smoke.py``): it fetches the
head and base tarballs with the installation token and posts the check run. The executor half runs the
PR's code: it holds no secret, mounts none, needs no Redis and no egress, so even a sandbox escape finds
nothing to steal there. ``run_smoke`` is the worker's single entry point: with ``TORCHREVIEW_EXECUTOR_URL``
set it sends the job to an executor service; otherwise it runs the sandbox in-process (one machine).

Protocol (HTTP; connections are served concurrently, jobs one at a time):

* ``POST /v1/smoke`` with ``Authorization: Bearer <token>`` (the shared ``TORCHREVIEW_EXECUTOR_TOKEN``, or
  the file named by ``TORCHREVIEW_EXECUTOR_TOKEN_FILE``, on both sides; compared in constant time, before
  the body is read): a gzip'd tar holding ``job.json`` (``{"targets": [{"target", "line", "config", "kind",
  "findings"}], "device", "steps", "seed", "limits": {"timeout_s", "memory_bytes"}, "thresholds",
  "job_budget_s"}``), ``head/...`` and, optionally, ``base/...``; answers ``200`` with the run
  (``SmokeRun.to_dict()``, ``refused`` set when the sandbox refuses), ``401`` without the token, ``400`` for
  a malformed request, ``408`` for a body that does not arrive in time.
* ``GET /healthz``: ``200 {"sandbox": "ok"}``, or ``503`` with why the sandbox would refuse.

The token is the executor's only secret: it lets a caller do nothing but submit jobs here. The NetworkPolicy
(or compose's internal network) still keeps everyone but the smoke workers away from the port.

Run it with ``python -m gpu_runner.executor --port 8700`` (deploy/kubernetes/executor.yaml).
"""
from __future__ import annotations

import argparse
import hmac
import io
import json
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from gpu_runner.sandbox import SandboxLimits

log = logging.getLogger("torchreview.executor")
EXECUTOR_URL_VARIABLE = "TORCHREVIEW_EXECUTOR_URL"
TOKEN_VARIABLE = "TORCHREVIEW_EXECUTOR_TOKEN"
TOKEN_FILE_VARIABLE = "TORCHREVIEW_EXECUTOR_TOKEN_FILE"
MIN_TOKEN_LENGTH = 32  # `openssl rand -hex 32` gives 64
READ_TIMEOUT_S = 30.0  # the most a client may stay silent while sending its request
BODY_DEADLINE_S = 600.0  # the whole body, however it trickles in (two tarballs on the cluster network)
MAX_CONNECTIONS = 32  # connections served at once; more are closed at once
MAX_REQUEST_BYTES = 512 << 20  # two repository tarballs of at most 200 MiB each, plus the job
MAX_TIMEOUT_S = 3600.0
DEFAULT_MAX_MEMORY = 16 << 30  # TORCHREVIEW_EXECUTOR_MAX_MEMORY (bytes) caps what a repository may ask for


# --------------------------------------------------------------------------------------------------
# The worker's side
# --------------------------------------------------------------------------------------------------


class TokenMissing(RuntimeError):
    """No usable shared token: the executor will not serve, the worker will not send."""


def executor_token() -> str:
    """The shared token from $TORCHREVIEW_EXECUTOR_TOKEN or the file $TORCHREVIEW_EXECUTOR_TOKEN_FILE names."""
    token = os.environ.get(TOKEN_VARIABLE, "")
    path = os.environ.get(TOKEN_FILE_VARIABLE, "")
    if not token and path:
        try:
            token = Path(path).read_text()
        except OSError as exc:
            raise TokenMissing(f"{TOKEN_FILE_VARIABLE}={path}: {exc.strerror}") from None
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise TokenMissing(f"set {TOKEN_VARIABLE} (or {TOKEN_FILE_VARIABLE}) to the same random token of at least "
                           f"{MIN_TOKEN_LENGTH} characters for the executor and the smoke workers "
                           f"(`openssl rand -hex 32`); {'it is too short' if token else 'it is not set'}")
    return token


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
    from gpu_runner.runner import job_budget_s

    return {"targets": [{"target": r.target, "line": r.line, "config": r.config, "kind": r.kind,
                         "findings": r.findings} for r in requests],
            "device": device, "steps": steps, "seed": seed, "thresholds": thresholds,
            "limits": {"timeout_s": limits.timeout_s, "memory_bytes": limits.memory_bytes},
            "job_budget_s": job_budget_s()}


def _post_job(url: str, head_dir: Path, requests: list, *, base_dir: Optional[Path], device: str,
              limits: SandboxLimits, thresholds, steps: int, seed: int) -> dict:
    import requests as http

    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w:gz") as archive:
        job = _job(requests, device, limits, thresholds, steps, seed)
        encoded = json.dumps(job).encode()
        info = tarfile.TarInfo("job.json")
        info.size = len(encoded)
        archive.addfile(info, io.BytesIO(encoded))
        archive.add(str(head_dir), arcname="head")
        if base_dir is not None:
            archive.add(str(base_dir), arcname="base")
    token = executor_token()
    # The job's budget bounds the run (the executor's own may only be smaller), plus the transfer; one job of
    # another smoke worker may be running there first.
    timeout = 120 + 2 * job["job_budget_s"]
    response = http.post(url.rstrip("/") + "/v1/smoke", data=body.getvalue(), timeout=(30, timeout),
                         headers={"Content-Type": "application/gzip", "Authorization": f"Bearer {token}"})
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


def _budget(raw) -> float:
    """The job's budget: what the worker asks for, never more than this executor's own."""
    from gpu_runner.runner import job_budget_s

    cap = job_budget_s()
    try:
        asked = float(raw)
    except (TypeError, ValueError):
        return cap
    return min(asked, cap) if asked > 0 else cap


def _execute(head_dir: Path, job: dict, base_dir: Optional[Path]) -> dict:
    from gpu_runner.runner import TargetRequest, smoke

    requests = [TargetRequest(str(t["target"]), int(t.get("line") or 1), t.get("config"),
                              "step" if t.get("kind") == "step" else "model",
                              [f for f in t.get("findings") or [] if isinstance(f, dict)]
                              if isinstance(t.get("findings"), list) else []) for t in job["targets"]]
    run = smoke(head_dir, requests, base_dir=base_dir, device=_resolve_device(str(job.get("device", "auto"))),
                steps=int(job.get("steps", 50)), seed=int(job.get("seed", 0)), limits=_limits(job.get("limits") or {}),
                thresholds=job.get("thresholds"), budget_s=_budget(job.get("job_budget_s")))
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
    timeout = READ_TIMEOUT_S  # on the socket: a silent client (a half-open connection) costs a thread this long

    def _answer(self, status: int, payload: dict) -> None:
        body = json.dumps(payload, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")  # whatever body is left unread is never read
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/healthz":
            return self._answer(404, {"error": "not found"})
        from gpu_runner.sandbox import check_sandbox

        problems = check_sandbox()
        self._answer(503 if problems else 200, {"sandbox": problems or "ok"})

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {self.server.token}"
        return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())

    def _read_body(self, length: int) -> Optional[bytes]:
        """The body, or None when it does not arrive within BODY_DEADLINE_S (each read within READ_TIMEOUT_S)."""
        deadline = time.monotonic() + BODY_DEADLINE_S
        chunks, left = [], length
        while left > 0:
            if time.monotonic() > deadline:
                return None
            chunk = self.rfile.read1(min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/smoke":
            return self._answer(404, {"error": "not found"})
        if not self._authorized():
            return self._answer(401, {"error": "missing or wrong executor token"})
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if length <= 0 or length > MAX_REQUEST_BYTES:
            return self._answer(413 if length > 0 else 400, {"error": f"a body of 1 to {MAX_REQUEST_BYTES} bytes"})
        try:
            data = self._read_body(length)
        except (socket.timeout, OSError):
            data = None
        if data is None:
            return self._answer(408, {"error": "the request body did not arrive in time"})
        workdir = Path(tempfile.mkdtemp(prefix="torchreview-executor-"))
        try:
            job, head, base = unpack(data, workdir)
            # The children run as nobody: the extracted code must be readable to them.
            os.chmod(workdir, 0o755)
            with self.server.job_slot:  # a GPU runs one smoke child at a time: later jobs wait their turn
                result = _execute(head, job, base)
            self._answer(200, result)
        except BadRequest as exc:
            self._answer(400, {"error": str(exc)})
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        log.info("%s " + format, self.address_string(), *args)


class ExecutorServer(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS of them (the rest are closed at once), one job at a
    time; only callers holding ``token`` may submit jobs."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], token: str):
        self.token = token
        self.job_slot = threading.Lock()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        if not self._connections.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._connections.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()


def make_server(host: str, port: int, token: Optional[str] = None) -> ExecutorServer:
    """The executor's HTTP server; ``token`` defaults to ``executor_token()`` (raises ``TokenMissing``)."""
    token = executor_token() if token is None else token
    if len(token) < MIN_TOKEN_LENGTH:
        raise TokenMissing(f"the executor token must have at least {MIN_TOKEN_LENGTH} characters")
    return ExecutorServer((host, port), token)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_runner.executor", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8700)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from gpu_runner.sandbox import check_sandbox

    for problem in check_sandbox():  # loud at start; every job's result says it again
        log.error("sandbox: this executor will refuse smoke jobs: %s", problem)
    try:
        server = make_server(args.host, args.port)
    except TokenMissing as exc:
        parser.exit(2, f"torchreview executor: {exc}\n")
    log.info("smoke executor on %s:%d", args.host, args.port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
