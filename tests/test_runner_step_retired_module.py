"""A file importing a module that the installed release of a package no longer has (an API moved in a later
release: ``from torch.nn.functional.retired import helper``, under a module that is not even a package), unconfigured
(issue 27, item 4): only that module stands in, the rest of the package stays real, so a training step that uses
the module nowhere runs and is checked (a planted missing ``zero_grad()`` fails at its line); a step that does use
it is skipped naming the module, never failed."""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from gpu_runner import absent  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import assert_zero_grad_fails_at, checks  # noqa: E402

# A small scorer whose file also imports an eigen-solver from where an older release of the package kept it.
SCORER = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.functional.retired_solvers import eigen_solve


    class Scorer(nn.Module):
        def __init__(self, width=5):
            super().__init__()
            self.first = nn.Linear(width, 10)
            self.last = nn.Linear(10, 3)

        def forward(self, rows):
            return self.last(F.relu(self.first(rows)))


    def spectrum(matrix):
        return eigen_solve(matrix, 4)


    def train(model, loader, optimizer, device):
        model.train()
        for rows, kinds in loader:
            rows, kinds = rows.to(device), kinds.to(device)
            optimizer.zero_grad()
            scores = model(rows)
            F.cross_entropy(scores, kinds).backward()
            optimizer.step()
'''


def test_only_the_missing_module_of_an_installed_package_stands_in():
    assert absent.absent_module("torch.nn.functional.retired_solvers") == "torch.nn.functional.retired_solvers"
    assert absent.absent_module("surely_not_installed_pkg.sub") == "surely_not_installed_pkg"
    with absent.stand_ins(["torch.nn.functional.retired_solvers"]):
        from torch.nn.functional.retired_solvers import eigen_solve  # noqa: F401 - the stand-in

        import torch.nn.functional as F

        assert not isinstance(F, absent.StandIn)
        with pytest.raises(absent.MissingPackageError) as raised:
            eigen_solve(None)
        assert raised.value.name == "torch.nn.functional.retired_solvers"
        assert "installed package 'torch' has no module" in str(raised.value)
    assert "torch.nn.functional.retired_solvers" not in sys.modules


def test_a_step_beside_a_retired_module_runs(tmp_path):
    root = write_tree(tmp_path, {"scorer.py": SCORER})
    report = smoke_step(root, "scorer.py:train", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"


def test_a_missing_zero_grad_fails_at_its_line_beside_a_retired_module(tmp_path):
    root = write_tree(tmp_path, {"scorer.py": SCORER.replace("optimizer.zero_grad()\n", "pass\n")})
    report = smoke_step(root, "scorer.py:train", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "scorer.py", "optimizer.step()")


def test_a_step_using_the_retired_module_is_skipped_naming_it(tmp_path):
    files = {"scorer.py": SCORER.replace("            optimizer.step()\n",
                                         "            optimizer.step()\n            spectrum(rows)\n")}
    report = smoke_step(write_tree(tmp_path, files), "scorer.py:train", None, device="cpu")
    assert report["status"] == "skipped", report
    assert "torch.nn.functional.retired_solvers" in report["reason"], report
