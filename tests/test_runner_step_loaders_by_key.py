"""A step or a trainer that looks its loaders up by key, unconfigured (issue 27, item 4): a function taking a dict
of loaders and looping over phases (``for stage in ("fit", "check"): for x, y in loaders[stage]``), and a trainer
class keeping ``data["fit_loader"]`` as its own loader, get every key as the runner's loader, said in the notes; a
planted missing ``zero_grad()`` fails at its line. A parameter subscripted by a string that is not used as a loader
(a batch read by key) is not given a dict of loaders."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import _looks_up_loaders_by_key, smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import assert_zero_grad_fails_at, checks  # noqa: E402

# A small regressor; its fitting function goes through two phases, each with its own loader from one dict.
PHASES = '''
    import torch
    import torch.nn as nn


    class Curve(nn.Module):
        def __init__(self, width=6):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(width, 12), nn.Tanh(), nn.Linear(12, 1))

        def forward(self, points):
            return self.body(points)


    def fit(model, loaders, criterion, optimizer, rounds=1):
        seen = {}
        for _ in range(rounds):
            for stage in ("fit", "check"):
                model.train(stage == "fit")
                total = 0.0
                for points, heights in loaders[stage]:
                    with torch.set_grad_enabled(stage == "fit"):
                        loss = criterion(model(points), heights)
                    if stage == "fit":
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
                    total += loss.item()
                seen[stage] = total
        return seen
'''

# The same model, trained by a class that is handed its loaders in one dict.
KEPT = '''
    import torch
    import torch.nn as nn
    from curve import Curve


    class Coach:
        def __init__(self, data, model, optimizer):
            self.fit_loader = data["fit_loader"]
            self.check_loader = data["check_loader"]
            self.model, self.optimizer = model, optimizer

        def run_epoch(self):
            self.model.train()
            for i, (points, heights) in enumerate(self.fit_loader):
                self.optimizer.zero_grad()
                loss = nn.functional.mse_loss(self.model(points), heights)
                loss.backward()
                self.optimizer.step()
'''

# A class that builds its own model and optimizer, keeps the dict of loaders and looks the fitting one up per epoch.
HELD = '''
    import torch
    import torch.nn as nn
    from curve import Curve


    class Workshop:
        def __init__(self, data, width=6):
            self.data = data
            self.net = Curve(width)
            self.optimizer = torch.optim.Adam(self.net.parameters(), lr=1e-3)

        def train_epoch(self):
            self.net.train()
            for points, heights in self.data["fit"]:
                self.optimizer.zero_grad()
                nn.functional.mse_loss(self.net(points), heights).backward()
                self.optimizer.step()
'''


def test_a_step_looping_over_phases_of_a_dict_of_loaders_runs(tmp_path):
    root = write_tree(tmp_path, {"curve.py": PHASES})
    report = smoke_step(root, "curve.py:fit", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    assert any("looks its loaders up in 'loaders' by key" in n for n in report["notes"]), report["notes"]


def test_a_missing_zero_grad_fails_at_its_line_with_a_dict_of_loaders(tmp_path):
    root = write_tree(tmp_path, {"curve.py": PHASES.replace("optimizer.zero_grad()\n", "pass\n")})
    report = smoke_step(root, "curve.py:fit", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "curve.py", "optimizer.step()")


def test_a_trainer_keeping_loaders_from_a_dict_runs(tmp_path):
    root = write_tree(tmp_path, {"curve.py": PHASES, "coach.py": KEPT})
    report = smoke_step(root, "coach.py:Coach.run_epoch", {"model": "curve.py:Curve"}, device="cpu")
    assert report["status"] == "passed", report
    assert any("looks its loaders up in 'data' by key" in n for n in report["notes"]), report["notes"]


def test_a_trainer_missing_zero_grad_fails_at_its_line(tmp_path):
    root = write_tree(tmp_path, {"curve.py": PHASES,
                                 "coach.py": KEPT.replace("self.optimizer.zero_grad()\n", "pass\n")})
    report = smoke_step(root, "coach.py:Coach.run_epoch", {"model": "curve.py:Curve"}, device="cpu")
    assert_zero_grad_fails_at(report, root, "coach.py", "self.optimizer.step()")


def test_a_string_subscript_not_used_as_a_loader_is_not_a_dict_of_loaders(tmp_path):
    import textwrap

    source = textwrap.dedent('''
        def step(model, data, optimizer):
            points = data["points"]
            loss = model(points).sum()
            loss.backward()
            optimizer.step()
    ''')
    path = tmp_path / "reads.py"
    path.write_text(source)
    import importlib.util

    spec = importlib.util.spec_from_file_location("reads_by_key", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not _looks_up_loaders_by_key(module.step, "data")
    phases = tmp_path / "phases.py"
    phases.write_text(textwrap.dedent(PHASES))
    spec = importlib.util.spec_from_file_location("phases_by_key", phases)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _looks_up_loaders_by_key(module.fit, "loaders")


def test_a_trainer_building_its_model_looks_up_a_kept_dict_of_loaders(tmp_path):
    root = write_tree(tmp_path, {"curve.py": PHASES, "workshop.py": HELD})
    report = smoke_step(root, "workshop.py:Workshop.train_epoch", None, device="cpu")
    assert report["status"] == "passed", report
    assert any("looks its loaders up in 'data' by key" in n for n in report["notes"]), report["notes"]
    planted = write_tree(tmp_path / "planted", {"curve.py": PHASES, "workshop.py": HELD.replace(
        "self.optimizer.zero_grad()\n", "pass\n")})
    report = smoke_step(planted, "workshop.py:Workshop.train_epoch", None, device="cpu")
    assert_zero_grad_fails_at(report, planted, "workshop.py", "self.optimizer.step()")
