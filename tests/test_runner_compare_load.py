"""Head vs base under load: identical code is never flagged, a real slowdown is, and peak memory does not move
with the machine's load. The measurements are the runner's own (gpu_runner.checks.measure_subject, interleaved
base and head in alternating order as gpu_runner.runner does), with a bursty CPU burner in the background."""
from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.build import build_subject  # noqa: E402
from gpu_runner.checks import measure_subject  # noqa: E402
from gpu_runner.compare import compare_reports  # noqa: E402
from gpu_runner.runner import COMPARE_ROUNDS, TargetRequest, smoke  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (autouse fixtures)

RUNS = 20
NET = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, width=256, repeats=1):
            super().__init__()
            self.repeats = repeats
            self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            hidden = self.body(x)
            for _ in range(self.repeats - 1):  # the same work again: a slower head
                hidden = hidden + 0 * self.body[2](hidden)
            return self.head(hidden)
"""
# bursts of 0-0.4 s of busy loop and of sleep, for at most 240 s: the load changes while the test measures
BURNER = ("import random, time\nend = time.time() + 240\nwhile time.time() < end:\n"
          "    stop = time.time() + random.uniform(0, 0.4)\n    while time.time() < stop: pass\n"
          "    time.sleep(random.uniform(0, 0.4))\n")


@pytest.fixture
def cpu_load():
    burners = []
    try:
        for _ in range(2):
            burners.append(subprocess.Popen([sys.executable, "-c", BURNER]))
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def subject(tmp_path, name: str, config: dict):
    root = write_tree(tmp_path / name, {f"{name}.py": NET})
    built = build_subject(root, f"{name}.py:Net", device="cpu", config={"input": {"shape": [64]}, **config})
    assert not hasattr(built, "reason"), built
    return built


def interleaved(head_subject, base_subject, rounds: int = COMPARE_ROUNDS + 1) -> tuple[dict, dict]:
    """Report dicts of both sides with ``rounds`` rounds of step times, base and head in alternating order, as the
    runner takes them."""
    head, base = {"step_time_rounds": []}, {"step_time_rounds": []}
    for number in range(rounds):
        order = ((base, base_subject), (head, head_subject))
        for side, built in (order if number % 2 == 0 else order[::-1]):
            measured = measure_subject(built, steps=10, seed=0)
            side["measures"] = measured.measures
            side["step_time_rounds"].append(measured.step_times_ms)
    return head, base


def step_time_row(head: dict, base: dict) -> dict:
    return next(row for row in compare_reports(head, base) if row["measure"] == "step time")


def test_identical_head_and_base_are_never_flagged_under_load(tmp_path, cpu_load):
    head_subject = subject(tmp_path, "head", {})
    base_subject = subject(tmp_path, "base", {})
    flagged, memory = [], set()
    for _ in range(RUNS):
        head, base = interleaved(head_subject, base_subject)
        row = step_time_row(head, base)
        if row["regression"]:
            flagged.append(row["message"])
        memory |= {head["measures"]["peak_memory_bytes"], base["measures"]["peak_memory_bytes"]}
    assert flagged == []
    assert len(memory) == 1  # counted tensor bytes: the same whatever the load


def test_a_head_several_times_slower_is_flagged_under_load(tmp_path, cpu_load):
    slow_head = subject(tmp_path, "slow", {})
    slow_head.model.repeats = 20  # about 3x the step: the extra layers are most of it
    head, base = interleaved(slow_head, subject(tmp_path, "base", {}))
    row = step_time_row(head, base)
    assert row["regression"], row["decision"]


def test_peak_memory_grows_with_the_activations():
    small, large = (torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
                    for width in (64, 1024))
    from gpu_runner.subject import Batch, Subject

    def built(model):
        return Subject("t", model, lambda b, s: Batch((torch.randn(b, 64),), {}, torch.randint(0, 10, (b,)), b),
                       torch.nn.functional.cross_entropy, "classification", "cpu", num_classes=10)

    small_bytes = measure_subject(built(small)).measures["peak_memory_bytes"]
    large_bytes = measure_subject(built(large)).measures["peak_memory_bytes"]
    weights = sum(p.numel() * 4 for p in large.parameters())
    assert large_bytes >= 4 * weights > small_bytes  # weights, gradients and Adam's two moments at least


def test_smoke_interleaves_rounds_of_base_and_head(tmp_path):
    head_dir = write_tree(tmp_path / "head", {"net.py": NET})
    base_dir = write_tree(tmp_path / "base", {"net.py": NET})
    request = TargetRequest("net.py:Net", config={"input": {"shape": [64]}})
    run = smoke(head_dir, [request], base_dir=base_dir, steps=5, sandbox=False)
    (outcome,) = run.outcomes
    assert outcome.status == "passed", outcome.head.get("reason")
    for side in (outcome.head, outcome.base):
        assert len(side["step_time_rounds"]) == COMPARE_ROUNDS + 1 and all(side["step_time_rounds"])
    assert not any(row["regression"] for row in outcome.comparison), outcome.comparison
