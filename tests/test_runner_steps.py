"""Running the training step itself (issue 14, item 4): planted bugs in real-looking training code (no zero_grad,
a trainable layer left out of the optimizer, the model left in eval mode, a loss detached from the model, an
evaluation helper in train mode) are caught with the right diagnosis on the right line, correct steps pass, and
whatever cannot be built is skipped, never failed."""
from __future__ import annotations

import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpu_runner import steps as steps_module  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from gpu_runner.targets import find_step_targets  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

MODELS = textwrap.dedent('''
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self, in_features=16, hidden=32, num_classes=4):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(0.1))
            self.head = nn.Linear(hidden, num_classes)

        def forward(self, x):
            return self.head(self.encoder(x))
''')

TRAIN = textwrap.dedent('''
    import torch
    from models import Net


    def train_one_epoch(model, loader, optimizer, criterion, device):
        model.train()
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        return total / len(loader)


    @torch.no_grad()
    def evaluate(model, loader, criterion, device):
        model.eval()
        return sum(criterion(model(x.to(device)), y.to(device)).item() for x, y in loader)


    def main():
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            train_one_epoch(model, [], optimizer, torch.nn.CrossEntropyLoss(), "cpu")
            evaluate(model, [], torch.nn.CrossEntropyLoss(), "cpu")
''')

LIGHTNING = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class LitClassifier(nn.Module):
        def __init__(self, in_features=16, num_classes=4):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Dropout(0.1))
            self.head = nn.Linear(32, num_classes)

        def forward(self, x):
            return self.head(self.encoder(x))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)
''')

MNIST = textwrap.dedent('''
    import torch.nn as nn
    import torch.nn.functional as F


    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, 1)
            self.dropout = nn.Dropout(0.25)
            self.fc = nn.Linear(8 * 13 * 13, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            return F.log_softmax(self.fc(self.dropout(x.flatten(1))), dim=1)


    def train(args, model, device, train_loader, optimizer, epoch):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and args.dry_run:
                break
''')

TRAINER = textwrap.dedent('''
    from models import Net


    class Trainer:
        def __init__(self, model, optimizer, criterion, device="cpu"):
            self.model, self.optimizer, self.criterion, self.device = model, optimizer, criterion, device

        def train_step(self, batch):
            x, y = batch
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.criterion(self.model(x.to(self.device)), y.to(self.device))
            loss.backward()
            self.optimizer.step()
            return loss.item()


    def build():
        return Trainer(Net(), None, None)
''')

FINE_TUNE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F


    def fine_tune(model, loader, epochs):
        for p in model.encoder.parameters():
            p.requires_grad = False
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        for p in model.encoder.parameters():  # unfrozen, but the optimizer was built without them
            p.requires_grad = True
        model.train()
        for _ in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
''')


def line_of(root: Path, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def run(root: Path, target: str, config=None) -> dict:
    return smoke_step(root, target, config, device="cpu")


def statuses(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def failures(report: dict) -> set:
    return {c["name"] for c in report["checks"] if c["status"] == "fail"}


# ---- finding steps ---------------------------------------------------------------------------------------

def test_steps_are_found_by_shape_and_by_the_changed_lines():
    sources = {"train.py": textwrap.dedent(TRAIN), "lit.py": textwrap.dedent(LIGHTNING),
               "mnist.py": textwrap.dedent(MNIST), "trainer.py": textwrap.dedent(TRAINER),
               "helpers.py": "def train(model, loader):\n    for x in loader:\n        model(x)\n"}
    found = find_step_targets(sources, {path: None for path in sources})
    assert [t.spec for t in found] == ["lit.py:LitClassifier.training_step", "mnist.py:train",
                                       "train.py:train_one_epoch", "trainer.py:Trainer.train_step"]
    assert all(t.kind == "step" for t in found)
    first = next(t for t in found if t.spec == "train.py:train_one_epoch")
    assert [t.spec for t in find_step_targets(sources, {"train.py": {first.line + 3}})] == ["train.py:train_one_epoch"]
    assert find_step_targets(sources, {"train.py": {first.end_line + 3}}) == []  # evaluate changed, not the step


# ---- correct steps pass ----------------------------------------------------------------------------------

@pytest.mark.parametrize("files, target", [
    ({"models.py": MODELS, "train.py": TRAIN}, "train.py:train_one_epoch"),
    ({"lit.py": LIGHTNING}, "lit.py:LitClassifier.training_step"),
    ({"mnist.py": MNIST}, "mnist.py:train"),
    ({"models.py": MODELS, "trainer.py": TRAINER}, "trainer.py:Trainer.train_step"),
])
def test_correct_steps_pass_every_check(tmp_path, files, target):
    report = run(write_tree(tmp_path, files), target)
    assert report["status"] == "passed", report["reason"] or report["checks"]
    assert not {c["name"] for c in report["checks"] if c["status"] in ("fail", "warn", "error")}
    assert statuses(report)["loss"] == statuses(report)["params-updated"] == "pass"
    assert check(report, "loss")["details"]["losses"][-1] < check(report, "loss")["details"]["losses"][0]


def test_an_epoch_function_that_sets_train_mode_and_its_evaluation_helper_pass(tmp_path):
    report = run(write_tree(tmp_path, {"models.py": MODELS, "train.py": TRAIN}), "train.py:train_one_epoch")
    assert "called in eval mode" in check(report, "train-mode")["message"]
    assert check(report, "eval-mode")["status"] == "pass"
    assert any("the model: models.py:Net" in note for note in report["notes"])


# ---- planted bugs ----------------------------------------------------------------------------------------

def test_missing_zero_grad_is_named_on_the_optimizer_step(tmp_path):
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": TRAIN.replace("        optimizer.zero_grad()\n", "", 1)})
    report = run(root, "train.py:train_one_epoch")
    assert failures(report) == {"zero-grad"}
    zero_grad = check(report, "zero-grad")
    assert "not zeroed between optimizer steps" in zero_grad["message"]
    assert zero_grad["details"]["line"] == line_of(root, "train.py", "optimizer.step()")


def test_a_trainable_layer_left_out_of_the_optimizer(tmp_path):
    root = write_tree(tmp_path, {"models.py": MODELS, "finetune.py": FINE_TUNE})
    report = run(root, "finetune.py:fine_tune", {"model": "models.py:Net"})
    assert failures(report) == {"optimizer-coverage"}  # not misread as a missing zero_grad
    coverage = check(report, "optimizer-coverage")
    assert "`encoder.0`" in coverage["message"] and "in no optimizer" in coverage["message"]
    assert coverage["details"]["line"] == line_of(root, "finetune.py", "optimizer = torch.optim.Adam")


def test_a_lightning_module_whose_optimizer_covers_only_the_head(tmp_path):
    source = LIGHTNING.replace("torch.optim.Adam(self.parameters(), lr=1e-3)",
                               '{"optimizer": torch.optim.Adam(self.head.parameters(), lr=1e-3)}')
    report = run(write_tree(tmp_path, {"lit.py": source}), "lit.py:LitClassifier.training_step")
    assert failures(report) == {"optimizer-coverage"}
    assert statuses(report)["zero-grad"] == "skip"  # the runner's loop zeroes, as Lightning's does


def test_the_model_left_in_eval_mode_after_evaluation(tmp_path):
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": TRAIN.replace("    model.train()\n", "")})
    report = run(root, "train.py:train_one_epoch")
    assert failures(report) == {"train-mode"}
    train_mode = check(report, "train-mode")
    assert "never calls `model.train()`" in train_mode["message"] and "`encoder.2`" in train_mode["message"]
    assert train_mode["details"]["line"] == line_of(root, "train.py", "loss = criterion(model(x), y)")


def test_no_false_alarm_when_the_caller_sets_train_mode(tmp_path):
    source = TRAIN.replace("    model.train()\n", "").replace(
        "        train_one_epoch(model, [],", "        model.train()\n        train_one_epoch(model, [],")
    report = run(write_tree(tmp_path, {"models.py": MODELS, "train.py": source}), "train.py:train_one_epoch")
    assert report["status"] == "passed" and "its caller does" in check(report, "train-mode")["message"]


def test_a_loss_detached_from_the_model_does_not_fall(tmp_path):
    source = TRAIN.replace("        loss = criterion(model(x), y)",
                           "        logits = model(x).detach().requires_grad_()\n"
                           "        loss = criterion(logits, y)")
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": source})
    report = run(root, "train.py:train_one_epoch")
    assert failures(report) == {"loss", "params-updated"}
    assert "does not depend on any of the model's parameters" in check(report, "loss")["message"]
    assert check(report, "loss")["details"]["line"] == line_of(root, "train.py", "loss.backward()")


def test_a_loss_without_a_graph_is_the_step_failing_not_a_skip(tmp_path):
    source = TRAIN.replace("        loss = criterion(model(x), y)", "        loss = criterion(model(x).detach(), y)")
    report = run(write_tree(tmp_path, {"models.py": MODELS, "train.py": source}), "train.py:train_one_epoch")
    assert report["status"] == "failed" and "no autograd graph" in check(report, "loss")["message"]


def test_an_evaluation_helper_left_in_train_mode(tmp_path):
    source = TRAIN.replace("    model.eval()\n", "")
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": source})
    report = run(root, "train.py:train_one_epoch")
    assert failures(report) == {"eval-mode"}
    assert "never calls `model.eval()`" in check(report, "eval-mode")["message"]


# ---- never cry wolf --------------------------------------------------------------------------------------

def test_what_cannot_be_built_or_called_is_skipped_with_the_reason(tmp_path):
    root = write_tree(tmp_path, {
        "models.py": MODELS,
        "train.py": TRAIN.replace("def train_one_epoch(model, loader, optimizer, criterion, device):",
                                  "def train_one_epoch(model, loader, optimizer, criterion, device, tokenizer):")
                          .replace("x, y = x.to(device)", "x, y = tokenizer(x).to(device)"),
        "three.py": TRAIN.replace("    for x, y in loader:", "    for x, y, lengths in loader:"),
        "orphan.py": "def train_one_epoch(model, loader, optimizer):\n    for x, y in loader:\n"
                     "        optimizer.zero_grad(); model(x).sum().backward(); optimizer.step()\n"})
    unknown = run(root, "train.py:train_one_epoch")
    assert unknown["status"] == "skipped" and "'tokenizer'" in unknown["reason"]
    unpacking = run(root, "three.py:train_one_epoch")
    assert unpacking["status"] == "skipped" and "synthetic arguments" in unpacking["reason"]
    orphan = run(root, "orphan.py:train_one_epoch")
    assert orphan["status"] == "skipped" and "found no model" in orphan["reason"]


def test_a_crash_of_the_harness_is_a_runner_error(tmp_path, monkeypatch):
    def broken(subject):
        raise ZeroDivisionError("the runner's own bug")

    monkeypatch.setattr(steps_module, "_reference_gradients", broken)
    report = run(write_tree(tmp_path, {"models.py": MODELS, "train.py": TRAIN}), "train.py:train_one_epoch")
    assert report["status"] == "error" and "runner failed" in report["reason"] and not report["checks"]


def test_the_instrumentation_leaves_torch_as_it_found_it(tmp_path):
    backward, optimizer_init = torch.Tensor.backward, torch.optim.Optimizer.__init__
    run(write_tree(tmp_path, {"models.py": MODELS, "train.py": TRAIN}), "train.py:train_one_epoch")
    assert torch.Tensor.backward is backward and torch.optim.Optimizer.__init__ is optimizer_init


# ---- through the runner and into the review --------------------------------------------------------------

def test_steps_and_models_share_one_warm_child(tmp_path):
    from gpu_runner.runner import TargetRequest, run_targets
    from gpu_runner.sandbox import SandboxLimits

    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": TRAIN.replace("        optimizer.zero_grad()\n", "", 1)})
    requests = [TargetRequest("models.py:Net"), TargetRequest("train.py:train_one_epoch", kind="step")]
    reports, _ = run_targets(root, requests, device="cpu", steps=5, seed=0, limits=SandboxLimits(timeout_s=120),
                             sandbox=False)
    assert [r["status"] for r in reports] == ["passed", "failed"]
    zero_grad = next(c for c in reports[1]["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "train.py",
                                                                                     "optimizer.step()")
    assert reports[1]["measures"]["iteration_ms"] > 0 and "step_time_ms" not in reports[1]["measures"]


def test_the_review_comment_goes_on_the_line_the_step_check_names():
    from bot.smoke import failing_target_comments

    check_result = {"name": "zero-grad", "status": "fail", "message": "gradients are not zeroed",
                    "details": {"line": 14}}
    run_report = {"targets": [{"target": "train.py:train_one_epoch", "line": 5, "status": "failed",
                               "head": {"checks": [check_result]}}]}
    diff = types.SimpleNamespace(commentable={5, 6, 14})
    (comment,) = failing_target_comments(run_report, {"train.py": diff}, {"train.py:train_one_epoch": (5, 20)})
    assert comment["line"] == 14 and "zero-grad" in comment["body"]
    diff.commentable = {5, 6}  # the named line is not in the diff: the step's first line that is
    (comment,) = failing_target_comments(run_report, {"train.py": diff}, {"train.py:train_one_epoch": (5, 20)})
    assert comment["line"] == 5


def test_a_validation_pass_inside_the_epoch_is_not_a_training_forward(tmp_path):
    source = TRAIN.replace("        total += loss.item()\n",
                           "        total += loss.item()\n"
                           "        model.eval()\n"
                           "        criterion(model(x), y)  # a validation forward, autograd left on\n"
                           "        model.train()\n")
    report = run(write_tree(tmp_path, {"models.py": MODELS, "train.py": source}), "train.py:train_one_epoch")
    assert report["status"] == "passed", [c for c in report["checks"] if c["status"] == "fail"]


# ---- running steps unconfigured (issue 27, item 4) --------------------------------------------------------

CUDA_FLAG_STEP = textwrap.dedent('''
    import torch
    from models import Net


    def train_epoch(model, loader, optimizer, cuda, log_interval):
        model.train()
        for index, (x, y) in enumerate(loader):
            if cuda:
                x, y = x.cuda(), y.cuda()
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if index % log_interval == 0:
                pass
''')


def test_smoke_steps_args_supply_what_the_runner_cannot_build(tmp_path):
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": CUDA_FLAG_STEP})
    unconfigured = run(root, "train.py:train_epoch")
    assert unconfigured["status"] == "skipped"
    assert "'cuda'" in unconfigured["reason"] and "args = {cuda = ...}" in unconfigured["reason"]
    configured = run(root, "train.py:train_epoch", {"args": {"cuda": False, "log_interval": 10}})
    assert configured["status"] == "passed", configured
    typo = run(root, "train.py:train_epoch", {"args": {"cude": False}})
    assert typo["status"] == "skipped" and "has no parameter 'cude'" in typo["reason"] \
        and "its parameters: model, loader, optimizer, cuda, log_interval" in typo["reason"]


ARGPARSE_STEP = textwrap.dedent('''
    import argparse
    import torch
    import torch.nn.functional as F
    from torchvision import datasets, transforms
    from models import Net


    def train(args, model, device, train_loader, optimizer, epoch):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target) * args.loss_weight
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and args.dry_run:
                break


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--loss-weight", type=float, default=0.5)
        parser.add_argument("--log-interval", type=int, default=10)
        parser.add_argument("--dry-run", action="store_true")
        args = parser.parse_args()
        train_loader = torch.utils.data.DataLoader(datasets.MNIST("data", transform=transforms.ToTensor()))


    if __name__ == "__main__":
        main()
''')


def _skip_where_torchvision_is_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:  # a GPU image has it: nothing stands in for it there
        pytest.skip("torchvision is installed on this runner")


def test_a_step_reads_its_scripts_argparse_defaults_and_imports_torchvision_through_a_stand_in(tmp_path):
    """``args.loss_weight`` is no name the runner knows: the script's own default says 0.5. The script imports
    torchvision (not installed) for its data only: a stand-in while it is imported."""
    _skip_where_torchvision_is_installed()
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": ARGPARSE_STEP})
    report = run(root, "train.py:train")
    assert report["status"] == "passed", report
    assert any("stand-ins for 'torchvision'" in note for note in report["notes"]), report["notes"]


def test_a_step_that_uses_a_missing_package_is_skipped_naming_it_and_the_line(tmp_path):
    # a detection data set: outside what gpu_runner.vision_data stands in for (classification data, transforms)
    _skip_where_torchvision_is_installed()
    step = ARGPARSE_STEP.replace("        loss.backward()",
                                 "        loss.backward()\n        datasets.CocoDetection(\"boxes\", \"boxes.json\")")
    assert step != ARGPARSE_STEP
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": step})
    report = run(root, "train.py:train")
    assert report["status"] == "skipped"
    line = line_of(root, "train.py", "datasets.CocoDetection")
    assert f"uses 'torchvision' at train.py:{line}, which is not installed on the smoke runner" in report["reason"]


LIGHTNING_MODULE = {"lit.py": '''
    import pytorch_lightning as pl
    import torch
    from torch import nn


    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters())
    '''}


def test_a_lightning_module_without_lightning_installed_says_so(tmp_path):
    try:
        import pytorch_lightning  # noqa: F401
        pytest.skip("pytorch_lightning is installed here")
    except ImportError:
        pass
    report = run(write_tree(tmp_path, LIGHTNING_MODULE), "lit.py:Lit.training_step")
    assert report["status"] == "skipped"
    assert "needs 'pytorch_lightning', which is not installed on the smoke runner" in report["reason"], report


def test_a_lightning_module_runs_where_lightning_is_installed(tmp_path):
    """The runner's image and `runner` extra have Lightning; ``self.log`` outside a Trainer only warns."""
    pytest.importorskip("pytorch_lightning")
    report = run(write_tree(tmp_path, LIGHTNING_MODULE), "lit.py:Lit.training_step")
    assert report["status"] == "passed", report


def test_a_training_loop_under_any_name_is_a_step_when_it_takes_a_loader():
    source = textwrap.dedent('''
        def fit_classifier(model, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()

        def report(model, loader):
            for x, y in loader:
                print(model(x))

        def main(config):
            for step in range(10):
                loss.backward()
                optimizer.step()
    ''')
    found = find_step_targets({"fit.py": source}, {"fit.py": None})
    assert [t.name for t in found] == ["fit_classifier"]


# A step that makes its own loader over the data set it is given, pinning memory where there is a GPU: the rows the
# runner hands it are on the CPU, as a real data set's are, so they can be pinned, and the step moves each batch.
PINNING_STEP = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader
    from models import Net


    def fit(model, train_dataset, optimizer, device):
        loader = DataLoader(train_dataset, batch_size=8, shuffle=True, pin_memory=torch.cuda.is_available())
        model.train()
        for inputs, labels in loader:
            assert inputs.device.type == "cpu"
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
''')


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="a GPU runner's rows; this machine has no CUDA"))])
def test_the_data_set_a_step_is_given_holds_cpu_rows_it_can_pin(tmp_path, device):
    root = write_tree(tmp_path, {"models.py": MODELS, "train.py": PINNING_STEP})
    report = smoke_step(root, "train.py:fit", None, device=device)
    assert report["status"] == "passed", report
