"""A step function that takes its model, loader and loss as parameters from a ``main()`` its script calls (a
contrastive step concatenating two views of each sample, ``torch.cat([views[0], views[1]])``, with its own loss),
which the runner's own arguments do not fit: ``main()`` runs as the script runs it, up to its loop calling the step,
bounded (issue 27, item 4). A logger from a package the runner lacks that the code only calls methods of, dropping
what they return, writes nothing instead of skipping the step. A planted missing ``zero_grad()`` still fails at
its line; a ``main()`` that cannot run stays a skip."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

SCRIPT = '''
    import argparse

    import not_installed_board as board_lib
    import torch
    from torch import nn


    class Encoder(nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.first, self.second = nn.Linear(10, width), nn.Linear(width, 6)

        def forward(self, x):
            return nn.functional.normalize(self.second(torch.relu(self.first(x))), dim=1)


    class PairLoss(nn.Module):
        def forward(self, first, second):
            logits = first @ second.t() * 5.0
            return nn.functional.cross_entropy(logits, torch.arange(len(first)))


    class Pairs(torch.utils.data.Dataset):
        def __init__(self):
            self.points = torch.randn(64, 10)

        def __len__(self):
            return len(self.points)

        def __getitem__(self, index):
            point = self.points[index]
            return [point + 0.05 * torch.randn(10), point + 0.05 * torch.randn(10)], index % 4


    def train(loader, model, criterion, optimizer, epoch):
        model.train()
        for views, labels in loader:
            joined = torch.cat([views[0], views[1]], dim=0)
            size = labels.shape[0]
            first, second = torch.split(model(joined), [size, size], dim=0)
            loss = criterion(first, second)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss.item()


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--batch_size", type=int, default=32)
        parser.add_argument("--epochs", type=int, default=20)
        opt = parser.parse_args()
        loader = torch.utils.data.DataLoader(Pairs(), batch_size=opt.batch_size, shuffle=True)
        model = Encoder()
        criterion = PairLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        logger = board_lib.Logger("runs", flush_secs=2)
        for epoch in range(opt.epochs):
            loss = train(loader, model, criterion, optimizer, epoch)
            logger.log_value("loss", loss, epoch)


    if __name__ == "__main__":
        main()
'''


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def test_a_step_taking_what_main_makes_runs_through_main(tmp_path):
    root = write_tree(tmp_path, {"train.py": SCRIPT})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "passed", report
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["zero-grad"] == "pass" and statuses["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "the runner's own plan for the step was skipped" in notes
    assert "train takes what main(), which the script calls, makes" in notes
    assert "'not_installed_board'" in notes  # its logger wrote nothing, said


def test_a_planted_missing_zero_grad_fails_at_its_line_through_main(tmp_path):
    root = write_tree(tmp_path, {"train.py": SCRIPT.replace("            optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "train.py",
                                                                                     "optimizer.step()")


def test_a_logger_whose_value_is_used_still_needs_its_package(tmp_path):
    script = SCRIPT.replace('            logger.log_value("loss", loss, epoch)\n',
                            '            logger.log_value("loss", loss, epoch)\n            print(logger.step)\n')
    root = write_tree(tmp_path, {"train.py": script})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "run through its script" in report["reason"] and "not_installed_board" in report["reason"]


def test_a_main_that_cannot_run_is_a_skip_not_a_failure(tmp_path):
    script = SCRIPT.replace("self.points = torch.randn(64, 10)", 'self.points = torch.load("prepared/points.pt")')
    root = write_tree(tmp_path, {"train.py": script})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "run through its script" in report["reason"] and "points.pt" in report["reason"]


def test_a_main_the_script_never_calls_is_not_run(tmp_path):
    root = write_tree(tmp_path, {"train.py": SCRIPT.replace("    main()\n", "    pass\n")})
    report = smoke_step(root, "train.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "run through its script" not in report["reason"]
