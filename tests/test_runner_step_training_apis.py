"""A training script that wraps its loop in accelerate's ``Accelerator`` and logs to wandb, on a runner without
either package (issue 27, item 4): the two stand in as they behave in one process / with ``mode="disabled"``, so
the script's own loop runs and is checked; a planted missing ``zero_grad()`` still fails at its line, a backward
that is never called is still no training; what the stand-ins do not cover (``save_state``, a value read back from
wandb) stays a skip naming the package."""
from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from gpu_runner import training_apis  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import assert_zero_grad_fails_at, checks  # noqa: E402

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(p) is not None for p in ("accelerate", "wandb")),
                                reason="accelerate or wandb is installed: the stand-ins are not used")

# Sensor readings to a yield estimate: a two-layer regressor, its loop under an Accelerator, logged to wandb.
YIELD = '''
    import torch
    import torch.nn as nn
    import wandb
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    readings = torch.randn(512, 12)
    harvest = readings[:, :3].sum(1, keepdim=True)
    field_data = DataLoader(TensorDataset(readings, harvest), batch_size=32, shuffle=True)

    estimator = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 1))
    opt = torch.optim.AdamW(estimator.parameters(), lr=3e-3)

    run = wandb.init(project="yield", config={"lr": 3e-3})
    run.config.update({"width": 24})
    acc = Accelerator(mixed_precision="no")
    estimator, opt, field_data = acc.prepare(estimator, opt, field_data)
    wandb.watch(estimator)

    for season in range(30):
        for sensors, truth in field_data:
            with acc.autocast():
                error = nn.functional.mse_loss(estimator(sensors), truth)
            opt.zero_grad()
            acc.backward(error)
            acc.clip_grad_norm_(estimator.parameters(), 1.0)
            opt.step()
            wandb.log({"error": error.item(), "season": season})
            acc.print(f"{season} {error.item():.3f}")
        acc.wait_for_everyone()
    acc.save(acc.unwrap_model(estimator).state_dict(), "estimator.pt")
    wandb.finish()
'''


def test_a_script_under_accelerate_and_wandb_runs_on_their_single_process_stand_ins(tmp_path):
    root = write_tree(tmp_path, {"fit_yield.py": YIELD})
    report = smoke_step(root, "fit_yield.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "accelerate is not installed" in notes and "prepare" in notes and "backward" in notes
    assert "wandb is not installed" in notes and "init" in notes and "log" in notes


def test_a_planted_missing_zero_grad_fails_at_its_line_under_accelerate(tmp_path):
    root = write_tree(tmp_path, {"fit_yield.py": YIELD.replace("            opt.zero_grad()\n", "")})
    report = smoke_step(root, "fit_yield.py:__main__", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "fit_yield.py", "opt.step()")


def test_a_backward_that_is_never_called_is_not_a_pass(tmp_path):
    source = YIELD.replace("            acc.backward(error)\n", "")
    report = smoke_step(write_tree(tmp_path, {"fit_yield.py": source}), "fit_yield.py:__main__", None, device="cpu")
    assert report["status"] != "passed", report


def test_what_the_accelerator_stand_in_does_not_cover_is_still_the_missing_package(tmp_path):
    source = YIELD.replace('acc.print(f"{season} {error.item():.3f}")', "acc.save_state('checkpoints')")
    report = smoke_step(write_tree(tmp_path, {"fit_yield.py": source}), "fit_yield.py:__main__", None, device="cpu")
    assert report["status"] == "skipped" and "'accelerate'" in report["reason"], report


def test_a_value_read_back_from_wandb_is_still_the_missing_package(tmp_path):
    source = YIELD.replace("lr=3e-3)\n", "lr=wandb.config.lr)\n", 1)
    report = smoke_step(write_tree(tmp_path, {"fit_yield.py": source}), "fit_yield.py:__main__", None, device="cpu")
    assert report["status"] == "skipped", report


def test_the_accelerator_returns_what_it_prepares_and_scales_the_loss_by_its_accumulation():
    used: list = []
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 3)), batch_size=2)
    accelerator = training_apis.Accelerator(device="cpu", used=used, gradient_accumulation_steps=2)
    prepared_model, prepared_optimizer, prepared_loader = accelerator.prepare(model, optimizer, loader)
    assert prepared_model is model and prepared_optimizer is optimizer and len(prepared_loader) == 2
    assert accelerator.prepare(model) is model
    (inputs,) = next(iter(prepared_loader))
    accelerator.backward(model(inputs).sum())
    assert torch.allclose(model.weight.grad, torch.ones(1, 3))  # the sum over 2 rows, halved
    assert used == ["prepare", "backward"]
