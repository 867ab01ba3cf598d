"""The executor service: code in, result out, over real HTTP, with the real sandbox behind it."""
from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path

import pytest
import requests

from gpu_runner import executor
from gpu_runner.runner import TargetRequest
from gpu_runner.sandbox import SandboxLimits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


@pytest.fixture
def service():
    server = executor.make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_job_round_trip_through_the_service(service, monkeypatch, tmp_path):
    assert requests.get(service + "/healthz", timeout=30).json() == {"sandbox": "ok"}
    head = tmp_path / "head"
    head.mkdir()
    (head / "mlp.py").write_text((FIXTURES / "mlp.py").read_text())
    monkeypatch.setenv(executor.EXECUTOR_URL_VARIABLE, service)
    # The worker's secret in its environment: never sent, and redacted should a report quote it.
    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", "executor-test-secret-0123456789")
    # a static finding to decide travels with its target (here about an attribute the model does not have)
    claim = {"rule": "TR302", "path": "mlp.py", "line": 5, "end_line": 5, "class": "MLP", "attribute": "blocks"}
    run = executor.run_smoke(head, [TargetRequest("mlp.py:MLP", 3, findings=[claim])], base_dir=None, device="cpu",
                             limits=SandboxLimits(timeout_s=120), steps=3)
    assert run["refused"] is None and run["warnings"] == []
    (target,) = run["targets"]
    assert target["target"] == "mlp.py:MLP" and target["line"] == 3
    assert target["status"] in ("passed", "failed") and target["head"]["checks"], target
    assert [(f["rule"], f["verdict"]) for f in target["head"]["findings"]] == [("TR302", "undecided")]
    assert "`self.blocks`" in target["head"]["findings"][0]["evidence"]


def test_malformed_and_escaping_archives_are_refused(service, tmp_path):
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w:gz") as archive:
        job = json.dumps({"targets": [{"target": "x.py:X"}]}).encode()
        for name, data in (("job.json", job), ("head/x.py", b"pass\n"), ("../escaped.py", b"pwned\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    answer = requests.post(service + "/v1/smoke", data=body.getvalue(), timeout=30)
    assert answer.status_code == 400 and "escaped.py" in answer.json()["error"]
    answer = requests.post(service + "/v1/smoke", data=b"not a tarball", timeout=30)
    assert answer.status_code == 400
    assert requests.get(service + "/v1/other", timeout=30).status_code == 404


def test_limits_a_repository_asks_for_are_capped(monkeypatch):
    monkeypatch.setenv("TORCHREVIEW_EXECUTOR_MAX_MEMORY", str(1 << 30))
    limits = executor._limits({"timeout_s": 10 ** 6, "memory_bytes": 1 << 40})
    assert limits.timeout_s == executor.MAX_TIMEOUT_S and limits.memory_bytes == 1 << 30
