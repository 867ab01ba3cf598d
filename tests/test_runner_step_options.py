"""The options an experiment class is built from, as its script hands them over (issue 27, item 4): an option the
command line must give (``required=True``) takes the default it declares or a constant the class compares it with
(``self.opts.kind == "wide"``), what the script sets on its options after ``parse_args()`` (``args.use_gpu =
torch.cuda.is_available() and args.use_gpu``) is set as the script sets it, and a script that imports another class
of the same name (a sub-project's copy) lends it none of its options. A planted missing ``zero_grad()`` still
fails at its line."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

TREE = {
    "lab/__init__.py": "",
    "lab/study.py": '''
        import torch
        import torch.nn as nn


        class Study:
            def __init__(self, opts):
                self.opts = opts
                self.device = torch.device("cuda:0") if opts.use_gpu else torch.device("cpu")
                if self.opts.kind == "wide":
                    width = 32
                elif self.opts.kind == "narrow":
                    width = 8
                else:
                    raise KeyError(self.opts.kind)
                self.model = nn.Sequential(nn.Linear(opts.features, width), nn.ReLU(),
                                           nn.Linear(width, 1)).to(self.device)
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=opts.lr)

            def fit(self, loader):
                for x, y in loader:
                    x, y = x.to(self.device), y.to(self.device)
                    self.optimizer.zero_grad()
                    loss = nn.functional.mse_loss(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
    ''',
    "run.py": '''
        import argparse
        import torch
        from lab.study import Study

        parser = argparse.ArgumentParser()
        parser.add_argument("--kind", type=str, required=True)
        parser.add_argument("--features", type=int, default=12)
        parser.add_argument("--lr", type=float, default=0.01)
        parser.add_argument("--use_gpu", type=bool, default=True)
        args = parser.parse_args()
        args.use_gpu = True if torch.cuda.is_available() and args.use_gpu else False

        Study(args).fit(None)
    ''',
    # a sub-project with its own class of the same name, built from other options
    "other/lab/__init__.py": "",
    "other/lab/study.py": '''
        class Study:
            def __init__(self, opts):
                self.opts = opts
    ''',
    "other/run.py": '''
        import argparse
        from lab.study import Study

        parser = argparse.ArgumentParser()
        parser.add_argument("--kind", type=str, default="elsewhere")
        parser.add_argument("--use_gpu", type=bool, default=True)
        Study(parser.parse_args())
    ''',
}


def line_of(root, path: str, text: str) -> int:
    return next(i for i, line in enumerate((root / path).read_text().splitlines(), 1) if text in line)


def test_required_and_post_parse_options_build_the_class_its_script_builds(tmp_path):
    report = smoke_step(write_tree(tmp_path, TREE), "lab/study.py:Study.fit", None, device="cpu")
    assert report["status"] == "passed", report
    notes = " ".join(report["notes"])
    assert "--kind wide (a value the code compares it with)" in notes, notes
    assert "use_gpu=False" in notes and "run.py sets after parsing" in notes, notes


def test_a_declared_default_of_a_required_option_is_taken_first(tmp_path):
    files = dict(TREE, **{"run.py": TREE["run.py"].replace('required=True)', 'required=True, default="narrow")')})
    report = smoke_step(write_tree(tmp_path, files), "lab/study.py:Study.fit", None, device="cpu")
    assert report["status"] == "passed", report
    assert "--kind narrow (the default it declares" in " ".join(report["notes"]), report["notes"]


def test_without_the_scripts_own_setting_the_class_asks_for_cuda_and_is_skipped(tmp_path):
    files = dict(TREE, **{"run.py": TREE["run.py"].replace(
        "args.use_gpu = True if torch.cuda.is_available() and args.use_gpu else False", "")})
    report = smoke_step(write_tree(tmp_path, files), "lab/study.py:Study.fit", None, device="cpu")
    if not torch.cuda.is_available():
        assert report["status"] == "skipped" and "constructing Study" in report["reason"], report


def test_a_missing_zero_grad_fails_at_its_line(tmp_path):
    files = dict(TREE, **{"lab/study.py": TREE["lab/study.py"].replace("self.optimizer.zero_grad()\n", "pass\n")})
    root = write_tree(tmp_path, files)
    report = smoke_step(root, "lab/study.py:Study.fit", None, device="cpu")
    assert report["status"] == "failed", report
    zero_grad = next(c for c in report["checks"] if c["name"] == "zero-grad")
    assert zero_grad["status"] == "fail" and zero_grad["details"]["line"] == line_of(root, "lab/study.py",
                                                                                     "self.optimizer.step()")


def test_files_constructing_a_class_leave_out_those_importing_another_of_its_name(tmp_path):
    from gpu_runner.steps import _files_constructing

    root = write_tree(tmp_path, TREE)
    assert _files_constructing(root, "Study", "lab/study.py") == ["run.py"]
    assert _files_constructing(root, "Study", "other/lab/study.py") == ["other/run.py"]


def test_options_set_after_parsing_are_read_only_from_statements_that_set_options(tmp_path):
    from gpu_runner.script_steps import options_set_after_parsing

    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "args = parser.parse_args()\n"
        "table = {'small': (3, 4)}\n"
        "if args.data in table:\n"
        "    args.rows, args.cols = table[args.data]\n"
        "args.name = 'run-' + str(args.rows)\n"
        "args.model = build(args)\n"  # a repository function: not run
        "open('written.txt', 'w').write('x')\n")  # not an option: not run
    notes: list = []
    options = options_set_after_parsing(script, {"data": "small", "rows": 1}, notes)
    assert options == {"data": "small", "rows": 3, "cols": 4, "name": "run-3"}, options
    assert not (tmp_path / "written.txt").exists() and "rows=3" in notes[0]


# A step method of a class the step's model and optimizer are handed to (``Coach(model, optimizer, args)``): the
# class reads options its script declares, one of them required.
COACHED = {
    "net.py": '''
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))

            def forward(self, x):
                return self.body(x)
    ''',
    "coach.py": '''
        import torch.nn.functional as F


        class Coach:
            def __init__(self, model, optimizer, args):
                self.model, self.optimizer = model, optimizer
                self.smoothing = 0.1 if args.style == "smooth" else 0.0
                self.on_gpu = args.on_gpu

            def train_epoch(self, loader):
                for x, y in loader:
                    if self.on_gpu:
                        x, y = x.cuda(), y.cuda()
                    self.optimizer.zero_grad()
                    loss = F.cross_entropy(self.model(x), y, label_smoothing=self.smoothing)
                    loss.backward()
                    self.optimizer.step()
    ''',
    "run.py": '''
        import argparse
        import torch
        from coach import Coach
        from net import Net

        parser = argparse.ArgumentParser()
        parser.add_argument("--style", required=True)
        parser.add_argument("--no_gpu", action="store_true")
        args = parser.parse_args()
        args.on_gpu = not args.no_gpu and torch.cuda.is_available()
        model = Net()
        Coach(model, torch.optim.SGD(model.parameters(), lr=0.1), args).train_epoch([])
    ''',
}


def test_a_step_methods_class_gets_the_options_its_script_hands_it(tmp_path):
    report = smoke_step(write_tree(tmp_path, COACHED), "coach.py:Coach.train_epoch", None, device="cpu")
    assert report["status"] == "passed", report
    notes = " ".join(report["notes"])
    assert "--style smooth" in notes and "on_gpu=False" in notes, notes
    planted = dict(COACHED, **{"coach.py": COACHED["coach.py"].replace("self.optimizer.zero_grad()\n", "pass\n")})
    root = write_tree(tmp_path / "planted", planted)
    failed = smoke_step(root, "coach.py:Coach.train_epoch", None, device="cpu")
    zero_grad = next(c for c in failed["checks"] if c["name"] == "zero-grad")
    assert failed["status"] == "failed" and zero_grad["status"] == "fail", failed
    assert zero_grad["details"]["line"] == line_of(root, "coach.py", "self.optimizer.step()")
