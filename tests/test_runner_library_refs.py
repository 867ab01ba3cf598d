"""gpu_runner: what a repository hands its models from torch itself (a normalization class, an activation
function), counts named thing-first, and a forward that returns probabilities by design. Each tree is one that
guessing alone cannot build, or judged wrongly before."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import forward_body, sites  # noqa: E402
from gpu_runner.build import (  # noqa: E402
    _NOT_MADE, Skip, _name_suffixes, build_subject, guess_argument, library_object)
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import write_tree  # noqa: E402

# A stem whose normalization layer is a class its caller chooses; the only call site picks torch's.
STEM = {
    "net/__init__.py": "",
    "net/stem.py": """\
        import torch
        from torch import nn

        class Stem(nn.Module):
            def __init__(self, planes, Norm):
                super().__init__()
                self.conv = nn.Conv2d(3, planes, 3, padding=1, bias=False)
                self.norm = Norm(planes)

            def forward(self, x):
                return torch.relu(self.norm(self.conv(x)))
        """,
}


def _build(root: Path, target: str):
    return build_subject(root, target, device="cpu")


def test_a_torch_class_passed_by_the_caller_is_that_class(tmp_path):
    root = write_tree(tmp_path, {**STEM, "run.py": """\
        import torch.nn as nn
        from net.stem import Stem

        def make(width=12):
            return Stem(width, Norm=nn.BatchNorm2d)
        """})
    [site] = sites.constructions(root, "net/stem.py", "Stem")
    assert site.keywords["Norm"] == sites.LibraryRef("torch.nn.BatchNorm2d")
    subject = _build(root, "net/stem.py:Stem")
    assert isinstance(subject, Subject), subject
    assert isinstance(subject.model.norm, torch.nn.BatchNorm2d)


def test_a_torch_class_chosen_by_a_flag_and_handed_through_a_factory(tmp_path):
    """``Norm = nn.GroupNorm-like if flag else nn.InstanceNorm2d`` in the caller, passed on by a builder function."""
    root = write_tree(tmp_path, {**STEM, "net/build.py": """\
        from torch import nn
        from net.stem import Stem

        def build_stem(planes, Norm):
            return Stem(planes, Norm)

        class Whole(nn.Module):
            def __init__(self, shared=False):
                super().__init__()
                if shared:
                    Norm = nn.LazyBatchNorm2d
                else:
                    Norm = nn.BatchNorm2d
                self.stem = build_stem(8, Norm)

            def forward(self, x):
                return self.stem(x)
        """})
    [site] = sites.constructions(root, "net/stem.py", "Stem")
    assert site.positional[1] == sites.LibraryRef("torch.nn.BatchNorm2d")
    assert isinstance(_build(root, "net/stem.py:Stem"), Subject)


def test_library_objects_are_imported_only_from_the_table():
    assert library_object(sites.LibraryRef("torch.nn.functional.gelu")) is torch.nn.functional.gelu
    assert library_object(sites.LibraryRef("torch.nn.NoSuchLayer")) is _NOT_MADE
    assert library_object(sites.LibraryRef("os.system")) is _NOT_MADE


def test_an_import_of_an_unlisted_library_stays_unknown(tmp_path):
    root = write_tree(tmp_path, {**STEM, "run.py": """\
        import othernorm
        from net.stem import Stem

        Stem(4, othernorm.Norm)
        """})
    [site] = sites.constructions(root, "net/stem.py", "Stem")
    assert site.positional == [4, sites.UNKNOWN]


def test_a_count_named_thing_first_is_guessed_as_its_count_first_name():
    assert _name_suffixes("head_num")[:2] == ["head_num", "num_heads"]
    assert guess_argument("class_num") == guess_argument("num_classes")
    assert guess_argument("enc_layer_num") == guess_argument("num_layers")
    assert guess_argument("pixel_num") == (False, None)  # num_pixels means nothing to the guesses either


class Chooser(torch.nn.Module):
    """A discrete policy: its forward returns action probabilities, which its own methods sample and log."""

    def __init__(self, width=6, options=4):
        super().__init__()
        self.score = torch.nn.Linear(width, options)

    def forward(self, state):
        return torch.softmax(self.score(state), dim=1)

    def act(self, state):
        chances = self.forward(state)
        return chances.multinomial(1)

    def log_chance(self, state, picked):
        return torch.log(self(state).gather(1, picked))


class Softened(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.score = torch.nn.Linear(6, 4)

    def forward(self, state):
        return torch.softmax(self.score(state), dim=1)

    def describe(self, state):
        return self.forward(state).argmax(1)  # a prediction, not a reading of probabilities


def test_a_forward_whose_probabilities_the_class_samples_is_read_as_a_distribution():
    assert forward_body.output_read_as_probabilities(Chooser()) == "Chooser.act"
    assert forward_body.output_read_as_probabilities(Softened()) == ""


def test_a_policy_that_returns_probabilities_is_undecided_not_a_double_softmax(tmp_path):
    root = write_tree(tmp_path, {"policy.py": """\
        import torch
        from torch import nn

        class Chooser(nn.Module):
            def __init__(self, state_dim, action_num, hidden=(16, 16)):
                super().__init__()
                layers, last = [], state_dim
                for width in hidden:
                    layers += [nn.Linear(last, width), nn.Tanh()]
                    last = width
                self.body = nn.Sequential(*layers)
                self.head = nn.Linear(last, action_num)

            def forward(self, x):
                return torch.softmax(self.head(self.body(x)), dim=1)

            def select(self, x):
                probs = self.forward(x)
                return probs.multinomial(1)
        """})
    subject = _build(root, "policy.py:Chooser")
    assert isinstance(subject, Subject), subject  # action_num guessed as num_actions
    from gpu_runner.checks import run_checks

    report = run_checks(subject, steps=10)
    overfit = next(c for c in report.checks if c.name == "overfit-batch")
    assert overfit.status == "skip" and overfit.details.get("undecided"), overfit.message
    assert "Chooser.select reads it as probabilities" in overfit.message


def test_guessing_alone_cannot_build_the_stem(tmp_path):
    assert isinstance(_build(write_tree(tmp_path, STEM), "net/stem.py:Stem"), Skip)


def test_a_flag_that_reaches_for_the_network_is_turned_off_and_said(tmp_path):
    root = write_tree(tmp_path, {"zoo.py": """\
        import urllib.error
        from torch import nn

        class Tower(nn.Module):
            def __init__(self, width=8, bias=True, with_weights=True):
                super().__init__()
                self.fc = nn.Linear(width, width, bias=bias)
                if with_weights:
                    raise urllib.error.URLError("Temporary failure in name resolution")

            def forward(self, x):
                return self.fc(x)
        """})
    subject = _build(root, "zoo.py:Tower")
    assert isinstance(subject, Subject), subject
    assert subject.model.fc.bias is not None  # only the flag that mattered was turned off
    assert any("with_weights=False" in n and "network" in n for n in subject.notes), subject.notes


def test_a_constructor_that_fails_for_another_reason_is_not_retried_without_its_flags(tmp_path):
    root = write_tree(tmp_path, {"zoo.py": """\
        from torch import nn

        class Broken(nn.Module):
            def __init__(self, width=8, strict=True):
                super().__init__()
                self.fc = nn.Linear(width, width)
                if strict:
                    raise FileNotFoundError("weights.pth")

            def forward(self, x):
                return self.fc(x)
        """})
    assert isinstance(_build(root, "zoo.py:Broken"), Skip)


class Fuse(torch.nn.Module):
    """Coarse features resized to the fine map, then joined with the fine map's normalized projection."""

    def __init__(self):
        super().__init__()
        self.squeeze = torch.nn.Conv2d(10, 6, 1)
        self.norm = torch.nn.BatchNorm2d(6)
        self.mix = torch.nn.Sequential(torch.nn.Conv2d(20, 8, 3, padding=1), torch.nn.ReLU())

    def forward(self, coarse, fine):
        fine = self.norm(self.squeeze(fine))
        coarse = torch.nn.functional.interpolate(coarse, size=fine.shape[2:], mode="nearest")
        return self.mix(torch.cat((coarse, fine), dim=1))


def test_a_resized_map_beside_a_normalized_projection_takes_the_rest_of_the_channels():
    facts = forward_body.read_forward(Fuse())
    assert facts["fine"].width == 10
    assert facts["coarse"].width == 14  # 20 channels into the mix, 6 of them the projection's
