"""What a training step needs but the sandbox lacks, given in a way that still runs the step's own code (issue 27,
item 4): raw data files a script maps or reads (``np.memmap`` / ``np.fromfile``) that are missing get stand-in
data of the dtype and shape the code asks for, said in the notes; command-line arguments without a default get a
value the code itself declares (a choice, a value it compares the option with, a number by its type). A planted
bug in such a step still fails at its line; what cannot be derived stays a skip naming it."""
from __future__ import annotations

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
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail"
    assert zero_grad["details"]["line"] == line_of(root, "train.py", "optimizer.step()")


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
