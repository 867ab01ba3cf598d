"""gpu_runner.sites: values a method reads from its own instance (``self.opts.width``), followed to what the
class's constructor, or a base class's, stores there and to the calls that build the class; and a class chosen
in a function by a condition (``Kind = Sparse if mode == "sparse" else Dense``). The class under test has
arguments whose names mean nothing to the guesses."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import sites  # noqa: E402
from gpu_runner.build import build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

# A forecaster that a "run" object builds in a method, from the options its base class keeps on itself.
RUNS = {
    "core/__init__.py": "",
    "core/net.py": """\
        from torch import nn

        class Forecaster(nn.Module):
            def __init__(self, lanes, horizon, spread=4):
                super().__init__()
                self.lift = nn.Linear(lanes, spread)
                self.out = nn.Linear(spread, horizon)

            def forward(self, x):
                return self.out(self.lift(x).relu())
        """,
    "runs/__init__.py": "",
    "runs/base.py": """\
        class BaseRun:
            def __init__(self, opts):
                self.opts = opts
                self.net = self.make()

            def make(self):
                raise NotImplementedError
        """,
    "runs/forecast.py": """\
        from core.net import Forecaster
        from runs.base import BaseRun

        class ForecastRun(BaseRun):
            def __init__(self, opts):
                super().__init__(opts)

            def make(self):
                kinds = {"forecaster": Forecaster}
                return kinds[self.opts.kind](self.opts.lanes, self.opts.horizon, spread=self.opts.spread)
        """,
    "launch.py": """\
        import argparse
        from runs.forecast import ForecastRun

        parser = argparse.ArgumentParser(description="forecast")
        parser.add_argument("--kind", default="forecaster", help="which network")
        parser.add_argument("--lanes", default=5, type=int, help="input lanes")
        parser.add_argument("--horizon", default=3, type=int, help="steps ahead")
        parser.add_argument("--spread", default=12, type=int, help="hidden width")
        opts = parser.parse_args()
        Run = ForecastRun
        run = Run(opts)
        """,
}


def test_a_method_reads_what_a_base_constructor_stores_from_the_calls_of_the_class(tmp_path):
    root = write_tree(tmp_path, RUNS)
    found = sites.constructions(root, "core/net.py", "Forecaster")
    assert found and found[0].positional == [5, 3] and found[0].keywords == {"spread": 12}


def test_the_forecaster_builds_with_the_options_its_run_keeps(tmp_path):
    subject = build_subject(write_tree(tmp_path, RUNS), "core/net.py:Forecaster", device="cpu")
    assert isinstance(subject, Subject)
    assert subject.model.lift.in_features == 5 and subject.model.out.out_features == 3


def test_an_attribute_assigned_earlier_in_the_same_method_is_that_value(tmp_path):
    tree = {**RUNS, "runs/forecast.py": """\
        from core.net import Forecaster
        from runs.base import BaseRun

        class ForecastRun(BaseRun):
            def make(self):
                self.lanes = 9
                return Forecaster(self.lanes, self.opts.horizon)
        """}
    found = sites.constructions(write_tree(tmp_path, tree), "core/net.py", "Forecaster")
    # no constructor of its own: the base's runs with the arguments of ForecastRun's calls
    assert found and found[0].positional == [9, 3]


def test_an_attribute_nothing_assigns_stays_unknown(tmp_path):
    tree = {**RUNS, "runs/forecast.py": """\
        from core.net import Forecaster

        class ForecastRun:
            def make(self):
                return Forecaster(self.lanes, 3)
        """}
    found = sites.constructions(write_tree(tmp_path, tree), "core/net.py", "Forecaster")
    assert found and found[0].positional == [sites.UNKNOWN, 3]


# A layer handed a mixing module that its caller picks by a flag.
CHOSEN = {
    "blocks.py": """\
        from torch import nn

        class Dense(nn.Module):
            def __init__(self, sharp, width):
                super().__init__()
                self.proj = nn.Linear(width, width)
                self.sharp = sharp

            def forward(self, x):
                return self.proj(x) * self.sharp


        class Sparse(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.proj = nn.Linear(width, width)

            def forward(self, x):
                return self.proj(x).relu()


        class Stage(nn.Module):
            def __init__(self, mixer, width):
                super().__init__()
                self.mixer = mixer
                self.norm = nn.LayerNorm(width)

            def forward(self, x):
                return self.norm(x + self.mixer(x))


        class Tower(nn.Module):
            def __init__(self, width, mode="dense", sharp=2.0):
                super().__init__()
                Mix = Dense if mode == "dense" else Sparse
                self.stage = Stage(Mix(sharp, width), width)

            def forward(self, x):
                return self.stage(x)
        """,
}


def test_a_class_chosen_by_a_condition_in_the_function_is_the_branch_it_takes(tmp_path):
    found = sites.constructions(write_tree(tmp_path, CHOSEN), "blocks.py", "Stage")
    assert found
    mixer = found[0].positional[0]
    assert isinstance(mixer, sites.Instance) and mixer.cls.name == "Dense" and mixer.positional[0] == 2.0


def test_a_layer_handed_a_module_chosen_by_a_condition_builds(tmp_path):
    subject = build_subject(write_tree(tmp_path, CHOSEN), "blocks.py:Stage", device="cpu")
    assert isinstance(subject, Subject)
    assert type(subject.model.mixer).__name__ == "Dense"


def test_a_condition_that_cannot_be_evaluated_picks_no_class(tmp_path):
    tree = {"blocks.py": CHOSEN["blocks.py"].replace('mode="dense"', "mode")}
    found = sites.constructions(write_tree(tmp_path, tree), "blocks.py", "Stage")
    assert not found or not isinstance(found[0].positional[0], sites.Instance)


# A block handed an attention module built in the same call with the same repository width: the two must be
# shrunk alike (the attention's width follows its head count, the block has none of its own).
SHARED_WIDTH = {
    "stack.py": """\
        from torch import nn

        class Heads(nn.Module):
            def __init__(self, d_model, n_heads):
                super().__init__()
                self.proj, self.n_heads = nn.Linear(d_model, d_model), n_heads

            def forward(self, x):
                return self.proj(x) / self.n_heads


        class Layer(nn.Module):
            def __init__(self, heads, d_model):
                super().__init__()
                self.heads, self.norm = heads, nn.LayerNorm(d_model)

            def forward(self, x):
                mixed = self.heads(x)
                return self.norm(x + mixed)


        class Stack(nn.Module):
            def __init__(self, width=512):
                super().__init__()
                self.layer = Layer(Heads(width, 8), width)

            def forward(self, x):
                return self.layer(x)
        """,
}


def test_a_width_shared_with_a_module_built_in_the_same_call_is_shrunk_alike(tmp_path):
    subject = build_subject(write_tree(tmp_path, SHARED_WIDTH), "stack.py:Layer", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.norm.normalized_shape[0] == subject.model.heads.proj.in_features < 512
