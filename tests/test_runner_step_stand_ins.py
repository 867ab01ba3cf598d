"""What a training step needs but the sandbox lacks, given in a way that still runs the step's own code (issue 27,
item 4): raw data files a script maps or reads (``np.memmap`` / ``np.fromfile``) that are missing get stand-in
data of the dtype and shape the code asks for, said in the notes; command-line arguments without a default get a
value the code itself declares (a choice, a value it compares the option with, a number by its type). A planted
bug in such a step still fails at its line; what cannot be derived stays a skip naming it."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

# A token model trained on a corpus prepared beforehand into a raw file of uint16 token ids (not in the tree).
TOKENS = '''
    import os
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    corpus_folder = os.path.join("prepared", "corpus")
    context = 128
    batch_size = 32
    steps = 1000


    class Predictor(nn.Module):
        def __init__(self, vocabulary, width):
            super().__init__()
            self.table = nn.Embedding(vocabulary, width)
            self.mix = nn.Linear(width, width)
            self.out = nn.Linear(width, vocabulary)

        def forward(self, ids):
            return self.out(torch.tanh(self.mix(self.table(ids))))


    def sample(split):
        ids = np.memmap(os.path.join(corpus_folder, split + ".tokens"), dtype=np.uint16, mode="r")
        starts = torch.randint(len(ids) - context - 1, (batch_size,))
        x = torch.stack([torch.from_numpy(ids[s:s + context].astype(np.int64)) for s in starts])
        y = torch.stack([torch.from_numpy(ids[s + 1:s + 1 + context].astype(np.int64)) for s in starts])
        return x, y


    model = Predictor(1000, 48)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = sample("train")
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def checks(report: dict) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def passed_notes(report: dict) -> str:
    """The step passed, with zero-grad and params-updated passing; its notes, joined."""
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    return " ".join(report["notes"])


def assert_zero_grad_fails_at(report: dict, root, path: str, text: str) -> None:
    """The step failed, and its zero-grad check at the line of ``path`` that holds ``text``."""
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, path, text)


def test_a_missing_raw_token_file_gets_stand_in_data_of_the_codes_dtype(tmp_path):
    root = write_tree(tmp_path, {"train.py": TOKENS})
    report = smoke_step(root, "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "'prepared/corpus/train.tokens' is missing" in notes and "uint16" in notes and "np.memmap" in notes


def test_a_planted_missing_zero_grad_still_fails_at_its_line_on_stand_in_data(tmp_path):
    root = write_tree(tmp_path, {"train.py": TOKENS.replace("        optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "train.py:__main__", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "train.py", "optimizer.step()")


def test_a_raw_file_that_exists_is_read_as_it_is(tmp_path):
    root = write_tree(tmp_path, {"train.py": TOKENS.replace('"r")', '"r") * 0 + 999  # ids the file holds')})
    (root / "prepared" / "corpus").mkdir(parents=True)
    np.full(4096, 999, dtype=np.uint16).tofile(root / "prepared" / "corpus" / "train.tokens")
    report = smoke_step(root, "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    assert not any("is missing" in note for note in report["notes"])


def test_fromfile_with_a_count_and_floats_gets_that_many_values(tmp_path):
    source = TOKENS.replace(
        '    model = Predictor(1000, 48)\n',
        '    weights = np.fromfile("prepared/init.f32", dtype=np.float32, count=48)\n'
        '    assert weights.shape == (48,) and weights.dtype == np.float32\n'
        '    model = Predictor(1000, 48)\n')
    report = smoke_step(write_tree(tmp_path, {"train.py": source}), "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    assert any("np.fromfile" in note and "float32, (48,)" in note for note in report["notes"])


# A display helper whose module asks the terminal for its width when imported: in a process without a terminal
# the import raises, and the epoch function (reading the file's globals) only calls it for its effect.
PROGRESS = {
    "display.py": '''
        import os

        rows, columns = os.popen("stty size 2>/dev/null < /dev/null", "r").read().split()


        def show_progress(index, total, text):
            print(f"[{index + 1}/{total}] {text}"[:int(columns)])
    ''',
    "network.py": '''
        import torch.nn as nn


        class Classifier(nn.Module):
            def __init__(self, width=12, classes=3):
                super().__init__()
                self.hidden = nn.Linear(width, 24)
                self.out = nn.Linear(24, classes)

            def forward(self, x):
                return self.out(self.hidden(x).relu())
    ''',
    "main.py": '''
        import torch
        import torch.nn as nn
        from display import show_progress
        from network import Classifier

        net = Classifier()
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)


        def train(epoch):
            net.train()
            for index, (x, y) in enumerate(trainloader):
                optimizer.zero_grad()
                loss = criterion(net(x), y)
                loss.backward()
                optimizer.step()
                show_progress(index, len(trainloader), f"loss {loss.item():.3f}")
    ''',
}


def test_a_helper_whose_import_failed_and_is_only_called_for_its_effect_is_a_no_op(tmp_path):
    report = smoke_step(write_tree(tmp_path, PROGRESS), "main.py:train", None, device="cpu")
    assert report["status"] == "passed", report
    assert any("'show_progress' is only called for its effect" in note and "ValueError" in note
               for note in report["notes"]), report["notes"]


def test_a_missing_zero_grad_fails_beside_a_no_op_progress_display(tmp_path):
    files = dict(PROGRESS, **{"main.py": PROGRESS["main.py"].replace("                optimizer.zero_grad()\n", "")})
    root = write_tree(tmp_path, files)
    report = smoke_step(root, "main.py:train", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "main.py", "optimizer.step()")


def test_a_helper_whose_result_the_step_uses_stays_a_skip(tmp_path):
    files = dict(PROGRESS, **{"main.py": PROGRESS["main.py"].replace(
        "                show_progress(index", "                shown = show_progress(index")})
    report = smoke_step(write_tree(tmp_path, files), "main.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "`from display import show_progress`" in report["reason"] and "ValueError" in report["reason"]


# A script whose options have no default: a required architecture name the code dispatches on, a required
# choice, a positional count; the loop trains what they select.
OPTIONS = '''
    import argparse
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", type=str, required=True, help="which network")
    parser.add_argument("--loss", required=True, choices=["cross_entropy", "nll"])
    parser.add_argument("hidden", type=int)
    options = parser.parse_args()


    def network(options):
        if options.arch == "wide":
            return nn.Sequential(nn.Linear(10, options.hidden * 4), nn.ReLU(), nn.Linear(options.hidden * 4, 3))
        elif options.arch == "narrow":
            return nn.Sequential(nn.Linear(10, options.hidden), nn.ReLU(), nn.Linear(options.hidden, 3))
        raise ValueError(options.arch)


    model = network(options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 10), torch.randint(0, 3, (16,))
    for epoch in range(100):
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y) if options.loss == "cross_entropy" else F.nll_loss(logits.log_softmax(1), y)
        loss.backward()
        optimizer.step()
'''


def test_required_options_get_values_the_code_declares(tmp_path):
    report = smoke_step(write_tree(tmp_path, {"train.py": OPTIONS}), "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    notes = " ".join(report["notes"])
    assert "--arch wide (a value the code compares it with)" in notes, notes
    assert "--loss cross_entropy (its first choice)" in notes and "hidden 32 (a small int by its name)" in notes


def test_a_missing_zero_grad_still_fails_with_declared_option_values(tmp_path):
    root = write_tree(tmp_path, {"train.py": OPTIONS.replace("        optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "train.py:__main__", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "train.py", "optimizer.step()")


def test_a_required_path_nothing_declares_stays_a_skip_naming_it(tmp_path):
    source = OPTIONS.replace('parser.add_argument("hidden", type=int)\n',
                             'parser.add_argument("hidden", type=int)\n    parser.add_argument("--data_root")\n'
                             '    parser.add_argument("--weights", required=True)\n')
    report = smoke_step(write_tree(tmp_path, {"train.py": source}), "train.py:__main__", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "needs command-line arguments (--weights)" in report["reason"], report["reason"]


# An experiment class built from the command line's options: its constructor makes the network and the optimizer
# itself (through a build method); the loaders are handed in by the script; its fit method loops over epochs.
EXPERIMENT = {
    "nets.py": '''
        import torch.nn as nn


        class Regressor(nn.Module):
            def __init__(self, features, hidden):
                super().__init__()
                self.inner = nn.Linear(features, hidden)
                self.outer = nn.Linear(hidden, 1)

            def forward(self, x):
                return self.outer(self.inner(x).tanh())
    ''',
    "experiment.py": '''
        import torch
        from nets import Regressor


        class Experiment:
            def __init__(self, options, train_loader, valid_loader):
                self.train_loader, self.valid_loader = train_loader, valid_loader
                self.epochs = options.epochs
                self.features, self.hidden, self.lr = options.features, options.hidden, options.lr
                self.build()

            def build(self):
                self.net = Regressor(self.features, self.hidden)
                self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.lr)
                self.criterion = torch.nn.MSELoss()

            def fit(self):
                for epoch in range(self.epochs):
                    self.net.train()
                    for x, y in self.train_loader:
                        self.optimizer.zero_grad()
                        loss = self.criterion(self.net(x), y)
                        loss.backward()
                        self.optimizer.step()
    ''',
    "main.py": '''
        import argparse
        from experiment import Experiment

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--epochs", type=int, default=50)
            parser.add_argument("--features", type=int, default=7)
            parser.add_argument("--hidden", type=int, default=64)
            parser.add_argument("--lr", type=float, default=1e-3)
            parser.add_argument("--data", default="data/series.csv")
            options = parser.parse_args()
            loaders = load(options.data)
            Experiment(options, *loaders).fit()
    ''',
}


def test_a_trainer_class_that_builds_its_own_model_is_a_step():
    from gpu_runner.targets import find_step_targets

    sources = {path: textwrap.dedent(text) for path, text in EXPERIMENT.items()}
    found = find_step_targets(sources, {"experiment.py": None})
    assert [t.spec for t in found] == ["experiment.py:Experiment.fit"]


def test_a_trainer_class_runs_on_its_options_with_the_model_it_builds(tmp_path):
    report = smoke_step(write_tree(tmp_path, EXPERIMENT), "experiment.py:Experiment.fit", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] in ("pass", "warn")
    assert any("Experiment built its own model: net (Regressor" in note for note in report["notes"]), report["notes"]


def test_a_trainer_class_without_zero_grad_fails_at_its_line(tmp_path):
    files = dict(EXPERIMENT, **{"experiment.py": EXPERIMENT["experiment.py"].replace(
        "                        self.optimizer.zero_grad()\n", "")})
    root = write_tree(tmp_path, files)
    report = smoke_step(root, "experiment.py:Experiment.fit", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "experiment.py", "self.optimizer.step()")


def test_a_trainer_class_whose_options_cannot_be_built_stays_a_skip(tmp_path):
    files = dict(EXPERIMENT, **{"main.py": EXPERIMENT["main.py"].replace(
        '            parser.add_argument("--features", type=int, default=7)\n', "")})
    files["experiment.py"] = files["experiment.py"].replace("options.features", "options.n_series_xyz")
    report = smoke_step(write_tree(tmp_path, files), "experiment.py:Experiment.fit", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "n_series_xyz" in report["reason"], report["reason"]


def test_code_after_a_trainer_methods_loop_that_raises_is_noted_not_checked(tmp_path):
    files = dict(EXPERIMENT, **{"experiment.py": EXPERIMENT["experiment.py"].replace(
        "                        self.optimizer.step()\n",
        "                        self.optimizer.step()\n"
        "                    if loss.item() > 1e9:\n"
        "                        best = self.net.state_dict()\n"
        "                torch.save(best, 'best.pt')  # unbound when no epoch was better: the repository's own slip\n")})
    files["main.py"] = files["main.py"].replace("default=50", "default=3")
    report = smoke_step(write_tree(tmp_path, files), "experiment.py:Experiment.fit", None, device="cpu")
    assert report["status"] == "passed", report
    assert any("the code after it raised UnboundLocalError" in note for note in report["notes"]), report["notes"]
    # the same error inside the loop, before the steps ran, is the step's: a skip naming it, never a pass
    files["experiment.py"] = files["experiment.py"].replace(
        "                        self.optimizer.zero_grad()\n",
        "                        self.optimizer.zero_grad()\n                        print(best)\n")
    report = smoke_step(write_tree(tmp_path / "inside", files), "experiment.py:Experiment.fit", None, device="cpu")
    assert report["status"] == "skipped" and "UnboundLocalError" in report["reason"], report
