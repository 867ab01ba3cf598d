"""A function-style step runs in a scratch mirror of its file's folder, as a script's and a trainer's method do
(issue 27, item 4): a class whose constructor makes an output folder relative to the working folder
(``os.makedirs("exp/run")``) is constructed and its step runs, without writing into the code tree (read-only in the
sandbox). A planted missing ``zero_grad()`` in such a step still fails at its line."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_steps import MODELS, check, line_of, run  # noqa: E402

# An owner class that takes the runner's model and makes its checkpoint folder, relative to the working folder,
# in its constructor: the folder its experiment writes to.
SOLVER = '''
    import os

    from models import Net


    class Solver:
        def __init__(self, model, optimizer, criterion, save_folder="exp/temp"):
            self.model, self.optimizer, self.criterion = model, optimizer, criterion
            self.save_folder = save_folder
            os.makedirs(os.path.join(self.save_folder, "checkpoints"))
            with open(os.path.join(self.save_folder, "log.txt"), "w") as log:
                log.write("started\\n")

        def train_step(self, batch):
            x, y = batch
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            return loss.item()
'''


def tree_files(root) -> set:
    return {os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root) for name in names
            if "__pycache__" not in folder}


def test_a_constructor_making_its_output_folder_runs_in_a_scratch_folder(tmp_path, monkeypatch):
    root = write_tree(tmp_path, {"models.py": MODELS, "solver.py": SOLVER})
    monkeypatch.chdir(root)  # where the runner's child works from (gpu_runner.child)
    before, cwd = tree_files(root), os.getcwd()
    report = run(root, "solver.py:Solver.train_step")
    assert report["status"] == "passed", report["reason"] or report["checks"]
    assert check(report, "params-updated")["status"] == "pass"
    # what the constructor wrote went to the scratch folder: the code tree is as it was, the working folder too
    assert tree_files(root) == before and not (root / "exp").exists()
    assert os.getcwd() == cwd


def test_a_missing_zero_grad_in_such_a_step_fails_at_its_line(tmp_path, monkeypatch):
    root = write_tree(tmp_path, {"models.py": MODELS,
                                 "solver.py": SOLVER.replace("            self.optimizer.zero_grad()\n", "")})
    monkeypatch.chdir(root)
    report = run(root, "solver.py:Solver.train_step")
    assert report["status"] == "failed", report
    zero_grad = check(report, "zero-grad")
    assert zero_grad["status"] == "fail"
    assert zero_grad["details"]["line"] == line_of(root, "solver.py", "self.optimizer.step()")
    assert not (root / "exp").exists()
