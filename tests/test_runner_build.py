"""gpu_runner.targets (which classes a change touches) and gpu_runner.build (a Subject from a target)."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from gpu_runner.targets import Target, TargetSpec, find_targets, parse_target_spec

FIXTURES = Path(__file__).resolve().parent / "fixtures"

MULTI_CLASS = textwrap.dedent('''\
    import torch
    import torch as th
    import torch.nn as nn
    from torch.nn import Module
    from torch.nn import Linear as Dense
    import pytorch_lightning as pl
    import lightning as L

    class Encoder(nn.Module):           # 9
        def forward(self, x):
            return x

    class Deeper(Encoder):              # 13: a subclass of a module class of this file
        pass

    class Plain:                        # 16: not a module
        pass

    class Direct(torch.nn.Module):      # 19
        pass

    class Aliased(th.nn.Sequential):    # 22
        pass

    class Bare(Module):                 # 25
        pass

    class Wide(Dense):                  # 28
        pass

    class Lit(pl.LightningModule):      # 31
        pass

    class Lit2(L.LightningModule):      # 34
        pass

    class Weight(nn.Parameter):         # 37: a tensor, not a module
        pass
    ''')
PATH = "models/net.py"


def _names(targets: list[Target]) -> list[str]:
    return [t.name for t in targets]


# ---- find_targets ----------------------------------------------------------------------------------


def test_new_file_finds_every_module_class_and_its_span():
    found = find_targets({PATH: MULTI_CLASS}, {PATH: None})
    assert _names(found) == ["Encoder", "Deeper", "Direct", "Aliased", "Bare", "Wide", "Lit", "Lit2"]
    encoder = found[0]
    assert (encoder.path, encoder.line, encoder.end_line, encoder.kind) == (PATH, 9, 11, "class")
    assert encoder.spec == "models/net.py:Encoder"


def test_changed_lines_pick_only_overlapping_classes():
    assert _names(find_targets({PATH: MULTI_CLASS}, {PATH: {10, 14}})) == ["Encoder", "Deeper"]
    assert _names(find_targets({PATH: MULTI_CLASS}, {PATH: {16, 17, 37, 38}})) == []  # Plain and Weight
    assert _names(find_targets({PATH: MULTI_CLASS}, {PATH: {26}})) == ["Bare"]
    assert find_targets({PATH: MULTI_CLASS}, {PATH: set()}) == []
    assert find_targets({PATH: MULTI_CLASS}, {"other.py": None}) == []  # a changed file we have no source for


def test_decorators_count_as_part_of_the_class():
    source = "import torch.nn as nn\n\n@register\nclass Net(nn.Module):\n    pass\n"
    (target,) = find_targets({PATH: source}, {PATH: {3}})
    assert (target.line, target.end_line) == (3, 5)


def test_base_classes_imported_from_another_source_file():
    layers = "from torch import nn\n\nclass Block(nn.Module):\n    pass\n"
    net = ("from .layers import Block\nfrom models.layers import Block as B2\nimport helpers\n\n"
           "class Net(Block):\n    pass\n\nclass Other(B2):\n    pass\n\nclass Unknown(helpers.Thing):\n    pass\n")
    found = find_targets({"models/layers.py": layers, PATH: net}, {PATH: None})
    assert _names(found) == ["Net", "Other"]


def test_unparsable_files_are_left_out():
    assert find_targets({PATH: "class Broken(nn.Module:\n"}, {PATH: None}) == []


def test_parse_target_spec():
    assert parse_target_spec("models/net.py:build_model") == TargetSpec("models/net.py", "build_model")
    assert parse_target_spec("models/net.py:Net") == TargetSpec("models/net.py", "Net")
    assert parse_target_spec("models/net.py") == TargetSpec("models/net.py", None)
    assert parse_target_spec("./models/net.py") == TargetSpec("models/net.py", None)
    assert parse_target_spec("models.net:Net") == TargetSpec("models/net.py", "Net")
    assert str(parse_target_spec("models/net.py:Net")) == "models/net.py:Net"
    for invalid in ("", "models/net.py:", "models/net.py:not valid", "not a path"):
        assert parse_target_spec(invalid) is None


# ---- build_subject ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
from gpu_runner.build import BuildError, Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import write_tree  # noqa: E402

EXPECTED = {  # fixture: (task, num_classes, integer inputs)
    "models/mlp.py": ("classification", 10, False),
    "models/cnn_bn.py": ("classification", 10, False),
    "models/tiny_lm.py": ("language_model", 50, True),
    "models/lstm.py": ("classification", 5, False),
    "models/two_input.py": ("classification", 3, False),
    "models/hf_style.py": ("classification", 4, True),
    "models/lightning_style.py": ("regression", None, False),
    "models/self_loss.py": ("custom", None, False),
}


def _build(target: str, **kwargs) -> Subject:
    subject = build_subject(FIXTURES, target, device="cpu", **kwargs)
    assert isinstance(subject, Subject), subject
    return subject


def _loss(subject: Subject, batch_size: int = 4, seed: int = 0):
    batch = subject.make_batch(batch_size, seed)
    return subject.loss_fn(subject.model(*batch.args, **batch.kwargs), batch.target)


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_every_fixture_builds_and_trains(target):
    subject = _build(target)
    task, num_classes, integer_inputs = EXPECTED[target]
    assert (subject.task, subject.num_classes, subject.integer_inputs) == (task, num_classes, integer_inputs)
    assert subject.device == "cpu" and subject.model.training
    batch = subject.make_batch(4, 0)
    assert batch.batch_size == 4
    loss = _loss(subject)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    assert any(p.grad is not None for p in subject.model.parameters())
    assert subject.notes  # what was guessed is recorded


def test_notes_and_inputs_say_what_was_inferred():
    mlp = _build("models/mlp.py:MLP")
    assert mlp.name == "models/mlp.py:MLP"
    assert "constructor: in_features=16 guessed" in mlp.notes
    assert "constructor: hidden_dim=32 guessed" in mlp.notes
    assert any("Linear(16→32)" in note for note in mlp.notes)
    assert mlp.make_batch(4, 0).args[0].shape == (4, 16)

    cnn = _build("models/cnn_bn.py")
    assert cnn.name == "models/cnn_bn.py:SmallCNN"
    assert cnn.make_batch(2, 0).args[0].shape == (2, 3, 32, 32)

    lstm = _build("models/lstm.py").make_batch(3, 0)
    assert lstm.args[0].shape == (3, 16, 8) and lstm.target.shape == (3,)

    two = _build("models/two_input.py").make_batch(4, 0)
    assert [tuple(a.shape) for a in two.args] == [(4, 12), (4, 6)]

    hf = _build("models/hf_style.py")
    batch = hf.make_batch(4, 0)
    assert batch.args[0].dtype == torch.long and int(batch.args[0].max()) < 120
    assert torch.equal(batch.kwargs["attention_mask"], torch.ones(4, 16, dtype=torch.long))
    assert any("'logits'" in note for note in hf.notes)

    lightning = _build("models/lightning_style.py")
    assert lightning.make_batch(4, 0).args[0].shape == (4, 5, 20)
    assert lightning.make_batch(4, 0).target.shape == (4, 1)
    assert any("example_input_array" in note for note in lightning.notes)


def test_language_model_targets_are_the_inputs_shifted():
    subject = _build("models/tiny_lm.py")
    batch = subject.make_batch(4, 0)
    tokens = batch.args[0]
    assert tokens.shape == (4, 16) and tokens.dtype == torch.long
    assert torch.equal(batch.target[:, :-1], tokens[:, 1:])
    assert (batch.target[:, -1] == -100).all()
    assert abs(_loss(subject).item() - math.log(50)) < 1.5  # about ln V at initialisation


def test_make_batch_is_deterministic_and_seeded():
    subject = _build("models/hf_style.py")
    first, again, other = subject.make_batch(4, 3), subject.make_batch(4, 3), subject.make_batch(4, 4)
    assert torch.equal(first.args[0], again.args[0]) and torch.equal(first.target, again.target)
    assert not torch.equal(first.args[0], other.args[0])
    assert subject.make_batch(8, 3).args[0].shape[0] == 8


def test_construction_is_seeded():
    a, b = _build("models/mlp.py", seed=1), _build("models/mlp.py", seed=1)
    assert torch.equal(a.model.net[0].weight, b.model.net[0].weight)


def test_probing_leaves_batchnorm_statistics_alone():
    subject = _build("models/cnn_bn.py")
    batchnorm = subject.model.features[1]
    assert torch.equal(batchnorm.running_mean, torch.zeros(8)) and int(batchnorm.num_batches_tracked) == 0


def test_unguessable_constructor_is_a_skip_with_an_actionable_reason():
    result = build_subject(FIXTURES, "models/needs_config.py:Finetuner", device="cpu")
    assert isinstance(result, Skip)
    assert "cannot guess constructor argument 'backbone'" in result.reason
    assert "smoke.targets" in result.reason and "factory" in result.reason


@pytest.mark.parametrize("init", [
    "self.fc = nn.Linear(4, 2)",  # a submodule before super().__init__()
    "self.scale = nn.Parameter(torch.ones(2))",
])
def test_a_model_without_super_init_says_so_instead_of_asking_for_configuration(tmp_path, init):
    root = write_tree(tmp_path, {"net.py": f"""\
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                {init}

            def forward(self, x):
                return x
        """})
    result = build_subject(root, "net.py:Net", device="cpu")
    assert isinstance(result, Skip)
    assert "TR301" in result.reason and "super().__init__()" in result.reason
    assert "smoke.targets" not in result.reason


@pytest.mark.parametrize("allocation", [
    "raise MemoryError()",
    "raise RuntimeError('[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can\\'t allocate memory')",
])
def test_a_constructor_stopped_by_the_memory_limit_names_the_limit_not_the_configuration(tmp_path, allocation):
    root = write_tree(tmp_path, {"net.py": f"""\
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                {allocation}
        """})
    result = build_subject(root, "net.py:Net", device="cpu")
    assert isinstance(result, Skip)
    assert "memory budget" in result.reason and "smoke.memory" in result.reason
    assert "factory" not in result.reason


CONFIGURED = {
    "models/__init__.py": "",
    "models/layers.py": """\
        import torch.nn as nn

        class Projection(nn.Linear):
            pass
        """,
    "models/net.py": """\
        import torch
        import torch.nn as nn
        from models.layers import Projection

        class Net(nn.Module):
            def __init__(self, scale):
                super().__init__()
                self.scale = scale
                self.proj = Projection(7, 3)

            def forward(self, x):
                if x.shape[1:] != (5, 7):
                    raise ValueError(f"expected [B, 5, 7], got {list(x.shape)}")
                return self.proj(x).mean(dim=1) * self.scale

        def build_model():
            return Net(2.0)

        def broken_factory():
            raise RuntimeError("boom")
        """,
    "models/losses.py": """\
        def mean_abs(output, target):
            return (output - target).abs().mean()
        """,
}


def test_configured_factory_input_and_task(tmp_path):
    root = write_tree(tmp_path, CONFIGURED)
    assert isinstance(build_subject(root, "models/net.py:Net", device="cpu"), Skip)  # 'scale' is unguessable

    config = {"factory": "models/net.py:build_model", "input": {"shape": [5, 7], "dtype": "float32"},
              "task": "regression"}
    subject = build_subject(root, "models/net.py:Net", device="cpu", config=config)
    assert isinstance(subject, Subject)
    assert subject.task == "regression" and subject.model.scale == 2.0
    batch = subject.make_batch(4, 0)
    assert batch.args[0].shape == (4, 5, 7) and batch.target.shape == (4, 3)
    assert math.isfinite(_loss(subject).item())

    config = dict(config, task="classification", loss="models.losses:mean_abs",
                  loss_target={"shape": [3], "dtype": "float32"})
    subject = build_subject(root, "models/net.py:Net", device="cpu", config=config)
    assert (subject.task, subject.num_classes) == ("classification", 3)
    batch = subject.make_batch(4, 0)
    output = subject.model(*batch.args)
    assert torch.allclose(subject.loss_fn(output, batch.target), (output - batch.target).abs().mean())


def test_configured_long_input(tmp_path):
    root = write_tree(tmp_path, {"net.py": """\
        import torch.nn as nn

        class Bag(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.EmbeddingBag(30, 8)
                self.out = nn.Linear(8, 2)

            def forward(self, x):
                return self.out(self.emb(x))
        """})
    config = {"input": {"shape": [6], "dtype": "long", "low": 0, "high": 30}, "task": "classification"}
    subject = build_subject(root, "net.py:Bag", device="cpu", config=config)
    tokens = subject.make_batch(4, 0).args[0]
    assert tokens.dtype == torch.long and tokens.shape == (4, 6) and int(tokens.max()) < 30


def test_configured_input_that_the_forward_rejects_still_builds_for_the_checks(tmp_path):
    root = write_tree(tmp_path, CONFIGURED)
    config = {"factory": "models/net.py:build_model", "input": {"shape": [4, 7]}, "task": "regression"}
    subject = build_subject(root, "models/net.py:Net", device="cpu", config=config)
    assert isinstance(subject, Subject)
    assert any("forward failed on the configured input" in note for note in subject.notes)
    with pytest.raises(ValueError):
        _loss(subject)


def test_a_factory_that_raises_is_an_error_and_a_missing_package_a_skip(tmp_path):
    root = write_tree(tmp_path, dict(CONFIGURED, **{"models/needs_dep.py": """\
        import torch.nn as nn
        import some_package_the_runner_lacks

        HOOKS = some_package_the_runner_lacks.setup()  # its result kept when imported: no stand-in can replace it

        class Net(nn.Module):
            def forward(self, x):
                return x
        """}))
    with pytest.raises(BuildError, match="boom"):
        build_subject(root, "models/net.py:Net", device="cpu", config={"factory": "models/net.py:broken_factory"})
    skipped = build_subject(root, "models/needs_dep.py:Net", device="cpu")
    assert isinstance(skipped, Skip) and "some_package_the_runner_lacks" in skipped.reason
    missing = build_subject(root, "models/gone.py:Net", device="cpu")
    assert isinstance(missing, Skip) and "does not exist" in missing.reason


def test_inputs_found_by_search_and_unfindable_inputs(tmp_path):
    root = write_tree(tmp_path, {"lenet.py": """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class LeNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 6, 5)
                self.fc = nn.Linear(6 * 12 * 12, 10)

            def forward(self, x):
                return self.fc(F.max_pool2d(F.relu(self.conv1(x)), 2).flatten(1))

        class Opaque(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(5, 7))

            def forward(self, x):
                return x @ self.weight
        """})
    lenet = build_subject(root, "lenet.py:LeNet", device="cpu")
    assert isinstance(lenet, Subject) and lenet.make_batch(2, 0).args[0].shape == (2, 1, 28, 28)
    opaque = build_subject(root, "lenet.py:Opaque", device="cpu")
    assert isinstance(opaque, Skip) and "could not infer an input" in opaque.reason
    assert "input shape" in opaque.reason
