"""gpu_runner.sites: models built the way the repository builds them (its training script's argparse defaults,
a YAML config, a factory's callers), each in a small tree that guessing alone cannot build."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import sites  # noqa: E402
from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

# A tagger whose argument names mean nothing to the guess table; only train.py says what they are.
TAGGER = {
    "models/__init__.py": "",
    "models/tagger.py": """\
        from torch import nn

        class Tagger(nn.Module):
            def __init__(self, alphabet, breadth, stacks):
                super().__init__()
                self.embed = nn.Embedding(alphabet, breadth)
                self.body = nn.Sequential(*[nn.Linear(breadth, breadth) for _ in range(stacks)])
                self.out = nn.Linear(breadth, 5)

            def forward(self, tokens):
                return self.out(self.body(self.embed(tokens)).mean(1))
        """,
}
TAGGER_SCRIPT = {
    "train.py": """\
        import argparse
        import torch
        from models.tagger import Tagger

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--alphabet", type=int, default=40)
            parser.add_argument("--breadth", default="24", type=int)
            parser.add_argument("--stacks", type=int, default=3)
            parser.add_argument("--epochs", type=int, default=10)
            args = parser.parse_args()
            args.device = "cpu"  # sets an attribute: args is still the parsed namespace
            model = Tagger(args.alphabet, args.breadth, stacks=args.stacks)
            for _ in range(args.epochs):
                pass

        if __name__ == "__main__":
            main()
        """,
}

CODER = {
    "models/coder.py": """\
        from torch import nn

        class Coder(nn.Module):
            def __init__(self, glyphs, spread, image_side):
                super().__init__()
                self.side = image_side
                self.hidden = nn.Linear(image_side * image_side, spread)
                self.out = nn.Linear(spread, glyphs)

            def forward(self, pictures):
                assert pictures.shape[-1] == self.side and pictures.dim() == 4
                return self.out(self.hidden(pictures.flatten(1)).relu())
        """,
}
CODER_SCRIPT = {
    "configs/base.yaml": """\
        model:
          glyphs: 7
          spread: 30
        data:
          side: 12
        """,
    "train.py": """\
        import torch
        import yaml
        from models.coder import Coder

        with open("configs/base.yaml") as handle:
            config = yaml.safe_load(handle)
        model = Coder(**config["model"], image_side=config["data"]["side"])
        side = config["data"]["side"]
        print(model(torch.randn(4, 1, side, side)).shape)
        """,
}

MIXER = {
    "models/__init__.py": "",
    "models/net.py": """\
        from torch import nn

        class Mixer(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.mix = nn.Linear(cfg.lanes, cfg.lanes)
                self.head = nn.Linear(cfg.lanes, cfg.fold)

            def forward(self, x):
                return self.head(self.mix(x).tanh())
        """,
}
MIXER_SCRIPTS = {
    "models/factory.py": """\
        from .net import Mixer

        def build_model(cfg):
            return Mixer(cfg.model)
        """,
    "utils.py": """\
        import yaml

        def load_config(path):
            with open(path) as handle:
                return yaml.safe_load(handle)
        """,
    "configs/mixer.yaml": "model:\n  lanes: 6\n  fold: 3\n",
    "train.py": """\
        import argparse
        from models.factory import build_model
        from utils import load_config

        parser = argparse.ArgumentParser()
        parser.add_argument("--config", default="configs/mixer.yaml")
        args = parser.parse_args()
        cfg = load_config(args.config)
        model = build_model(cfg)
        """,
}


def _build(root: Path, target: str):
    return build_subject(root, target, device="cpu")


@pytest.mark.parametrize("model, scripts, target", [
    (TAGGER, TAGGER_SCRIPT, "models/tagger.py:Tagger"),
    (CODER, CODER_SCRIPT, "models/coder.py:Coder"),
    (MIXER, MIXER_SCRIPTS, "models/net.py:Mixer"),
], ids=["argparse", "yaml", "factory"])
def test_guessing_alone_cannot_build_these(tmp_path, model, scripts, target):
    """Without the code that builds them, the three fixtures are skipped: the tests below prove the sites."""
    result = _build(write_tree(tmp_path, model), target)
    assert isinstance(result, Skip), result


def test_a_class_built_only_in_a_training_script_takes_its_argparse_defaults(tmp_path):
    subject = _build(write_tree(tmp_path, {**TAGGER, **TAGGER_SCRIPT}), "models/tagger.py:Tagger")
    assert isinstance(subject, Subject), subject
    assert subject.model.embed.num_embeddings == 40 and subject.model.embed.embedding_dim == 24
    assert len(subject.model.body) == 3
    assert any("train.py:13" in n and "argparse defaults of train.py" in n for n in subject.notes), subject.notes


def test_a_class_built_from_a_yaml_config_takes_its_values_and_input(tmp_path):
    subject = _build(write_tree(tmp_path, {**CODER, **CODER_SCRIPT}), "models/coder.py:Coder")
    assert isinstance(subject, Subject), subject
    assert subject.model.out.out_features == 7 and subject.model.side == 12
    assert any("configs/base.yaml" in n for n in subject.notes), subject.notes
    # the forward asserts a 4-d picture: the repository's call says which
    assert any("input from the repository's call of the model near train.py:7" in n and "[B, 1, 12, 12]" in n
               for n in subject.notes), subject.notes


def test_a_class_built_by_a_factory_takes_the_config_its_callers_pass(tmp_path):
    subject = _build(write_tree(tmp_path, {**MIXER, **MIXER_SCRIPTS}), "models/net.py:Mixer")
    assert isinstance(subject, Subject), subject
    assert subject.model.mix.in_features == 6 and subject.model.head.out_features == 3
    assert any("models/factory.py:4" in n and "configs/mixer.yaml" in n for n in subject.notes), subject.notes


def test_large_repository_sizes_are_shrunk_like_defaults(tmp_path):
    files = {**TAGGER, "train.py": TAGGER_SCRIPT["train.py"].replace('default="24"', 'default="1024"')}
    subject = _build(write_tree(tmp_path / "kept", files), "models/tagger.py:Tagger")
    assert isinstance(subject, Subject), subject
    assert subject.model.embed.embedding_dim == 1024  # "breadth" is no size name the runner knows: kept
    files["models/tagger.py"] = TAGGER["models/tagger.py"].replace("breadth", "hidden_dim")
    files["train.py"] = files["train.py"].replace("args.breadth", "hidden_dim=args.breadth")
    subject = _build(write_tree(tmp_path / "shrunk", files), "models/tagger.py:Tagger")
    assert isinstance(subject, Subject), subject
    assert subject.model.embed.embedding_dim < 1024
    assert any("the repository's 1024, shrunk" in n for n in subject.notes), subject.notes


def test_hydra_entry_point_composes_its_defaults(tmp_path):
    root = write_tree(tmp_path, {
        **MIXER,
        "conf/train.yaml": "defaults:\n  - model: small\n  - _self_\nseed: 1\n",
        "conf/model/small.yaml": "lanes: 5\nfold: ${model.lanes}\n",
        "run.py": """\
            import hydra
            from models.net import Mixer

            @hydra.main(config_path="conf", config_name="train")
            def main(cfg):
                model = Mixer(cfg.model)
            """,
    })
    found = sites.constructions(root, "models/net.py", "Mixer")
    assert len(found) == 1 and found[0].where == "run.py:6"
    assert dict(found[0].positional[0]) == {"lanes": 5, "fold": 5}
    assert found[0].origins == ["the Hydra config conf/train"]



def test_a_config_file_named_on_the_command_line_is_one_of_the_repositorys_and_a_namespace_helper_keeps_it(tmp_path):
    # the script joins a folder with a file the user names (``--recipe``, required, no default) and turns the
    # mapping into attributes with its own helper: the folder's first configuration file stands for the named one
    root = write_tree(tmp_path, {
        **MIXER,
        "recipes/alpha.yml": "lanes: 6\nfold: 2\n",
        "recipes/beta.yml": "lanes: 9\nfold: 3\n",
        "recipes/notes.txt": "not a configuration\n",
        "launch.py": """\
            import argparse, os, types
            import yaml
            from models.net import Mixer

            def as_attributes(mapping):
                holder = types.SimpleNamespace()
                for key, value in mapping.items():
                    setattr(holder, key, as_attributes(value) if isinstance(value, dict) else value)
                return holder

            parser = argparse.ArgumentParser()
            parser.add_argument("--recipe", required=True)
            args = parser.parse_args()
            with open(os.path.join("recipes", args.recipe)) as handle:
                settings = as_attributes(yaml.safe_load(handle))
            model = Mixer(settings)
            """,
    })
    found = sites.constructions(root, "models/net.py", "Mixer")
    assert len(found) == 1 and dict(found[0].positional[0]) == {"lanes": 6, "fold": 2}
    assert any("recipes/alpha.yml, one of the configuration files in recipes/" in o for o in found[0].origins)


def test_of_the_configurations_the_command_line_may_name_the_one_with_the_smallest_sizes_is_read(tmp_path):
    # any file of the folder is one the repository runs with: the cheapest to check is taken, not the first by name
    root = write_tree(tmp_path, {
        **MIXER,
        "recipes/large.yml": "lanes: 512\nfold: 4\nshape: [64, 64]\nbatch: 8\n",
        "recipes/small.yml": "lanes: 32\nfold: 4\nshape: [16, 16]\nbatch: 32\n",
        "recipes/broken.yml": "lanes: [unclosed\n",
        "launch.py": """\
            import argparse, os
            import yaml
            from models.net import Mixer

            parser = argparse.ArgumentParser()
            parser.add_argument("--recipe", required=True)
            args = parser.parse_args()
            model = Mixer(yaml.safe_load(open(os.path.join("recipes", args.recipe))))
            """,
    })
    found = sites.constructions(root, "models/net.py", "Mixer")
    assert len(found) == 1 and dict(found[0].positional[0])["lanes"] == 32
    assert any("recipes/small.yml" in o and "smallest sizes" in o for o in found[0].origins), found[0].origins


def test_a_named_file_in_a_folder_without_configurations_stays_unknown(tmp_path):
    root = write_tree(tmp_path, {
        **MIXER,
        "recipes/readme.txt": "nothing to read\n",
        "launch.py": """\
            import os, sys
            import yaml
            from models.net import Mixer

            settings = yaml.safe_load(open(os.path.join("recipes", sys.argv[1])))
            model = Mixer(settings)
            """,
    })
    found = sites.constructions(root, "models/net.py", "Mixer")
    assert all(c.positional == [] or c.positional[0] is sites.UNKNOWN for c in found)

def test_unevaluable_arguments_are_left_unknown_and_calls_of_other_classes_ignored(tmp_path):
    root = write_tree(tmp_path, {
        **TAGGER,
        "other.py": "class Tagger:\n    pass\n\nTagger(1, 2, 3)\n",  # a class of the same name elsewhere
        "uses_other.py": "from other import Tagger\n\nTagger(4, 5, 6)\n",
        "run.py": """\
            import random
            from models.tagger import Tagger

            model = Tagger(random.randint(1, 9), 16, stacks=2)
            """,
    })
    found = sites.constructions(root, "models/tagger.py", "Tagger")
    assert [c.where for c in found] == ["run.py:4"]
    assert found[0].positional == [sites.UNKNOWN, 16] and found[0].keywords == {"stacks": 2}


def test_a_layer_built_inside_a_model_takes_what_the_models_callers_pass(tmp_path):
    """``Block(width, slope)`` is built in ``Stack.__init__`` from its own parameters; ``Stack`` is built in
    train.py from argparse defaults: the block's arguments come through both."""
    root = write_tree(tmp_path, {
        "layers.py": """\
            from torch import nn

            class Block(nn.Module):
                def __init__(self, width, slope):
                    super().__init__()
                    self.fc, self.act = nn.Linear(width, width), nn.LeakyReLU(slope)

                def forward(self, x):
                    return self.act(self.fc(x))

            class Stack(nn.Module):
                def __init__(self, width, slope, count):
                    super().__init__()
                    self.blocks = nn.Sequential(*[Block(width, slope=slope) for _ in range(count)])

                def forward(self, x):
                    return self.blocks(x)
            """,
        "train.py": """\
            import argparse
            from layers import Stack

            parser = argparse.ArgumentParser()
            parser.add_argument("--slope", type=float, default=0.3)
            args = parser.parse_args()
            model = Stack(12, args.slope, count=2)
            """,
    })
    (site,) = sites.constructions(root, "layers.py", "Block")
    assert site.where == "layers.py:14" and site.positional == [12] and site.keywords == {"slope": 0.3}
    subject = _build(root, "layers.py:Block")
    assert isinstance(subject, Subject), subject
    assert subject.model.fc.in_features == 12 and subject.model.act.negative_slope == 0.3


def test_a_skip_says_what_the_repositorys_call_gave_and_what_it_left_out(tmp_path):
    files = {**TAGGER, "run.py": "import random\nfrom models.tagger import Tagger\n\n"
                                 "model = Tagger(random.randint(20, 30), 16, stacks=2)\n"}
    skipped = _build(write_tree(tmp_path, files), "models/tagger.py:Tagger")
    assert isinstance(skipped, Skip)
    assert "the repository's call did not build it either: at run.py:4 it gives breadth=16, stacks=2, and the " \
           "rest cannot guess constructor argument 'alphabet'" in skipped.reason, skipped.reason


def test_cycles_and_relative_imports_past_the_root_have_no_value(tmp_path):
    root = write_tree(tmp_path, {
        **TAGGER,
        "run.py": """\
            from models.tagger import Tagger
            from .......far import away

            def deeper(width):
                return deeper(width)

            def relay(width):
                return Tagger(away, deeper(width), stacks=relay(width))

            relay(3)
            """,
    })
    assert sites.constructions(root, "models/tagger.py", "Tagger") == []  # nothing evaluable: no site, no hang
