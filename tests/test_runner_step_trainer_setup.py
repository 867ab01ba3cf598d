"""A trainer class that sets up everything in its constructor, as a segmentation trainer does (issue 27, item 4):
its data sets read a folder that is not on the runner (and one concatenates two of them), its writer comes from
a helper module importing tensorboardX, its backbone downloads pretrained weights, its criterion casts the target
to class indices, and its learning-rate schedule runs over ``epochs * len(loader)`` iterations. The step runs on
stand-in rows made once the model exists, the writer writes nothing, the weights stay as initialized, each said
in the notes. A planted missing ``zero_grad()`` still fails at its line; a download failing for another reason
is not answered."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

TREE = {
    "helpers/__init__.py": "",
    "helpers/board.py": '''
        from tensorboardX import SummaryWriter


        class Board:
            def __init__(self, folder):
                self.folder = folder

            def open(self):
                return SummaryWriter(log_dir=self.folder)
    ''',
    "helpers/pieces.py": '''
        import os
        import torch
        from torch.utils.data import Dataset


        class Scans(Dataset):
            CLASSES = 5

            def __init__(self, root, part):
                with open(os.path.join(root, part + ".txt")) as listing:
                    self.names = listing.read().split()

            def __len__(self):
                return len(self.names)

            def __getitem__(self, i):
                return {"image": torch.load(self.names[i]), "label": torch.load(self.names[i] + ".mask")}


        class Joined(Dataset):
            CLASSES = 5

            def __init__(self, parts):
                self.names = [n for part in parts for n in part.names]

            def __len__(self):
                return len(self.names)


        class Painter(torch.nn.Module):
            def __init__(self, classes, weights_url="https://weights.invalid/painter.pth"):
                super().__init__()
                self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                                torch.nn.Conv2d(8, classes, 1))
                self.load_state_dict(torch.hub.load_state_dict_from_url(weights_url))

            def forward(self, x):
                return self.body(x)


        class Losses:
            def __init__(self, ignore=255):
                self.ignore = ignore

            def pick(self):
                return self.cross_entropy

            def cross_entropy(self, logits, target):
                return torch.nn.functional.cross_entropy(logits, target.long(), ignore_index=self.ignore)


        class Poly:
            def __init__(self, rate, epochs, per_epoch):
                self.rate, self.per_epoch, self.total = rate, per_epoch, epochs * per_epoch

            def __call__(self, optimizer, i, epoch):
                fraction = 1 - (epoch * self.per_epoch + i) / self.total
                assert fraction > 0, "schedule past its end"
                for group in optimizer.param_groups:
                    group["lr"] = self.rate * fraction ** 0.9
    ''',
    "fit.py": '''
        import argparse
        import torch
        from torch.utils.data import DataLoader
        from helpers.board import Board
        from helpers.pieces import Joined, Losses, Painter, Poly, Scans


        class Fitter:
            def __init__(self, args):
                self.args = args
                self.writer = Board("runs").open()
                train = Joined([Scans(args.root, "train"), Scans(args.root, "extra")])
                self.train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
                self.model = Painter(train.CLASSES)
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
                self.criterion = Losses().pick()
                self.schedule = Poly(args.lr, args.epochs, len(self.train_loader))

            def fit_epoch(self, epoch):
                self.model.train()
                bar = iter(self.train_loader)
                for i, sample in enumerate(bar):
                    image, target = sample["image"], sample["label"]
                    self.schedule(self.optimizer, i, epoch)
                    self.optimizer.zero_grad()
                    loss = self.criterion(self.model(image), target)
                    loss.backward()
                    self.optimizer.step()
                    self.writer.add_scalar("loss", loss.item(), i)


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--root", default="/data/scans")
            parser.add_argument("--batch_size", type=int, default=4)
            parser.add_argument("--lr", type=float, default=0.01)
            parser.add_argument("--epochs", type=int, default=None)
            args = parser.parse_args()
            if args.epochs is None:
                args.epochs = 30
            fitter = Fitter(args)
            for epoch in range(args.epochs):
                fitter.fit_epoch(epoch)


        if __name__ == "__main__":
            main()
    ''',
}


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def test_a_trainer_set_up_in_its_constructor_runs_on_stand_ins_and_says_so(tmp_path):
    report = smoke_step(write_tree(tmp_path, TREE), "fit.py:Fitter.fit_epoch", None, device="cpu")
    assert report["status"] == "passed", report
    notes = " ".join(report["notes"])
    assert "data set Scans could not be built" in notes and "data set Joined is built over data sets that stood" \
        in notes, notes
    assert "tensorboardX is not installed" in notes, notes
    assert "weights.invalid/painter.pth" in notes and "kept the weights it was initialized with" in notes, notes
    assert "class indices" in notes and "reads its batch by keys (image, label)" in notes, notes
    assert "epochs=30" in notes, notes  # what main() sets on its options after parsing them


def test_a_missing_zero_grad_fails_at_its_line(tmp_path):
    files = dict(TREE, **{"fit.py": TREE["fit.py"].replace("self.optimizer.zero_grad()\n", "pass\n")})
    root = write_tree(tmp_path, files)
    report = smoke_step(root, "fit.py:Fitter.fit_epoch", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "fit.py",
                                                                                     "self.optimizer.step()")


def test_a_download_failing_for_another_reason_is_not_answered(tmp_path):
    files = dict(TREE, **{"helpers/pieces.py": TREE["helpers/pieces.py"].replace(
        '"https://weights.invalid/painter.pth"', '"not a url"')})
    report = smoke_step(write_tree(tmp_path, files), "fit.py:Fitter.fit_epoch", None, device="cpu")
    assert report["status"] == "skipped" and "constructing Fitter" in report["reason"], report


def test_the_stand_in_keeps_class_constants_not_methods():
    from torch.utils.data import Dataset

    from gpu_runner.steps import _StandInDataset, _stand_in_class

    class Listing(Dataset):
        CLASSES = 7
        NAMES = ("a", "b")

        def describe(self):
            return "mine"

    stand_in = _stand_in_class(Listing)
    assert issubclass(stand_in, _StandInDataset) and stand_in.CLASSES == 7 and stand_in.NAMES == ("a", "b")
    assert not hasattr(stand_in, "describe")
