"""An experiment class whose model its base class's constructor builds (``self.model = self._build_model()``) and
whose training method makes the optimizer itself (``optimizer = self._pick_optimizer()`` over
``self.model.parameters()``) is a training step (issue 27, item 4): found by ``find_step_targets``, run by the
runner on the model the instance holds, and the data set the method builds from a file that is not there yields
the runner's rows. A planted missing ``zero_grad()`` still fails at its line; a loop that reads its batch in a way
the runner's rows do not fit is a skip, never a failure."""
from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

SERIES = {
    "layers.py": '''
        import torch.nn as nn


        class Forecaster(nn.Module):
            def __init__(self, window, width):
                super().__init__()
                self.hidden = nn.Linear(window, width)
                self.head = nn.Linear(width, 1)

            def forward(self, x):
                return self.head(self.hidden(x).relu())
    ''',
    "base.py": '''
        class BaseRun:
            def __init__(self, settings):
                self.settings = settings
                self.model = self._build_model()

            def _build_model(self):
                raise NotImplementedError
    ''',
    "series.py": '''
        import torch
        from torch.utils.data import DataLoader, Dataset


        class Readings(Dataset):
            def __init__(self, table):
                with open(table) as handle:
                    self.rows = [[float(v) for v in line.split(",")] for line in handle]

            def __len__(self):
                return len(self.rows)

            def __getitem__(self, i):
                row = torch.tensor(self.rows[i])
                return row[:-1], row[-1:]
    ''',
    "forecast.py": '''
        import torch
        from torch.utils.data import DataLoader
        from base import BaseRun
        from layers import Forecaster
        from series import Readings


        class ForecastRun(BaseRun):
            def __init__(self, settings):
                super().__init__(settings)

            def _build_model(self):
                return Forecaster(self.settings.window, self.settings.width)

            def _pick_optimizer(self):
                return torch.optim.SGD(self.model.parameters(), lr=self.settings.lr)

            def _loader(self):
                return DataLoader(Readings(self.settings.table), batch_size=self.settings.batch_size, shuffle=True)

            def fit(self):
                loader = self._loader()
                optimizer = self._pick_optimizer()
                loss_fn = torch.nn.MSELoss()
                for epoch in range(self.settings.epochs):
                    self.model.train()
                    for x, y in loader:
                        optimizer.zero_grad()
                        loss = loss_fn(self.model(x), y)
                        loss.backward()
                        optimizer.step()
    ''',
    "run.py": '''
        import argparse
        from forecast import ForecastRun

        parser = argparse.ArgumentParser()
        parser.add_argument("--window", type=int, default=24)
        parser.add_argument("--width", type=int, default=32)
        parser.add_argument("--lr", type=float, default=0.01)
        parser.add_argument("--epochs", type=int, default=20)
        parser.add_argument("--batch_size", type=int, default=16)
        parser.add_argument("--table", default="tables/readings.csv")

        if __name__ == "__main__":
            Run = ForecastRun
            Run(parser.parse_args()).fit()
    ''',
}


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def checks(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_an_experiment_class_that_makes_its_optimizer_in_its_training_method_is_a_step():
    from gpu_runner.targets import find_step_targets

    sources = {path: textwrap.dedent(text) for path, text in SERIES.items()}
    assert [t.spec for t in find_step_targets(sources, {"forecast.py": None})] == ["forecast.py:ForecastRun.fit"]
    # a method that backpropagates without stepping an optimizer over what the instance holds trains nothing
    probe = sources["forecast.py"].replace("optimizer.step()", "pass")
    assert find_step_targets(dict(sources, **{"forecast.py": probe}), {"forecast.py": None}) == []


def test_it_runs_on_the_model_the_instance_holds_and_stand_in_rows_for_its_missing_table(tmp_path):
    report = smoke_step(write_tree(tmp_path, SERIES), "forecast.py:ForecastRun.fit", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "ForecastRun built its own model: model (Forecaster" in notes and "made by fit itself" in notes, notes
    assert "data set Readings could not be built" in notes, notes


def test_a_missing_zero_grad_in_such_a_method_fails_at_its_line(tmp_path):
    files = dict(SERIES, **{"forecast.py": SERIES["forecast.py"].replace(
        "                        optimizer.zero_grad()\n", "")})
    root = write_tree(tmp_path, files)
    report = smoke_step(root, "forecast.py:ForecastRun.fit", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "forecast.py",
                                                                                     "optimizer.step()")


def test_a_loop_reading_batches_the_runners_rows_do_not_fit_is_a_skip(tmp_path):
    files = dict(SERIES, **{"forecast.py": SERIES["forecast.py"].replace(
        "for x, y in loader:", "for x, y, weight in loader:")})
    report = smoke_step(write_tree(tmp_path, files), "forecast.py:ForecastRun.fit", None, device="cpu")
    assert report["status"] == "skipped", report


# A step whose update is a helper's: its loop hands the loss and the optimizer it takes to ``apply_update``.
DELEGATED = {
    "engine.py": '''
        import torch
        import torch.nn as nn


        class Scorer(nn.Module):
            def __init__(self, inputs=12, width=16):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, 3))

            def forward(self, x):
                return self.body(x)


        def apply_update(loss, optimizer):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


        def set_rate(optimizer, fraction):
            for group in optimizer.param_groups:
                group["lr"] = 0.01 * (1 - fraction)


        def train_one_epoch(model, data_loader, optimizer):
            model.train()
            for i, (x, y) in enumerate(data_loader):
                set_rate(optimizer, i / len(data_loader))
                loss = nn.functional.cross_entropy(model(x), y)
                apply_update(loss, optimizer)
    ''',
}


def test_a_step_handing_its_loss_and_optimizer_to_an_update_helper_is_found_and_runs(tmp_path):
    from gpu_runner.targets import find_step_targets

    sources = {path: textwrap.dedent(text) for path, text in DELEGATED.items()}
    assert [t.spec for t in find_step_targets(sources, {"engine.py": None})] == ["engine.py:train_one_epoch"]
    # handing the optimizer to a learning-rate helper alone (no loss) is no update
    only_rate = sources["engine.py"].replace("apply_update(loss, optimizer)", "print(loss)")
    assert find_step_targets({"engine.py": only_rate}, {"engine.py": None}) == []
    report = smoke_step(write_tree(tmp_path, DELEGATED), "engine.py:train_one_epoch", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"


def test_a_missing_zero_grad_in_the_update_helper_fails(tmp_path):
    files = {"engine.py": DELEGATED["engine.py"].replace("            optimizer.zero_grad()\n", "")}
    report = smoke_step(write_tree(tmp_path, files), "engine.py:train_one_epoch", None, device="cpu")
    assert report["status"] == "failed", report
    assert checks(report)["zero-grad"] == "fail", report


# A trainer whose constructor makes its optimizer over parameter groups the model lists (no ``.parameters()`` call
# in the trainer: the groups come from the model's own methods).
GROUPS = {
    "net.py": '''
        import torch.nn as nn


        class Segmenter(nn.Module):
            def __init__(self, channels=3, classes=4):
                super().__init__()
                self.backbone = nn.Conv2d(channels, 8, 3, padding=1)
                self.head = nn.Conv2d(8, classes, 1)

            def forward(self, x):
                return self.head(self.backbone(x).relu())

            def slow_params(self):
                yield from self.backbone.parameters()

            def fast_params(self):
                yield from self.head.parameters()
    ''',
    "trainer.py": '''
        import argparse
        import torch
        from net import Segmenter


        class Trainer:
            def __init__(self, opts):
                self.opts = opts
                model = Segmenter(classes=opts.classes)
                groups = [{"params": model.slow_params(), "lr": opts.lr},
                          {"params": model.fast_params(), "lr": opts.lr * 10}]
                self.optimizer = torch.optim.SGD(groups, lr=opts.lr, momentum=0.9)
                self.model = model
                self.criterion = torch.nn.CrossEntropyLoss()

            def training(self, loader):
                self.model.train()
                for image, mask in loader:
                    self.optimizer.zero_grad()
                    loss = self.criterion(self.model(image), mask)
                    loss.backward()
                    self.optimizer.step()


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--classes", type=int, default=4)
            parser.add_argument("--lr", type=float, default=0.01)
            Trainer(parser.parse_args()).training(None)
    ''',
}


def test_a_trainer_making_its_optimizer_over_parameter_groups_is_a_step():
    from gpu_runner.targets import find_step_targets

    sources = {path: textwrap.dedent(text) for path, text in GROUPS.items()}
    assert [t.spec for t in find_step_targets(sources, {"trainer.py": None})] == ["trainer.py:Trainer.training"]
    # without an optimizer made in the constructor (nor over what it holds in a method) it is no trainer
    no_optimizer = sources["trainer.py"].replace("self.optimizer = torch.optim.SGD(groups, lr=opts.lr, momentum=0.9)",
                                                 "self.groups = groups")
    assert find_step_targets(dict(sources, **{"trainer.py": no_optimizer}), {"trainer.py": None}) == []


def test_such_a_trainer_runs_and_a_missing_zero_grad_fails_at_its_line(tmp_path):
    report = smoke_step(write_tree(tmp_path / "as_is", GROUPS), "trainer.py:Trainer.training", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["params-updated"] == "pass", report
    files = dict(GROUPS, **{"trainer.py": GROUPS["trainer.py"].replace(
        "                    self.optimizer.zero_grad()\n", "")})
    root = write_tree(tmp_path / "planted", files)
    report = smoke_step(root, "trainer.py:Trainer.training", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "trainer.py",
                                                                                     "self.optimizer.step()")
