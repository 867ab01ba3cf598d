"""Shards of raw token data that a preparation step writes into a folder (not in the tree), listed with
``glob.glob`` by a data module that maps them with ``np.memmap``: while a script's step runs, the listing of the
missing folder is a few stand-in names, whose raw data the memmap stand-in then gives; said in the notes. A planted
missing ``zero_grad()`` still fails at its line; a folder that exists is listed as it is; a file that lists a missing
folder but reads no raw data (checkpoints to resume from) gets the real, empty listing."""
from __future__ import annotations

import glob

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpu_runner.script_steps import RAW_SHARD_NAMES, _shard_name  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

SHARDS = {
    "shards.py": '''
        import glob
        import os

        import numpy as np
        import torch

        FOLDER = os.path.join("cache", "packed")


        class Windows(torch.utils.data.IterableDataset):
            def __init__(self, split, window):
                self.split, self.window = split, window

            def __iter__(self):
                files = sorted(glob.glob(os.path.join(FOLDER, "part_*.u16")))
                files = files[1:] if self.split == "train" else files[:1]
                assert len(files) > 0, f"nothing prepared in {FOLDER}"
                while True:
                    for name in files:
                        ids = np.memmap(name, dtype=np.uint16, mode="r")
                        for start in range(0, len(ids) - self.window - 1, self.window):
                            chunk = torch.from_numpy(ids[start:start + self.window + 1].astype(np.int64))
                            yield chunk[:-1], chunk[1:]
    ''',
    "train.py": '''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        from shards import Windows

        window = 64
        batch_size = 16
        steps = 500


        class Predictor(nn.Module):
            def __init__(self, vocabulary, width):
                super().__init__()
                self.table = nn.Embedding(vocabulary, width)
                self.out = nn.Linear(width, vocabulary)

            def forward(self, ids):
                return self.out(torch.tanh(self.table(ids)))


        batches = iter(torch.utils.data.DataLoader(Windows("train", window), batch_size=batch_size))
        model = Predictor(512, 32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            x, y = next(batches)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''',
}


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def test_a_listing_of_shards_in_a_missing_folder_gets_stand_in_names_and_data(tmp_path):
    report = smoke_step(write_tree(tmp_path, SHARDS), "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["zero-grad"] == "pass" and statuses["params-updated"] == "pass"
    notes = " ".join(report["notes"])
    assert "the folder 'cache/packed' is missing" in notes and "np.memmap" in notes and "uint16" in notes


def test_a_planted_missing_zero_grad_still_fails_at_its_line_on_stand_in_shards(tmp_path):
    tree = dict(SHARDS, **{"train.py": SHARDS["train.py"].replace("            optimizer.zero_grad()\n", "")})
    root = write_tree(tmp_path, tree)
    report = smoke_step(root, "train.py:__main__", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "train.py",
                                                                                      "optimizer.step()")


def test_a_listing_function_imported_by_name_gets_the_stand_in_names_too(tmp_path):
    by_name = SHARDS["shards.py"].replace("        import glob\n", "        from glob import glob\n")
    tree = dict(SHARDS, **{"shards.py": by_name.replace("glob.glob(", "glob(")})
    report = smoke_step(write_tree(tmp_path, tree), "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    assert any("the folder 'cache/packed' is missing" in note for note in report["notes"])


def test_a_path_listing_gets_the_stand_in_names_too(tmp_path):
    by_path = SHARDS["shards.py"].replace("        import glob\n", "        from pathlib import Path\n")
    by_path = by_path.replace('glob.glob(os.path.join(FOLDER, "part_*.u16"))', 'Path(FOLDER).glob("part_*.u16")')
    report = smoke_step(write_tree(tmp_path, dict(SHARDS, **{"shards.py": by_path})), "train.py:__main__", None,
                        device="cpu")
    assert report["status"] == "passed", report
    assert any("the folder 'cache/packed' is missing" in note for note in report["notes"])


def test_shards_that_exist_are_listed_and_read_as_they_are(tmp_path):
    root = write_tree(tmp_path, SHARDS)
    (root / "cache" / "packed").mkdir(parents=True)
    for index in range(2):
        np.full(4096, 7, dtype=np.uint16).tofile(root / "cache" / "packed" / f"part_{index}.u16")
    report = smoke_step(root, "train.py:__main__", None, device="cpu")
    assert report["status"] == "passed", report
    assert not any("is missing" in note for note in report["notes"])


def test_a_file_that_reads_no_raw_data_gets_the_real_empty_listing(tmp_path):
    source = SHARDS["train.py"].replace(
        "        model = Predictor(512, 32)\n",
        "        import glob\n"
        "        saved = glob.glob('checkpoints/*.pt')\n"
        "        assert saved == [], saved\n"
        "        model = Predictor(512, 32)\n")
    report = smoke_step(write_tree(tmp_path, dict(SHARDS, **{"train.py": source})), "train.py:__main__", None,
                        device="cpu")
    assert report["status"] == "passed", report
    assert any("cache/packed" in note for note in report["notes"])
    assert not any("checkpoints" in note for note in report["notes"])


def test_the_listing_is_the_real_one_outside_a_step():
    from pathlib import Path

    assert glob.glob("no-such-folder-anywhere/*.u16") == [] and list(Path("no-such-folder").glob("*.u16")) == []


def test_stand_in_names_match_their_pattern_and_differ():
    import fnmatch

    for pattern in ("*.bin", "part_??.u16", "data_[ab]*.dat", "x[!q]_*.raw"):
        names = [_shard_name(pattern, index) for index in range(RAW_SHARD_NAMES)]
        assert len(set(names)) == RAW_SHARD_NAMES and all(fnmatch.fnmatch(n, pattern) for n in names), names
