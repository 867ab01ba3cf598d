"""gpu_runner.sites: the calls that build a class without naming it (a registry of classes, a partial, a
classmethod such as ``from_config``, a subclass's ``super().__init__``, a loop over classes), read as the class's
construction sites. Each tree's class has arguments whose names mean nothing to the guesses."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import sites  # noqa: E402
from gpu_runner.build import build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

MIXER = {
    "nets/__init__.py": "",
    "nets/mixer.py": """\
        from torch import nn

        class Mixer(nn.Module):
            def __init__(self, breadth, rounds):
                super().__init__()
                self.layers = nn.Sequential(*[nn.Linear(breadth, breadth) for _ in range(rounds)])

            def forward(self, x):
                return self.layers(x)

            @classmethod
            def from_config(cls, cfg):
                return cls(cfg["breadth"], rounds=cfg["rounds"])


        class Other(nn.Module):
            def __init__(self, breadth, rounds):
                super().__init__()
                self.head = nn.Linear(breadth, rounds)

            def forward(self, x):
                return self.head(x)
        """,
}


def _sites(root):
    return [(s.positional, s.keywords) for s in sites.constructions(root, "nets/mixer.py", "Mixer")]


def test_a_registry_entry_chosen_by_an_argparse_default_is_a_site(tmp_path):
    root = write_tree(tmp_path, {**MIXER, "nets/zoo.py": """\
        from nets.mixer import Mixer, Other

        MODELS = {"mixer": Mixer, "other": Other}
        """, "train.py": """\
        import argparse
        from nets.zoo import MODELS

        parser = argparse.ArgumentParser()
        parser.add_argument("--arch", default="mixer")
        parser.add_argument("--breadth", type=int, default=24)
        args = parser.parse_args()
        model = MODELS[args.arch](breadth=args.breadth, rounds=3)
        """})
    assert ([], {"breadth": 24, "rounds": 3}) in _sites(root)
    subject = build_subject(root, "nets/mixer.py:Mixer", device="cpu")
    assert isinstance(subject, Subject), subject
    assert any("train.py:8" in note for note in subject.notes), subject.notes


def test_a_required_option_has_no_default_so_its_registry_call_may_build_any_entry(tmp_path):
    # argparse never uses the default of a required option: the command line chooses, so the key is unknown and
    # the call builds whichever entry it names, here Mixer too (and a condition on the key is left undecided)
    root = write_tree(tmp_path, {**MIXER, "train.py": """\
        import argparse
        from nets.mixer import Mixer, Other

        parser = argparse.ArgumentParser()
        parser.add_argument("--arch", required=True, default="other")
        parser.add_argument("--breadth", type=int, default=24)
        args = parser.parse_args()
        MODELS = {"mixer": Mixer, "other": Other}
        rounds = 2 if args.arch == "other" else 3
        model = MODELS[args.arch](breadth=args.breadth, rounds=rounds)
        """})
    found = _sites(root)
    assert found and all(site == ([], {"breadth": 24, "rounds": sites.UNKNOWN}) for site in found), found


def test_a_registry_call_whose_key_selects_another_entry_is_not_a_site(tmp_path):
    root = write_tree(tmp_path, {**MIXER, "train.py": """\
        from nets.mixer import Mixer, Other

        MODELS = {"mixer": Mixer, "other": Other}
        net = MODELS["other"](breadth=5, rounds=2)
        """})
    assert _sites(root) == []


def test_a_class_registered_by_a_decorator_is_built_through_the_registry_lookup(tmp_path):
    root = write_tree(tmp_path, {
        "nets/__init__.py": "",
        "nets/registry.py": """\
            class Registry:
                def __init__(self):
                    self.entries = {}

                def register(self, name):
                    def add(cls):
                        self.entries[name] = cls
                        return cls
                    return add

                def get(self, name):
                    return self.entries[name]

            NETS = Registry()
            """,
        "nets/mixer.py": """\
            from torch import nn
            from nets.registry import NETS

            @NETS.register("mix")
            class Mixer(nn.Module):
                def __init__(self, breadth, rounds):
                    super().__init__()
                    self.layers = nn.Sequential(*[nn.Linear(breadth, breadth) for _ in range(rounds)])

                def forward(self, x):
                    return self.layers(x)
            """,
        "configs/run.yaml": "arch: mix\nnet:\n  breadth: 12\n  rounds: 2\n",
        "run.py": """\
            import yaml
            from nets.registry import NETS

            def main():
                cfg = yaml.safe_load(open("configs/run.yaml"))
                builder = NETS.get(cfg["arch"])
                return builder(**cfg["net"])
            """})
    assert ([], {"breadth": 12, "rounds": 2}) in _sites(root)


def test_a_partial_and_its_call_together_are_a_site(tmp_path):
    root = write_tree(tmp_path, {**MIXER, "train.py": """\
        from functools import partial
        from nets.mixer import Mixer

        def build():
            make = partial(Mixer, rounds=3)
            return make(breadth=10)
        """})
    assert ([], {"rounds": 3, "breadth": 10}) in _sites(root)


def test_a_classmethods_own_call_takes_its_arguments_from_the_methods_callers(tmp_path):
    root = write_tree(tmp_path, {**MIXER, "train.py": """\
        from nets.mixer import Mixer

        settings = {"breadth": 14, "rounds": 2}
        model = Mixer.from_config(settings)
        """})
    assert ([14], {"rounds": 2}) in _sites(root)


def test_a_subclass_constructor_handing_on_its_keywords_is_a_site_of_the_base(tmp_path):
    root = write_tree(tmp_path, {**MIXER, "nets/small.py": """\
        from nets.mixer import Mixer

        class SmallMixer(Mixer):
            def __init__(self, **options):
                super().__init__(breadth=16, **options)

        def small():
            return SmallMixer(rounds=2)
        """})
    assert ([], {"breadth": 16, "rounds": 2}) in _sites(root)


def test_a_loop_over_classes_builds_each_of_them(tmp_path):
    root = write_tree(tmp_path, {**MIXER, "tests/test_nets.py": """\
        from nets.mixer import Mixer, Other

        def test_shapes():
            for net_class in (Mixer, Other):
                net = net_class(breadth=6, rounds=2)
        """})
    assert ([], {"breadth": 6, "rounds": 2}) in _sites(root)


def test_a_name_that_only_shares_the_registry_entrys_name_is_not_a_site(tmp_path):
    """``Mixer`` of another module registered under the same key is another class."""
    root = write_tree(tmp_path, {**MIXER, "other/__init__.py": "", "other/mixer.py": """\
        class Mixer:
            def __init__(self, breadth, rounds):
                pass
        """, "train.py": """\
        from other.mixer import Mixer

        MODELS = {"mixer": Mixer}
        net = MODELS["mixer"](breadth=5, rounds=2)
        """})
    assert _sites(root) == []


def test_a_config_entry_that_instantiates_the_class_is_a_site(tmp_path):
    """Hydra's ``_target_`` beside the arguments (a nested entry built as its class), Lightning's ``class_path``
    with ``init_args`` (interpolations resolved in the file); another class's entry is no site."""
    root = write_tree(tmp_path, {**MIXER, "nets/wrap.py": """\
        from torch import nn

        class Wrapped(nn.Module):
            def __init__(self, inner, scale):
                super().__init__()
                self.inner, self.scale = inner, scale

            def forward(self, x):
                return self.inner(x) * self.scale
        """,
        "conf/model.yaml": "depth: 2\nnet:\n  _target_: nets.wrap.Wrapped\n  scale: 2.0\n  inner:\n"
                           "    _target_: nets.mixer.Mixer\n    breadth: 18\n    rounds: ${depth}\n",
        "conf/cli.json": '{"model": {"class_path": "nets.mixer.Mixer", "init_args": {"breadth": 9, "rounds": 1}},'
                         ' "other": {"class_path": "nets.mixer.Other", "init_args": {"breadth": 3, "rounds": 1}}}'})
    found = _sites(root)
    assert ([], {"breadth": 9, "rounds": 1}) in found
    assert ([], {"breadth": 18, "rounds": 2}) in found
    assert len(found) == 2
    [wrapped] = sites.constructions(root, "nets/wrap.py", "Wrapped")
    inner = wrapped.keywords["inner"]
    assert isinstance(inner, sites.Instance) and inner.cls == sites.ClassRef("nets/mixer.py", "Mixer")
    subject = build_subject(root, "nets/wrap.py:Wrapped", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.inner.layers[0].in_features == 18 and subject.model.scale == 2.0


def test_of_two_sites_as_complete_the_one_that_also_shows_the_input_comes_first(tmp_path):
    """A constructor's call inside another class gives as many arguments as the docstring example, which also
    calls the model with a tensor it makes: the example comes first, so the input is the repository's too."""
    root = write_tree(tmp_path, {"nets/__init__.py": "", "nets/mixer.py": '''\
        import torch
        from torch import nn


        class Mixer(nn.Module):
            """
            >>> m = Mixer(4, 2)
            >>> y = m(torch.randn(3, 4))
            """

            def __init__(self, breadth, rounds):
                super().__init__()
                self.layers = nn.Sequential(*[nn.Linear(breadth, breadth) for _ in range(rounds)])

            def forward(self, x):
                return self.layers(x)


        class Holder(nn.Module):
            def __init__(self, width=6):
                super().__init__()
                self.mixer = Mixer(width, 3)

            def forward(self, x):
                return self.mixer(x)
        '''})
    first, second = sites.constructions(root, "nets/mixer.py", "Mixer")
    assert first.positional == [4, 2] and first.inputs and second.positional == [6, 3] and not second.inputs


def test_a_subclass_choice_of_a_defaulted_value_is_not_the_base_classs_site(tmp_path):
    """``super().__init__(breadth=16, drop=0.0)``: ``breadth`` has no default, so the base needs it; ``drop`` has
    one, and setting it to 0 is what the subclass is for, not how the base is built."""
    root = write_tree(tmp_path, {"nets/__init__.py": "", "nets/tagger.py": """\
        from torch import nn

        class Tagger(nn.Module):
            def __init__(self, breadth, drop=0.3):
                super().__init__()
                self.fc = nn.Linear(breadth, 4)
                self.drop = nn.Dropout(drop)

            def forward(self, x):
                return self.drop(self.fc(x))


        class Quiet(Tagger):
            def __init__(self):
                super().__init__(16, drop=0.0)


        class Silent(Tagger):
            def __init__(self):
                super().__init__(drop=0.0)
        """})
    assert [(s.positional, s.keywords) for s in sites.constructions(root, "nets/tagger.py", "Tagger")] == \
        [([], {"breadth": 16})]
