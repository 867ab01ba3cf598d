"""Refusals that need no hostile model: a missing seccomp library, and the redaction of last resort."""
from __future__ import annotations

import sys

import pytest

from gpu_runner import sandbox, syscall_filter
from gpu_runner.runner import redact, runner_secrets


@pytest.fixture
def no_seccomp_library(monkeypatch):
    monkeypatch.setattr(syscall_filter, "library", lambda: None)
    syscall_filter.compiled_filter.cache_clear()
    yield
    syscall_filter.compiled_filter.cache_clear()


def test_without_libseccomp_bindings_the_sandbox_refuses(no_seccomp_library, monkeypatch, tmp_path):
    caps = sandbox._probe()
    assert caps.layers["seccomp"] is False
    assert any("pyseccomp" in p and "python3-seccomp" in p for p in caps.problems), caps.problems
    monkeypatch.setattr(sandbox, "_capabilities", lambda: caps)
    code = tmp_path / "code"
    code.mkdir()
    marker = tmp_path / "ran"
    with pytest.raises(sandbox.SandboxRefused, match="seccomp"):
        sandbox.run_sandboxed([sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"], code_dir=code,
                              policy="strict")
    assert not marker.exists()
    assert sandbox.check_sandbox("strict") and sandbox.check_sandbox("weak") == []


def test_reports_never_carry_the_workers_secrets(monkeypatch, tmp_path):
    key = tmp_path / "private-key.pem"
    key.write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAplantedkeyline0123456789\n"
                   "-----END RSA PRIVATE KEY-----\n")
    monkeypatch.setenv("GITHUB_PRIVATE_KEY_PATH", str(key))
    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", "whsec-planted-0123456789")
    report = {"reason": f"could not build: RuntimeError: MIIEowIBAAKCAQEAplantedkeyline0123456789 "
                        f"whsec-planted-0123456789 read from {key}",
              "checks": [{"message": "whsec-planted-0123456789"}], "measures": {"params": 3}}
    clean = redact(report, runner_secrets())
    text = str(clean)
    assert "planted" not in text and text.count("[redacted]") == 3
    assert str(key) in clean["reason"]  # a path names a secret; it is not one
    assert clean["measures"] == {"params": 3}


def test_a_filter_is_produced_for_cpu_and_gpu_runs():
    cpu, gpu = syscall_filter.compiled_filter(), syscall_filter.compiled_filter(gpu=True)
    assert cpu and gpu and len(cpu) > len(gpu)  # the GPU filter leaves the memory rules out
