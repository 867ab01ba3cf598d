"""A step function of a script that trains what the script's own setup assigns (``def train(epoch)`` reading the
``net``, ``optimizer`` and loader made under ``__main__``), where the runner cannot build that model itself (a
factory taking the parsed options, moving the model to CUDA when an option says so, exiting on a name it does not
know): the script's setup runs as the script runs it, then its loop calling the step, bounded (issue 27, item 4).
A planted missing ``zero_grad()`` still fails at its line; a setup that cannot run stays a skip, never a failure.
Also: an options namespace for a factory gets, for an option without a default, a constant the code compares it
with, and a factory that calls ``sys.exit()`` on a guess is a skip, not the end of the worker."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

FACTORY = '''
    import sys
    import torch.nn as nn


    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))

        def forward(self, x):
            return self.body(x)


    class Wide(Small):
        pass


    def build_classifier(opts):
        if opts.kind == "small":
            net = Small()
        elif opts.kind == "wide":
            net = Wide()
        else:
            print("unknown kind")
            sys.exit()
        if opts.use_cuda:
            net = net.cuda()
        return net
'''

SCRIPT = '''
    import argparse

    import torch
    import torch.nn as nn
    from torch.utils.tensorboard import SummaryWriter

    from factory import build_classifier


    def train(epoch):
        net.train()
        for features, labels in loader:
            optimizer.zero_grad()
            loss = criterion(net(features), labels)
            loss.backward()
            optimizer.step()
            board.add_scalar("loss", loss.item(), epoch)


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--kind", type=str, required=True)
        parser.add_argument("--use_cuda", type=bool, default=True)
        parser.add_argument("--batch", type=int, default=64)
        args = parser.parse_args()

        net = build_classifier(args)
        features = torch.randn(256, 12)
        labels = torch.randint(0, 3, (256,))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels), batch_size=args.batch)
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        board = SummaryWriter("runs")
        for epoch in range(1, 30):
            train(epoch)
'''

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the factory's .cuda() works on a CUDA machine, so "
                                                                 "the runner's own plan builds the model there")


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def checks(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


@no_cuda
def test_a_step_reading_its_scripts_model_runs_through_the_scripts_setup(tmp_path):
    root = write_tree(tmp_path, {"factory.py": FACTORY, "train.py": SCRIPT})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "the runner's own plan for the step was skipped" in notes
    assert "the script's loop calling train()" in notes
    assert "--kind small" in notes  # the option without a default: the constant the factory compares it with
    if "tensorboard" not in notes:  # the package installed: the script's own writer ran
        pytest.importorskip("tensorboard")
    else:
        assert "SummaryWriter wrote nothing" in notes


@no_cuda
def test_a_planted_missing_zero_grad_fails_at_its_line_through_the_script(tmp_path):
    root = write_tree(tmp_path, {"factory.py": FACTORY,
                                 "train.py": SCRIPT.replace("            optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "train.py",
                                                                                     "optimizer.step()")


@no_cuda
def test_a_script_setup_that_cannot_run_is_a_skip_not_a_failure(tmp_path):
    script = SCRIPT.replace('features = torch.randn(256, 12)', 'features = torch.load("prepared/features.pt")')
    root = write_tree(tmp_path, {"factory.py": FACTORY, "train.py": script})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "run through its script" in report["reason"] and "features.pt" in report["reason"]


def test_a_step_without_a_loop_calling_it_keeps_the_runners_skip(tmp_path):
    script = SCRIPT.replace("        for epoch in range(1, 30):\n            train(epoch)\n", "")
    root = write_tree(tmp_path, {"factory.py": FACTORY.replace("if opts.use_cuda:", "if opts.use_cuda and False:"),
                                 "train.py": script.replace('"--kind", type=str, required=True',
                                                            '"--kind", type=str, default="tiny"')})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "run through its script" not in report["reason"]


def test_a_factorys_options_take_a_constant_the_code_compares_an_option_without_default_with(tmp_path):
    factory = FACTORY.replace("if opts.use_cuda:", "if opts.use_cuda and False:")
    root = write_tree(tmp_path, {"factory.py": factory, "train.py": SCRIPT})
    subject = build_subject(root, "factory.py:build_classifier", device="cpu")
    assert not isinstance(subject, Skip), subject
    assert type(subject.model).__name__ == "Small"
    assert any("kind='small': a value the code compares it with" in n for n in subject.notes), subject.notes


def test_a_factory_exiting_on_a_guess_is_a_skip_not_the_end_of_the_worker(tmp_path):
    factory = FACTORY + '''

    def checked_classifier(hidden_size):
        if hidden_size not in (512, 1024):
            sys.exit("unsupported width")
        return Small()
'''
    root = write_tree(tmp_path, {"factory.py": factory})
    subject = build_subject(root, "factory.py:checked_classifier", device="cpu")  # must not raise SystemExit
    assert isinstance(subject, Skip), subject
    assert "exited" in subject.reason
