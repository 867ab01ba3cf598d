"""gpu_runner.sites and build: what a repository passes its models besides numbers (a module it builds from
its own classes, a class of its own, the namespace of its command-line options), and skip reasons that name one
cause. Each tree is one that guessing alone cannot build."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import sites  # noqa: E402
from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

# A denoiser that wraps whatever network it is handed; the network's argument names mean nothing to the guesses.
DENOISER = {
    "lib/__init__.py": "",
    "lib/nets.py": """\
        from torch import nn

        class Core(nn.Module):
            def __init__(self, planes, breadth):
                super().__init__()
                self.lift = nn.Linear(planes, breadth)
                self.drop = nn.Linear(breadth, planes)

            def forward(self, x):
                return self.drop(self.lift(x).relu())
        """,
    "lib/denoise.py": """\
        from torch import nn

        class Denoiser(nn.Module):
            def __init__(self, core, spread):
                super().__init__()
                self.core = core
                self.spread = spread

            def forward(self, x):
                return (self.core(x + self.spread) - x).pow(2).mean()
        """,
}
DENOISER_SCRIPT = {
    "fit.py": """\
        from lib.nets import Core
        from lib.denoise import Denoiser

        def fit(rounds=3):
            model = Denoiser(core=Core(6, breadth=20), spread=0.5)
            return model
        """,
}


def _build(root: Path, target: str):
    return build_subject(root, target, device="cpu")


def test_guessing_alone_cannot_build_the_denoiser(tmp_path):
    assert isinstance(_build(write_tree(tmp_path, DENOISER), "lib/denoise.py:Denoiser"), Skip)


def test_a_module_the_repository_builds_in_the_call_is_built_with_its_arguments(tmp_path):
    root = write_tree(tmp_path, {**DENOISER, **DENOISER_SCRIPT})
    [site] = sites.constructions(root, "lib/denoise.py", "Denoiser")
    core = site.keywords["core"]
    assert isinstance(core, sites.Instance) and core.cls == sites.ClassRef("lib/nets.py", "Core")
    assert core.positional == [6] and core.keywords == {"breadth": 20}
    subject = _build(root, "lib/denoise.py:Denoiser")
    assert isinstance(subject, Subject), subject
    assert subject.model.core.lift.in_features == 6 and subject.model.core.lift.out_features == 20
    assert subject.model.spread == 0.5
    assert any("core=Core(planes=6, breadth=20), as the repository builds it" in n for n in subject.notes), subject.notes


def test_a_module_passed_through_another_object_is_followed_to_where_it_is_built(tmp_path):
    """``Loop(net)`` builds ``Denoiser(net, ...)`` inside; ``net = Core(...)`` with argparse values at the top."""
    root = write_tree(tmp_path, {**DENOISER, "lib/loop.py": """\
        from lib.denoise import Denoiser

        class Loop:
            def __init__(self, net, spread, rounds=10):
                self.model = Denoiser(net, spread)
        """, "main.py": """\
        import argparse
        from lib.nets import Core
        from lib.loop import Loop

        parser = argparse.ArgumentParser()
        parser.add_argument("--planes", type=int, default=5)
        parser.add_argument("--breadth", type=int, default=14)
        args = parser.parse_args()
        net = Core(args.planes, args.breadth)
        Loop(net, 0.25)
        """})
    subject = _build(root, "lib/denoise.py:Denoiser")
    assert isinstance(subject, Subject), subject
    assert subject.model.core.lift.in_features == 5 and subject.model.core.lift.out_features == 14
    assert any("argparse defaults of main.py" in n for n in subject.notes), subject.notes


def test_a_class_of_the_repository_passed_as_an_argument_is_that_class(tmp_path):
    root = write_tree(tmp_path, {"cells.py": """\
        from torch import nn

        class Odd(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, width)

            def forward(self, x):
                return self.fc(x)

        class Tower(nn.Module):
            def __init__(self, unit, floors, width):
                super().__init__()
                self.floors = nn.Sequential(*[unit(width) for _ in range(floors)])

            def forward(self, x):
                return self.floors(x)

        def tower():
            return Tower(Odd, 3, width=10)
        """})
    [site] = sites.constructions(root, "cells.py", "Tower")
    assert site.positional[0] == sites.ClassRef("cells.py", "Odd")
    subject = _build(root, "cells.py:Tower")
    assert isinstance(subject, Subject), subject
    assert len(subject.model.floors) == 3 and type(subject.model.floors[0]).__name__ == "Odd"


# A forecaster that reads its options object; nothing calls it by name (a script picks it from a table of modules),
# but the script's command-line options are the object it is handed.
FORECASTER = {
    "nets/__init__.py": "",
    "nets/lines.py": """\
        from torch import nn

        class Model(nn.Module):
            def __init__(self, opts):
                super().__init__()
                self.seq_len = opts.lookback  # the sizes it keeps under names that describe an input
                self.channels = opts.lanes
                self.proj = nn.Linear(opts.lookback, opts.horizon)

            def forward(self, x):
                assert x.shape[1] == self.seq_len and x.shape[2] == self.channels
                return self.proj(x.transpose(1, 2)).transpose(1, 2)
        """,
}
FORECASTER_SCRIPT = {
    "run.py": """\
        import argparse
        from nets import lines

        parser = argparse.ArgumentParser()
        parser.add_argument("--net", default="lines")
        parser.add_argument("--lookback", type=int, default=24)
        parser.add_argument("--horizon", type=int, default=6)
        parser.add_argument("--lanes", type=int, default=3)
        args = parser.parse_args()
        model = {"lines": lines}[args.net].Model(args)
        """,
    "other.py": """\
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--lookback", type=int, default=99)
        """,
}


def test_guessing_alone_cannot_build_the_forecaster(tmp_path):
    assert isinstance(_build(write_tree(tmp_path, FORECASTER), "nets/lines.py:Model"), Skip)


def test_a_config_object_is_the_namespace_of_the_script_whose_options_it_reads(tmp_path):
    subject = _build(write_tree(tmp_path, {**FORECASTER, **FORECASTER_SCRIPT}), "nets/lines.py:Model")
    assert isinstance(subject, Subject), subject
    assert subject.model.proj.in_features == 24 and subject.model.proj.out_features == 6
    assert any("the argparse defaults of run.py" in n for n in subject.notes), subject.notes
    # the sizes it keeps on itself describe its input: [B, lookback, lanes], time first
    assert any("[B, 24, 3]" in n for n in subject.notes), subject.notes


def test_no_script_defining_every_option_read_means_no_namespace(tmp_path):
    files = {**FORECASTER, "other.py": FORECASTER_SCRIPT["other.py"]}
    skipped = _build(write_tree(tmp_path, files), "nets/lines.py:Model")
    assert isinstance(skipped, Skip) and "cannot guess constructor argument 'opts'" in skipped.reason, skipped


def test_a_package_missing_where_the_repository_builds_the_class_is_the_one_cause(tmp_path):
    root = write_tree(tmp_path, {"net.py": """\
        import torch
        from torch import nn
        import nowhere_installed_pkg

        class Net(nn.Module):
            def __init__(self, quirk, flavour="plain"):
                super().__init__()
                self.fc = nn.Linear(quirk, 2)
                if flavour == "rich":
                    self.extra = nowhere_installed_pkg.Layer(quirk)

            def forward(self, x):
                return self.fc(x)
        """, "go.py": "from net import Net\n\nmodel = Net(4, flavour='rich')\n"})
    skipped = _build(root, "net.py:Net")
    assert isinstance(skipped, Skip), skipped
    assert "as the repository does needs 'nowhere_installed_pkg'" in skipped.reason, skipped.reason
    assert "go.py:3" in skipped.reason and "cannot guess" not in skipped.reason, skipped.reason


# A block whose argument names the guesses do not know; only its documentation shows it built and called.
BLOCK_SOURCE = '''\
    import torch
    from torch import nn

    class Fold(nn.Module):
        """Folds features.

        >>> rows = 2
        >>> fold = Fold(girth=6, plies=3)
        >>> fold(torch.randn(rows, 5, 6)).shape
        torch.Size([2, 5, 6])
        """

        def __init__(self, girth, plies):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(girth, girth) for _ in range(plies)])

        def forward(self, x):
            assert x.dim() == 3
            return self.layers(x)
    '''


def test_a_docstring_example_is_a_call_site_with_its_input(tmp_path):
    root = write_tree(tmp_path, {"fold.py": BLOCK_SOURCE})
    [site] = sites.constructions(root, "fold.py", "Fold")
    assert "docstring example of Fold" in site.where and site.keywords == {"girth": 6, "plies": 3}
    assert site.inputs and site.inputs[0][0][0].shape == (2, 5, 6)
    subject = _build(root, "fold.py:Fold")
    assert isinstance(subject, Subject), subject
    assert len(subject.model.layers) == 3 and subject.model.layers[0].in_features == 6
    assert any("[B, 5, 6]" in n for n in subject.notes), subject.notes


def test_a_readmes_python_blocks_are_one_program_of_call_sites(tmp_path):
    source = BLOCK_SOURCE.replace('>>>', '').replace('torch.Size([2, 5, 6])', '')  # no doctest: only the README
    root = write_tree(tmp_path, {"pkg/fold.py": source, "README.md": """\
        # Fold

        ```python
        from pkg.fold import Fold
        girth = 4
        ```

        Some prose, and a block in another language:

        ```bash
        Fold(girth=99)
        ```

        ```python
        fold = Fold(girth=girth, plies=2)
        ```
        """})
    [site] = sites.constructions(root, "pkg/fold.py", "Fold")
    assert site.where.startswith("README.md (code blocks)") and site.keywords == {"girth": 4, "plies": 2}


def test_a_float_computed_at_run_time_and_keywords_passed_as_a_mapping(tmp_path):
    """``Agent(**options)`` with ``options = {"limit": float(env.high)}``: the agent hands ``limit`` to the model;
    its value is unknown but the code says it is a float."""
    root = write_tree(tmp_path, {"agent.py": """\
        import torch
        from torch import nn

        class Policy(nn.Module):
            def __init__(self, state_dim, action_dim, limit):
                super().__init__()
                self.fc = nn.Linear(state_dim, action_dim)
                self.limit = limit

            def forward(self, state):
                return self.limit * torch.tanh(self.fc(state))

        class Agent:
            def __init__(self, state_dim, action_dim, limit):
                self.policy = Policy(state_dim, action_dim, limit)
        """, "main.py": """\
        import agent

        def run(env):
            options = {"state_dim": env.size, "action_dim": 2, "limit": float(env.high)}
            return agent.Agent(**options)
        """})
    [site] = sites.constructions(root, "agent.py", "Policy")
    assert site.positional[1:] == [2, sites.Typed("float")], site
    subject = _build(root, "agent.py:Policy")
    assert isinstance(subject, Subject), subject
    assert subject.model.limit == 1.0 and subject.model.fc.out_features == 2


def test_a_constructor_that_rejects_shrunk_sizes_gets_the_repositorys_own(tmp_path):
    """``depth`` must be 3n+1: the shrunk 2 is rejected, the repository's 4 (and the default 7) are not."""
    source = """\
        from torch import nn

        class Ladder(nn.Module):
            def __init__(self, rungs, depth=7):
                super().__init__()
                assert (depth - 1) % 3 == 0, "depth must be 3n+1"
                self.steps = nn.Sequential(*[nn.Linear(rungs, rungs) for _ in range((depth - 1) // 3)])

            def forward(self, x):
                return self.steps(x)
        """
    subject = _build(write_tree(tmp_path / "default", {"ladder.py": source.replace("rungs", "in_features")}),
                     "ladder.py:Ladder")
    assert isinstance(subject, Subject), subject
    assert len(subject.model.steps) == 2
    assert any("depth=7 not shrunk" in n for n in subject.notes), subject.notes
    site = write_tree(tmp_path / "site", {"ladder.py": source, "go.py": "from ladder import Ladder\nLadder(4, depth=4)\n"})
    subject = _build(site, "ladder.py:Ladder")
    assert isinstance(subject, Subject), subject
    assert len(subject.model.steps) == 1 and subject.model.steps[0].in_features == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the forward runs where there is a GPU")
def test_a_forward_that_moves_tensors_to_a_gpu_says_it_needs_cuda(tmp_path):
    root = write_tree(tmp_path, {"net.py": """\
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self, in_features=4):
                super().__init__()
                self.fc = nn.Linear(in_features, 2)

            def forward(self, x):
                return self.fc(x).cuda()
        """})
    skipped = _build(root, "net.py:Net")
    assert isinstance(skipped, Skip), skipped
    assert "needs CUDA" in skipped.reason and "could not infer an input" not in skipped.reason, skipped.reason
