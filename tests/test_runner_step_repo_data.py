"""A step that is given its model but builds its own data (issue 27, item 4): a data set class of the repository
whose files are not on the runner (a folder of field scans, a table) stands in with the runner's rows, so the
step's own split, loader and loop run on them; a target the step casts to integers is class indices; a device the
step reads attributes of (``device.type``) is a torch.device; its loaders load in the process. A data set that builds is left alone, and a planted
missing ``zero_grad()`` still fails at its line."""
from __future__ import annotations

import ast
import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.batch_keys import class_indices, keyed_batch  # noqa: E402
from gpu_runner.steps import role_of, smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import assert_zero_grad_fails_at, passed_notes  # noqa: E402

# A per-pixel wet/dry labeller of field scans; its folder of scans is only on the author's machine.
SCANS = '''
    import os
    import torch
    from torch.utils.data import Dataset


    class FieldScans(Dataset):
        def __init__(self, folder):
            self.files = sorted(os.listdir(folder))
            if not self.files:
                raise RuntimeError(f"no scans in {folder}")

        def __len__(self):
            return len(self.files)

        def __getitem__(self, index):
            return torch.load(os.path.join(self.folder, self.files[index]))
'''

LABELLER = '''
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, random_split
    from scans import FieldScans


    class WetDry(nn.Module):
        def __init__(self, bands=3, kinds=2):
            super().__init__()
            self.kinds = kinds
            self.body = nn.Sequential(nn.Conv2d(bands, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, kinds, 1))

        def forward(self, scan):
            return self.body(scan)


    def fit_labeller(model, device, epochs=3, batch_size=4, held_out=0.25):
        everything = FieldScans("/nowhere/field_scans")
        kept = int(len(everything) * held_out)
        train_part, _ = random_split(everything, [len(everything) - kept, kept])
        loader = DataLoader(train_part, batch_size=batch_size, shuffle=True, num_workers=2)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        criterion = nn.CrossEntropyLoss()
        for epoch in range(epochs):
            model.train()
            for record in loader:
                scan = record["scan"].to(device=device, dtype=torch.float32)
                wet = record["wet"].to(device=device, dtype=torch.long)
                with torch.autocast(device.type, enabled=False):
                    guess = model(scan)
                    loss = criterion(guess, wet)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
'''


def test_a_data_set_whose_files_are_missing_runs_the_step_on_the_runners_rows(tmp_path):
    root = write_tree(tmp_path, {"scans.py": SCANS, "labeller.py": LABELLER})
    notes = passed_notes(smoke_step(root, "labeller.py:fit_labeller", None, device="cpu"))
    assert "FieldScans could not be built" in notes and "loaded in the process (num_workers=0)" in notes


def test_a_planted_missing_zero_grad_still_fails_on_the_stand_in_rows(tmp_path):
    root = write_tree(tmp_path, {"scans.py": SCANS,
                                 "labeller.py": LABELLER.replace("                optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "labeller.py:fit_labeller", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "labeller.py", "optimizer.step()")


def test_a_data_set_that_builds_is_the_steps_own(tmp_path):
    # it builds over the folder it is given, and reading an item raises: that is the step's own data, not replaced
    scans = SCANS.replace('            if not self.files:\n                raise RuntimeError(f"no scans in {folder}")\n',
                          "")
    root = write_tree(tmp_path, {"scans.py": scans, "labeller.py": LABELLER.replace('"/nowhere/field_scans"',
                                                                                    '"."')})
    report = smoke_step(root, "labeller.py:fit_labeller", None, device="cpu")
    assert not any("could not be built" in n for n in report["notes"]), report
    assert report["status"] == "skipped" and "'folder'" in report["reason"], report


def test_the_data_set_class_is_restored_after_the_step(tmp_path):
    root = write_tree(tmp_path, {"scans.py": SCANS, "labeller.py": LABELLER})
    smoke_step(root, "labeller.py:fit_labeller", None, device="cpu")
    import sys
    scans = sys.modules.get("scans")
    if scans is not None:
        assert not hasattr(scans.FieldScans.__init__, "__wrapped__")


def test_a_target_cast_to_integers_holds_class_indices():
    step = ast.parse(textwrap.dedent('''
        def fit(model, loader, criterion, device):
            for record in loader:
                out = model(record["scan"].to(device))
                loss = criterion(out, record["wet"].to(device=device, dtype=torch.long))
    ''')).body[0]
    scores = torch.tensor([[[[0.2]], [[0.9]]], [[[0.7]], [[0.1]]]])  # [B=2, C=2, 1, 1]
    keyed = keyed_batch(step, (torch.zeros(2, 3, 1, 1), scores), role_of)
    assert keyed["wet"].dtype == torch.long and keyed["wet"].tolist() == [[[1]], [[0]]]
    plain = ast.parse(textwrap.dedent('''
        def fit(model, loader, criterion):
            for record in loader:
                loss = criterion(model(record["scan"]), record["wet"])
    ''')).body[0]
    assert keyed_batch(plain, (torch.zeros(2, 3, 1, 1), scores), role_of)["wet"] is scores


def test_class_indices_of_a_target_without_classes_are_its_rounded_values():
    assert class_indices(torch.tensor([0.4, 1.6, -0.7])).tolist() == [0, 2, 0]
