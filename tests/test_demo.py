"""``torchreview demo`` end to end, read the way a CI log or a pipe gets it (stdout is not a TTY)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analyzers.config import Config
from analyzers.engine import analyze_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_lines() -> list[str]:
    # COLUMNS=80: rich's width for a pipe; the demo must not wrap its lines to it.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-m", "bot.cli", "demo"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_demo_fits_in_under_120_lines(demo_lines):
    assert 30 < len(demo_lines) < 120


def buggy_train_findings():
    # the demo's repository opts into preview rules (bot/demo.py STATIC_CONFIG)
    return analyze_text((ROOT / "examples" / "buggy_train.py").read_text(), "train.py", Config(preview=True)).findings


def test_each_finding_is_shown_once_and_whole(demo_lines):
    findings = buggy_train_findings()
    assert len(findings) >= 15
    for finding in findings:
        titled = [line for line in demo_lines
                  if line.startswith(f"train.py:{finding.line} ") and f"{finding.rule} {finding.slug}" in line]
        assert len(titled) == 1, finding
        # The whole message on one line: never repeated, never wrapped mid-word at 80 columns. (Code
        # spans are shown without their backticks.)
        message = finding.message.replace("`", "")
        assert sum(message in line for line in demo_lines) == 1, message


def test_the_smoke_failure_is_shown_once_and_every_thread_ends_resolved(demo_lines):
    assert sum("models.py:AttentionPool failed when trained" in line for line in demo_lines) == 1
    assert any(line.strip().startswith("• batch-leakage: output row") for line in demo_lines)
    outcomes = [re.search(r"(\d+) of (\d+) review threads resolved", line) for line in demo_lines]
    counts = [(int(m.group(1)), int(m.group(2))) for m in outcomes if m]
    # the static PR (findings on one line share a thread), then the smoke PR
    assert len(counts) == 2 and counts[0][0] == counts[0][1] >= len(buggy_train_findings()) - 3
    assert counts[1] == (1, 1)


def test_check_runs_are_summarized_with_rounded_losses(demo_lines):
    check_lines = [line for line in demo_lines if line.startswith("check run ")]
    assert len(check_lines) == 6  # static PR: 2 heads; smoke PR: static + smoke on 2 heads
    assert f"failure — {len(buggy_train_findings())} issues (" in check_lines[0] and "· Totals: 🔴" in check_lines[0]
    losses = [m.group(1) for line in demo_lines if line.startswith("  models.py:")
              for m in re.finditer(r"· loss (\S+)", line)]
    assert losses and all(re.fullmatch(r"\d+(\.\d{1,4})?(e-?\d+)?", loss) for loss in losses), losses
