"""The runner on the shapes real model code takes (issue 14): config objects, factories, constructor arguments
the name table does not know, packages whose __init__ cannot be imported, graph and skip-connection inputs;
and the checks never crying wolf on healthy models while still catching what they missed before.

The model sources below are written for these tests in the styles of well-known public repositories."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from gpu_runner.build import Skip, build_subject
from gpu_runner.checks import run_checks
from tests.runner_support import write_tree

STEPS = 20





def build(root: Path, target: str):
    subject = build_subject(root, target, device="cpu")
    assert not isinstance(subject, Skip), subject.reason
    return subject


def check(report, name):
    return next(c for c in report.checks if c.name == name)


GPT_STYLE = '''
    import math
    from dataclasses import dataclass
    import torch
    import torch.nn as nn
    from torch.nn import functional as F

    @dataclass
    class GPTConfig:
        block_size: int = 1024
        vocab_size: int = 50304
        n_layer: int = 12
        n_head: int = 12
        n_embd: int = 768
        dropout: float = 0.0

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln = nn.LayerNorm(config.n_embd)
            self.fc = nn.Linear(config.n_embd, config.n_embd)

        def forward(self, x):
            return x + self.fc(self.ln(x))

    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
            self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

        def forward(self, idx):
            pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            return self.head(x)
'''


def test_config_dataclass_of_the_module_is_filled_and_shrunk(tmp_path):
    subject = build(write_tree(tmp_path, {"model.py": GPT_STYLE}), "model.py:GPT")
    config = subject.model.config
    assert (config.n_layer, config.n_embd, config.vocab_size, config.block_size) == (2, 32, 100, 16)
    assert subject.task == "language_model"
    assert any("GPTConfig()" in note for note in subject.notes)
    report = run_checks(subject, steps=STEPS)
    assert report.status == "passed", [(c.name, c.message) for c in report.checks if c.status == "fail"]


def test_a_block_taking_the_config_is_built_too(tmp_path):
    subject = build(write_tree(tmp_path, {"model.py": GPT_STYLE}), "model.py:Block")
    assert subject.model.fc.in_features == 32


MINGPT_STYLE = '''
    import torch.nn as nn

    class CfgNode:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    class GPT(nn.Module):
        @staticmethod
        def get_default_config():
            C = CfgNode()
            C.model_type = 'gpt'
            C.n_layer = None
            C.n_embd = None
            C.vocab_size = None
            C.block_size = None
            return C

        def __init__(self, config):
            super().__init__()
            type_given = config.model_type is not None
            params_given = config.n_layer is not None and config.n_embd is not None
            assert type_given ^ params_given
            if type_given:
                config.__dict__.update({'gpt-nano': dict(n_layer=3, n_embd=48)}[config.model_type])
            self.emb = nn.Embedding(config.vocab_size, config.n_embd)
            self.head = nn.Linear(config.n_embd, config.vocab_size)

        def forward(self, idx):
            return self.head(self.emb(idx))
'''


def test_get_default_config_gets_its_none_fields_and_loses_a_conflicting_preset(tmp_path):
    subject = build(write_tree(tmp_path, {"model.py": MINGPT_STYLE}), "model.py:GPT")
    assert subject.model.emb.num_embeddings == 100 and subject.model.emb.embedding_dim == 32


NAMESPACE_STYLE = '''
    import torch.nn as nn

    class Head(nn.Module):
        def __init__(self, args):
            super().__init__()
            self.inner = Inner(args)
            self.out = nn.Linear(args.hidden_size, args.num_classes)

        def forward(self, x):
            return self.out(self.inner(x))

    class Inner(nn.Module):
        def __init__(self, args):
            super().__init__()
            self.fc = nn.Linear(args.input_dim, args.hidden_size)

        def forward(self, x):
            return self.fc(x).relu()
'''


def test_config_namespace_from_the_attributes_read_including_nested_constructors(tmp_path):
    subject = build(write_tree(tmp_path, {"net.py": NAMESPACE_STYLE}), "net.py:Head")
    assert subject.model.inner.fc.in_features == 16 and subject.task == "classification"
    assert any("config.input_dim=16 guessed" in note for note in subject.notes)


RESNET_STYLE = '''
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, in_planes, planes, stride=1):
            super().__init__()
            self.conv = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
            self.bn = nn.BatchNorm2d(planes)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)))

    class ResNet(nn.Module):
        def __init__(self, block, num_blocks, num_classes=10):
            super().__init__()
            self.in_planes = 8
            self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
            self.layer1 = self._make_layer(block, 8, num_blocks[0])
            self.layer2 = self._make_layer(block, 16, num_blocks[1])
            self.linear = nn.Linear(16 * block.expansion, num_classes)

        def _make_layer(self, block, planes, n):
            layers = []
            for _ in range(n):
                layers.append(block(self.in_planes, planes))
                self.in_planes = planes * block.expansion
            return nn.Sequential(*layers)

        def forward(self, x):
            out = self.layer2(self.layer1(F.relu(self.conv1(x))))
            return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))

    cfg = {'VGG11': [8, 'M', 16, 'M'], 'VGG13': [8, 8, 'M', 16, 'M']}

    class VGG(nn.Module):
        def __init__(self, vgg_name):
            super().__init__()
            layers, c = [], 3
            for x in cfg[vgg_name]:
                if x == 'M':
                    layers.append(nn.MaxPool2d(2))
                else:
                    layers += [nn.Conv2d(c, x, 3, padding=1), nn.ReLU()]
                    c = x
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(c * 8 * 8, 10)

        def forward(self, x):
            return self.classifier(self.features(x).flatten(1))

    class RNNModel(nn.Module):
        def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers):
            super().__init__()
            self.encoder = nn.Embedding(ntoken, ninp)
            if rnn_type in ['LSTM', 'GRU']:
                self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, batch_first=True)
            else:
                nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
                self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, batch_first=True)
            self.decoder = nn.Linear(nhid, ntoken)

        def forward(self, input):
            return self.decoder(self.rnn(self.encoder(input))[0])

    def Custom(n):
        return ResNet(BasicBlock, [n, n])

    def ResNetTiny():
        return ResNet(BasicBlock, [2, 2])
'''


def test_class_typed_argument_from_a_sibling_and_a_list_from_its_subscripts(tmp_path):
    without_factories = RESNET_STYLE[:RESNET_STYLE.index("def Custom(n):")]  # nothing in the tree builds ResNet
    subject = build(write_tree(tmp_path, {"models/resnet.py": without_factories}), "models/resnet.py:ResNet")
    assert isinstance(subject.model.layer1[0], nn.Module) and len(subject.model.layer2) == 1
    assert any("block=BasicBlock guessed" in note for note in subject.notes)


def test_the_repositorys_own_call_comes_before_guessing_what_it_leaves_out(tmp_path):
    """``ResNetTiny()`` calls ``ResNet(BasicBlock, [2, 2])``: the blocks per stage and the block class are the
    repository's (the class passed is a value the static evaluation gives, not a guess)."""
    subject = build(write_tree(tmp_path, {"models/resnet.py": RESNET_STYLE}), "models/resnet.py:ResNet")
    assert len(subject.model.layer1) == 2 and len(subject.model.layer2) == 2
    assert any("repository's call at models/resnet.py:" in note and "block=BasicBlock, num_blocks=[2, 2]" in note
               for note in subject.notes), subject.notes
    assert not any("block=BasicBlock guessed" in note for note in subject.notes), subject.notes


def test_a_key_of_the_module_table_the_constructor_indexes(tmp_path):
    subject = build(write_tree(tmp_path, {"models/resnet.py": RESNET_STYLE}), "models/resnet.py:VGG")
    assert any("vgg_name='VGG11'" in note for note in subject.notes)


def test_a_choice_the_constructor_compares_against(tmp_path):
    subject = build(write_tree(tmp_path, {"models/resnet.py": RESNET_STYLE}), "models/resnet.py:RNNModel")
    assert isinstance(subject.model.rnn, nn.LSTM) and subject.task == "language_model"


def test_the_modules_own_factory_when_the_class_cannot_be_built(tmp_path):
    source = RESNET_STYLE.replace("self.layer1 = self._make_layer(block, 8, num_blocks[0])",
                                  "assert num_blocks[0] > 1, 'too shallow'\n"
                                  "            self.layer1 = self._make_layer(block, 8, num_blocks[0])")
    # a generator expression is no value gpu_runner.sites evaluates: the factory's call is not read, the factory is run
    source = source.replace("ResNet(BasicBlock, [2, 2])", "ResNet(BasicBlock, list(k for k in (2, 2)))")
    subject = build(write_tree(tmp_path, {"models/resnet.py": source}), "models/resnet.py:ResNet")
    assert any("built by ResNetTiny()" in note for note in subject.notes)


TUPLES_STYLE = '''
    import torch.nn as nn

    class Staged(nn.Module):
        def __init__(self, num_classes, dims, depths, heads=4):
            super().__init__()
            assert len(dims) == 3, 'dims must be a tuple of 3'
            assert isinstance(depths, tuple), 'depths must be a tuple'
            layers, c = [], 3
            for dim, depth in zip(dims, depths):
                for _ in range(depth):
                    layers += [nn.Conv2d(c, dim, 3, padding=1), nn.ReLU()]
                    c = dim
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(c, num_classes)

        def forward(self, img):
            return self.head(self.body(img).mean(dim=(2, 3)))
'''


def test_sequences_of_the_length_the_constructor_asserts(tmp_path):
    subject = build(write_tree(tmp_path, {"staged.py": TUPLES_STYLE}), "staged.py:Staged")
    assert sum(isinstance(m, nn.Conv2d) for m in subject.model.modules()) == 3  # depth 1 per stage, 3 stages


@pytest.mark.parametrize("init, note", [
    ("import a_package_nobody_has\n", "stand-ins for 'a_package_nobody_has'"),  # imported: a stand-in for it
    ("import a_package_nobody_has\nHOOKS = a_package_nobody_has.setup()\n",  # used: the package is skipped over
     "without running its package's __init__.py, which raised MissingPackageError: a_package_nobody_has.setup"),
])
def test_a_package_whose_init_cannot_be_imported_is_skipped_over(tmp_path, init, note):
    root = write_tree(tmp_path, {"pkg/__init__.py": init + "from pkg.mlp import MLP\n",
                            "pkg/layers.py": "import torch.nn as nn\nclass Dense(nn.Linear):\n    pass\n",
                            "pkg/mlp.py": '''
                                import torch.nn as nn
                                from pkg.layers import Dense
                                from .layers import Dense as Same

                                class MLP(nn.Module):
                                    def __init__(self, in_features, num_classes):
                                        super().__init__()
                                        self.net = nn.Sequential(Dense(in_features, 32), nn.ReLU(), Same(32, num_classes))

                                    def forward(self, x):
                                        return self.net(x)
                            '''})
    subject = build(root, "pkg/mlp.py:MLP")
    assert any(note in text for text in subject.notes), subject.notes


def test_inputs_sized_by_the_constructor_image_and_one_dimensional(tmp_path):
    root = write_tree(tmp_path, {"vit.py": '''
        import torch.nn as nn

        class ViT(nn.Module):
            def __init__(self, image_size, patch_size, num_classes, dim, channels=3):
                super().__init__()
                self.patch = nn.Conv2d(channels, dim, patch_size, patch_size)
                self.n = (image_size // patch_size) ** 2
                self.head = nn.Linear(dim * self.n, num_classes)

            def forward(self, img):
                return self.head(self.patch(img).flatten(1))

        class ViT1D(nn.Module):
            def __init__(self, seq_len, patch_size, num_classes, dim, channels=3):
                super().__init__()
                self.patch = nn.Linear(channels * patch_size, dim)
                self.p = patch_size
                self.head = nn.Linear(dim * (seq_len // patch_size), num_classes)

            def forward(self, series):
                b, c, n = series.shape
                x = series.reshape(b, c, n // self.p, self.p).transpose(1, 2).reshape(b, n // self.p, c * self.p)
                return self.head(self.patch(x).flatten(1))
    '''})
    assert any("[B, 3, 32, 32]" in note and "constructor" in note for note in build(root, "vit.py:ViT").notes)
    assert any("[B, 3, 16]" in note for note in build(root, "vit.py:ViT1D").notes)


def test_graph_inputs_and_skip_connection_inputs(tmp_path):
    root = write_tree(tmp_path, {"graph.py": '''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class GCN(nn.Module):
            def __init__(self, input_dim, hidden_dim, output_dim):
                super().__init__()
                self.w1 = nn.Linear(input_dim, hidden_dim)
                self.w2 = nn.Linear(hidden_dim, output_dim)

            def forward(self, input_tensor, adj_mat):
                x = F.relu(torch.mm(adj_mat, self.w1(input_tensor)))
                return torch.mm(adj_mat, self.w2(x))

        class Up(nn.Module):
            def __init__(self, in_channels, out_channels):
                super().__init__()
                self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
                self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

            def forward(self, x1, x2):
                return self.conv(torch.cat([x2, self.up(x1)], dim=1))
    '''})
    gcn = build(root, "graph.py:GCN")
    assert gcn.graph and any("adjacency" in note for note in gcn.notes)
    report = run_checks(gcn, steps=STEPS)
    assert report.status == "passed", [(c.name, c.message) for c in report.checks if c.status == "fail"]
    assert check(report, "batch-leakage").status == "skip"
    up = build(root, "graph.py:Up")
    low, skip = up.make_batch(2, 0).args  # the skip connection: the channels the upsampling leaves, at twice the size
    channels = low.shape[1]
    assert skip.shape[1] == channels - channels // 2 and skip.shape[2:] == (2 * low.shape[2], 2 * low.shape[3])


def test_parameter_free_module_is_skipped_not_checked(tmp_path):
    root = write_tree(tmp_path, {"act.py": '''
        import math, torch, torch.nn as nn

        class NewGELU(nn.Module):
            def forward(self, x):
                return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    '''})
    subject = build_subject(root, "act.py:NewGELU", device="cpu")
    assert isinstance(subject, Skip) and "no trainable parameters" in subject.reason


def test_layer_norm_alone_fits_a_reachable_regression_target(tmp_path):
    root = write_tree(tmp_path, {"ln.py": '''
        import torch.nn as nn
        import torch.nn.functional as F

        class LayerNorm(nn.Module):
            def __init__(self, ndim, bias):
                super().__init__()
                self.weight = nn.Parameter(__import__("torch").ones(ndim))
                self.bias = nn.Parameter(__import__("torch").zeros(ndim)) if bias else None

            def forward(self, input):
                return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)
    '''})
    report = run_checks(build(root, "ln.py:LayerNorm"), steps=STEPS)
    overfit = check(report, "overfit-batch")
    assert overfit.status == "pass" and "reachable target" in overfit.message


SIGMOID_HEADS = '''
    import torch
    import torch.nn as nn

    class Scorer(nn.Module):  # a similarity score in (0, 1), trained with binary cross-entropy
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, x):
            return torch.sigmoid(self.body(x))

    class FrozenScorer(Scorer):
        def forward(self, x):
            return torch.sigmoid(self.body(x).detach() + 0 * self.body[0].bias.sum())

    class Clamped(Scorer):  # in [0, 1] too, but not a sigmoid's output: still squared error
        def forward(self, x):
            return self.body(x).clamp(0, 1)
'''


def test_a_sigmoid_output_is_fitted_as_a_probability_and_a_frozen_one_still_fails(tmp_path):
    root = write_tree(tmp_path, {"scores.py": SIGMOID_HEADS})
    subject = build(root, "scores.py:Scorer")
    assert any("sigmoid's (probabilities)" in note for note in subject.notes), subject.notes
    target = subject.make_batch(8, 0).target
    assert float(subject.loss_fn(target, target)) == pytest.approx(0.0, abs=1e-5)  # a perfect fit is 0
    assert check(run_checks(subject, steps=STEPS), "overfit-batch").status == "pass"
    assert check(run_checks(build(root, "scores.py:FrozenScorer"), steps=STEPS), "overfit-batch").status == "fail"
    clamped = build(root, "scores.py:Clamped")
    assert not any("sigmoid" in note for note in clamped.notes), clamped.notes


def test_a_detached_regression_model_still_fails_overfit(tmp_path):
    root = write_tree(tmp_path, {"frozen.py": '''
        import torch.nn as nn

        class Frozen(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)
                self.scale = nn.Parameter(__import__("torch").ones(1))

            def forward(self, x):
                return self.fc(x).detach() * 1.0 + 0 * self.scale
    '''})
    report = run_checks(build(root, "frozen.py:Frozen"), steps=STEPS)
    assert check(report, "overfit-batch").status == "fail"


def test_cosine_logits_are_not_called_unable_to_fit(tmp_path):
    root = write_tree(tmp_path, {"cos.py": '''
        import torch.nn as nn
        import torch.nn.functional as F

        class CosineHead(nn.Module):
            def __init__(self, in_dim, out_dim):
                super().__init__()
                self.mlp = nn.Linear(in_dim, 32)
                self.last = nn.Linear(32, out_dim, bias=False)

            def forward(self, x):
                x = F.normalize(self.mlp(x), dim=-1)
                return F.linear(x, F.normalize(self.last.weight, dim=-1))
    '''})
    report = run_checks(build(root, "cos.py:CosineHead"), steps=STEPS)
    assert check(report, "overfit-batch").status in ("pass", "skip")
    assert "[-1, 1]" in check(report, "overfit-batch").message


def test_cpu_position_ids_into_an_embedding_fail_device_placement(tmp_path):
    root = write_tree(tmp_path, {"pos.py": '''
        import torch
        import torch.nn as nn

        class Pos(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(100, 16)
                self.pos = nn.Embedding(16, 16)
                self.head = nn.Linear(16, 100)

            def forward(self, idx):
                pos = torch.arange(0, idx.shape[1], dtype=torch.long)
                return self.head(self.tok(idx) + self.pos(pos))
    '''})
    placement = check(run_checks(build(root, "pos.py:Pos"), steps=2), "device-placement")
    assert placement.status == "fail" and "torch.arange at pos.py" in placement.message
    fixed = root / "pos.py"
    fixed.write_text(fixed.read_text().replace("dtype=torch.long)", "dtype=torch.long, device=idx.device)"))
    for name in [n for n in sys.modules if n == "pos"]:
        del sys.modules[name]
    assert check(run_checks(build(root, "pos.py:Pos"), steps=2), "device-placement").status == "pass"


def test_modules_in_a_plain_list_are_named():
    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(16, 16) for _ in range(2)]
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    from tests.test_runner_checks import classification_subject

    report = run_checks(classification_subject(Listed(), (16,), 4), steps=2)
    registration = check(report, "module-registration")
    assert registration.status == "fail" and "`self.blocks` are not registered" in registration.message


def test_a_check_crashing_in_torch_called_by_the_runner_is_an_error_not_a_failure():
    from tests.test_runner_checks import classification_subject

    subject = classification_subject(nn.Sequential(nn.Linear(20, 10)), (20,), 10)
    subject.loss_fn = torch.nn.functional.cross_entropy
    real_batch = subject.make_batch
    subject.make_batch = lambda b, s: real_batch(b, s).__class__(**{**real_batch(b, s).__dict__,
                                                                      "target": torch.zeros(b, 3)})
    report = run_checks(subject, steps=2)
    gradients = check(report, "gradients")
    assert gradients.status == "error" and "runner error" in gradients.message
    assert report.status == "passed"


class OneKeyAttention(nn.Module):
    """Attention over a window of one position (a last stage whose global window is 1): the softmax is the constant
    1, so the position-bias layer gets an exactly zero gradient; the same model with a dead gate fails."""

    def __init__(self, dead_gate: bool = False):
        super().__init__()
        self.embed = nn.Linear(20, 16)
        self.position_bias = nn.Linear(2, 1)
        self.head = nn.Linear(16, 10)
        self.gate = nn.Parameter(torch.ones(16)) if dead_gate else None

    def forward(self, x):
        tokens = self.embed(x).unsqueeze(1)  # [B, 1, 16]: one position
        similarity = tokens @ tokens.transpose(1, 2) + self.position_bias(torch.ones(1, 2))
        attended = (similarity.softmax(dim=-1) @ tokens).squeeze(1)
        if self.gate is not None:
            attended = attended + 0.0 * self.gate
        return self.head(attended)


def test_a_softmax_over_one_position_is_a_warning_and_other_dead_parameters_still_fail():
    from tests.test_runner_checks import classification_subject

    gradients = check(run_checks(classification_subject(OneKeyAttention(), (20,), 10), steps=2), "gradients")
    assert gradients.status == "warn" and "position_bias" in gradients.message
    assert "softmax over a dimension of size 1" in gradients.message
    gradients = check(run_checks(classification_subject(OneKeyAttention(dead_gate=True), (20,), 10), steps=2),
                      "gradients")
    assert gradients.status == "fail" and "gate" in gradients.message


class OutOfMemoryOnFullBatches(nn.Module):
    """Stands for a model that only fits the sandbox's memory limit at small batches."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(20, 10)

    def forward(self, x):
        if x.shape[0] >= 8:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 7340032000 bytes. Error code 12")
        return self.fc(x)


def test_running_out_of_memory_in_a_check_is_a_runner_error_not_a_failure():
    from tests.test_runner_checks import classification_subject

    report = run_checks(classification_subject(OutOfMemoryOnFullBatches(), (20,), 10), steps=2)
    out_of_memory = [c for c in report.checks if "memory budget (smoke.memory" in c.message]
    assert out_of_memory and all(c.status == "error" for c in out_of_memory)
    assert not [c for c in report.checks if c.status == "fail"] and report.status == "passed"


def test_a_vanishing_gradient_is_a_warning_and_a_healthy_mlp_is_not():
    from tests.test_runner_checks import classification_subject

    healthy = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
    assert check(run_checks(classification_subject(healthy, (20,), 10), steps=2), "gradient-health").status == "pass"
    layers = []
    for _ in range(12):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    vanishing = nn.Sequential(nn.Linear(20, 32), nn.Sigmoid(), *layers, nn.Linear(32, 10))
    health = check(run_checks(classification_subject(vanishing, (20,), 10), steps=2), "gradient-health")
    assert health.status == "warn" and "vanishing" in health.message


def _gradient_health(model: nn.Module, features: int = 20):
    from tests.test_runner_checks import classification_subject

    return check(run_checks(classification_subject(model, (features,), 10), steps=2), "gradient-health")


class ShrunkFeaturesBigHead(nn.Module):
    """Features scaled down by 1e-3 before a head initialized 1000x larger: the output is as usual, but the head's
    gradient is 1000x smaller than the first layer's."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(20, 32)
        self.hidden = nn.Linear(32, 32)
        self.head = nn.Linear(32, 10)
        with torch.no_grad():
            self.head.weight.mul_(1000.0)

    def forward(self, x):
        return self.head(1e-3 * torch.relu(self.hidden(torch.relu(self.first(x)))))


def test_an_exploding_gradient_is_a_warning():
    health = _gradient_health(ShrunkFeaturesBigHead())
    assert health.status == "warn" and "exploding" in health.message and "'first'" in health.message


class DeadReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.hidden = nn.Linear(32, 32)
        self.out = nn.Linear(32, 10)
        with torch.no_grad():
            self.hidden.bias[:26].fill_(-100.0)  # 26 of its 32 units start below zero: their ReLU passes nothing

    def forward(self, x):
        return self.out(torch.relu(self.hidden(torch.relu(self.fc1(x)))))


def test_dead_relus_are_a_warning_naming_the_layer():
    health = _gradient_health(DeadReLU())
    assert health.status == "warn" and "exactly zero gradient" in health.message
    assert [name for name, _ in health.details["dead"]] == ["hidden", "out"]


class ThreeLayers(nn.Module):
    def __init__(self, activation: nn.Module):
        super().__init__()
        self.first, self.activation, self.head = nn.Linear(20, 32), activation, nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.activation(self.first(x)))


def test_weights_at_a_scale_one_adam_step_cannot_move_or_would_overwrite_warn():
    huge = ThreeLayers(nn.LayerNorm(32))  # the norm keeps the output as usual, whatever the first layer's scale
    with torch.no_grad():
        huge.first.weight.normal_(0.0, 50.0)
    health = _gradient_health(huge)
    assert health.status == "warn" and "barely move" in health.message and health.message.startswith("first:")

    tiny = ThreeLayers(nn.ReLU())
    with torch.no_grad():
        tiny.first.weight.normal_(0.0, 1e-6)
    health = _gradient_health(tiny)
    assert health.status == "warn" and "overwrite" in health.message and health.message.startswith("first:")

    zero_head = ThreeLayers(nn.ReLU())
    nn.init.zeros_(zero_head.head.weight)  # zero-initialized on purpose: not judged by the update ratio
    health = _gradient_health(zero_head)
    assert health.status == "pass", health.message
    low, high = health.details["update_ratio"]
    assert 1e-3 < low <= high < 1.0


def test_layers_without_any_gradient_are_left_to_the_gradients_check():
    dead = DeadReLU()
    with torch.no_grad():
        dead.hidden.bias.fill_(-100.0)  # every unit dead: the last layers get no gradient at all
    health = _gradient_health(dead)
    assert health.status == "skip" and "see gradients" in health.message  # not "exploding", not "dead ReLUs"


def test_a_missing_package_is_decided_before_import_torch(tmp_path):
    from gpu_runner.child import missing_import

    root = write_tree(tmp_path, {"m.py": "import os\nimport torch\nimport a_package_nobody_has.sub\n"
                                    "SETTINGS = a_package_nobody_has.sub.configure()\n"
                                    "try:\n    import another_missing_one\nexcept ImportError:\n    pass\n",
                            "ok.py": "import torch\nfrom helpers import thing\n", "helpers.py": "thing = 1\n"})
    assert missing_import(root, "m.py:Net") == ("m.py", "a_package_nobody_has")
    assert missing_import(root, "ok.py:Net") is None


def test_one_child_for_all_targets_a_crash_costs_only_its_target(tmp_path):
    from gpu_runner.runner import TargetRequest, run_targets
    from gpu_runner.sandbox import SandboxLimits

    root = write_tree(tmp_path, {
        "a.py": "import torch.nn as nn\nclass A(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.fc = nn.Linear(16, 4)\n    def forward(self, x):\n        return self.fc(x)\n",
        "crash.py": "import os\nos._exit(3)\n",
        "missing.py": "import a_package_nobody_has\nHOOKS = a_package_nobody_has.setup()\n",
        # an exception no per-target handler takes ends the worker: the error names it and the line that raised it
        "interrupt.py": "import torch.nn as nn\nclass I(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                        "        self.fc = nn.Linear(16, 4)\n    def forward(self, x):\n        raise KeyboardInterrupt\n"})
    requests = [TargetRequest("a.py:A"), TargetRequest("crash.py:B"), TargetRequest("missing.py:C"),
                TargetRequest("interrupt.py:I"), TargetRequest("a.py:A")]
    reports, _ = run_targets(root, requests, device="cpu", steps=2, seed=0, limits=SandboxLimits(timeout_s=120),
                             sandbox=False)
    assert [r["status"] for r in reports] == ["passed", "error", "skipped", "error", "passed"]
    assert "exit status 3" in reports[1]["reason"] and "a_package_nobody_has" in reports[2]["reason"]
    assert reports[3]["reason"].startswith("the smoke child ended with KeyboardInterrupt (at interrupt.py:7, the "
                                           "repository's code)"), reports[3]["reason"]
    assert [r["target"] for r in reports] == [r.target for r in requests]
    assert reports[0]["seconds"] > 0 and "seconds" not in reports[2]["measures"]


def test_arguments_defaulting_to_none_are_guessed_when_the_constructor_asks(tmp_path):
    root = write_tree(tmp_path, {"t2t.py": '''
        import torch.nn as nn

        class T2T(nn.Module):
            def __init__(self, *, num_classes, dim, depth=None, heads=None):
                super().__init__()
                assert depth is not None and heads is not None, 'depth and heads must be supplied'
                self.body = nn.Sequential(*[nn.Linear(dim if i else 16, dim) for i in range(depth)])
                self.head = nn.Linear(dim, num_classes)

            def forward(self, x):
                return self.head(self.body(x))
    '''})
    subject = build(root, "t2t.py:T2T")
    assert len(subject.model.body) == 2
    assert any("default to None" in note for note in subject.notes)


def test_an_image_the_network_reduces_to_nothing_is_grown(tmp_path):
    root = write_tree(tmp_path, {"deep.py": '''
        import torch.nn as nn

        class Deep(nn.Module):
            def __init__(self, num_classes):
                super().__init__()
                stages = [nn.Conv2d(3, 8, 3, padding=1)]
                for _ in range(6):  # 64x downsampling, then a 2x2 valid convolution
                    stages += [nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()]
                self.body = nn.Sequential(*stages)
                self.tail = nn.Conv2d(8, 8, 2)
                self.head = nn.Linear(8, num_classes)

            def forward(self, x):
                x = self.body(x)
                if x.shape[-1] < 2:  # too small for the tail: skip it (and leave it without a gradient)
                    return self.head(x.mean(dim=(2, 3)))
                return self.head(self.tail(x).mean(dim=(2, 3)))
    '''})
    subject = build(root, "deep.py:Deep")
    assert any("grown to float [B, 3, 128, 128]" in note for note in subject.notes), subject.notes


SCRIPT_IMPORTING_WHAT_THE_RUNNER_LACKS = '''
    import torch
    import torch.nn as nn
    import a_missing_plotting_pkg as plt
    from a_missing_vision_pkg import datasets, transforms
    from a_missing_vision_pkg.utils import save_image

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784, 10)

        def forward(self, x):
            return self.fc(x.flatten(1))

    def train(model):
        loader = datasets.MNIST("data", transform=transforms.ToTensor())
        plt.plot([1, 2])
        save_image(next(iter(loader))[0], "x.png")

    if __name__ == "__main__":
        plt.use("Agg")
        train(Net())
'''


def test_a_package_only_the_training_functions_use_is_replaced_by_a_stand_in(tmp_path):
    from gpu_runner.child import missing_import

    root = write_tree(tmp_path, {"main.py": SCRIPT_IMPORTING_WHAT_THE_RUNNER_LACKS})
    assert missing_import(root, "main.py:Net") is None  # not decided before import: only functions use them
    subject = build(root, "main.py:Net")
    assert any("stand-ins" in note and "a_missing_vision_pkg" in note for note in subject.notes)
    assert run_checks(subject, steps=2).status == "passed"
    assert not any(name.startswith("a_missing_") for name in sys.modules)  # only while the file is imported
    try:
        import a_missing_vision_pkg  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("the stand-in outlived the import of the target")


def test_a_missing_package_the_model_uses_is_still_a_skip_naming_it(tmp_path):
    from gpu_runner.child import missing_import

    root = write_tree(tmp_path, {
        "base.py": "import torch.nn as nn\nimport a_missing_zoo_pkg\n\n"
                   "class Net(a_missing_zoo_pkg.models.VisionTransformer):\n    pass\n",
        "calls.py": "import torch.nn as nn\nimport a_missing_zoo_pkg.models as zoo\n\n"
                    "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.backbone = zoo.resnet18()\n\n    def forward(self, x):\n        return self.backbone(x)\n",
        "uses.py": "import torch.nn as nn\nimport a_missing_zoo_pkg as zoo\n\n"
                   "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.fc = nn.Linear(8, 2)\n\n    def forward(self, x):\n        return self.fc(zoo.ops.f(x))\n",
        "script.py": "import torch.nn as nn\nimport a_missing_plotting_pkg\nBACKEND = a_missing_plotting_pkg.use('Agg')\n"})
    assert missing_import(root, "base.py:Net") == ("base.py", "a_missing_zoo_pkg")
    assert missing_import(root, "script.py:Net") == ("script.py", "a_missing_plotting_pkg")
    for target in ("base.py:Net", "calls.py:Net", "uses.py:Net", "script.py:Net"):
        result = build_subject(root, target, device="cpu")
        assert isinstance(result, Skip) and "not installed" in result.reason, (target, result)
        assert "a_missing_" in result.reason


CHANNEL_LAYER_NORM = '''
    import torch
    import torch.nn as nn

    class ChannelNorm(nn.Module):
        def __init__(self, dim, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.g = nn.Parameter(torch.ones(1, dim, 1, 1))
            self.b = nn.Parameter(torch.zeros(1, dim, 1, 1))

        def forward(self, x):
            var = torch.var(x, dim=1, unbiased=False, keepdim=True)
            mean = torch.mean(x, dim=1, keepdim=True)
            return (x - mean) / (var + self.eps).sqrt() * self.g + self.b

    class FourierFeatures(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.freqs = nn.Parameter(torch.randn(dim))

        def forward(self, t):
            return torch.sin(t.mean(dim=-1, keepdim=True) * self.freqs)

    class MnistConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.scale = nn.Parameter(torch.ones(1, 8, 1, 1))

        def forward(self, x):
            return self.conv(x) * self.scale
'''


def test_an_input_that_only_works_by_broadcasting_against_a_parameter_is_rejected(tmp_path):
    root = write_tree(tmp_path, {"norm.py": CHANNEL_LAYER_NORM})
    norm = build(root, "norm.py:ChannelNorm")
    dim = norm.model.g.shape[1]
    assert norm.make_batch(2, 0).args[0].shape[1] == dim  # channels = dim, not a 1-channel image broadcast to dim
    assert any(note.startswith("rejected the input") and "broadcasts" in note for note in norm.notes)
    assert run_checks(norm, steps=STEPS).status == "passed"
    # an input the model is written to broadcast is kept when nothing else works
    fourier = build(root, "norm.py:FourierFeatures")
    assert any("no other input worked" in note for note in fourier.notes)
    # a 1-channel image into a convolution is not a broadcast: nothing is rejected
    conv = build(root, "norm.py:MnistConv")
    assert conv.make_batch(2, 0).args[0].shape[1] == 1 and not any("rejected" in n for n in conv.notes)


PREFIXED_AND_UNPACKED_ARGUMENTS = '''
    import torch
    import torch.nn as nn

    class TwoScaleNet(nn.Module):
        """Two patch sizes over one image: its side must be a multiple of both."""

        def __init__(self, *, image_size, num_classes, small_dim, large_dim, small_patch=12, large_patch=16,
                     large_mlp_dim=2048, large_depth=6, num_stages, stage_repeats=2):
            super().__init__()
            assert image_size % small_patch == 0 and image_size % large_patch == 0
            self.small = nn.Conv2d(3, small_dim, small_patch, stride=small_patch)
            self.large = nn.Conv2d(3, large_dim, large_patch, stride=large_patch)
            self.mlp = nn.Sequential(*[nn.Linear(large_dim, large_mlp_dim), nn.GELU(),
                                       nn.Linear(large_mlp_dim, large_dim)] * 1)
            self.large_depth, self.num_stages = large_depth, num_stages
            self.head = nn.Linear(small_dim + large_dim, num_classes)

        def forward(self, img):
            small = self.small(img).mean((2, 3))
            large = self.mlp(self.large(img).mean((2, 3)))
            return self.head(torch.cat([small, large], dim=1))

    class RectangularNet(nn.Module):
        def __init__(self, image_size, channels, num_classes):
            super().__init__()
            height, width = image_size
            first, *_, last = channels
            self.conv = nn.Conv2d(3, first, 3, padding=1)
            self.fc = nn.Linear(first, num_classes)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))
'''


def test_prefixed_names_patch_multiples_and_unpacked_sequences(tmp_path):
    root = write_tree(tmp_path, {"nets.py": PREFIXED_AND_UNPACKED_ARGUMENTS})
    two = build(root, "nets.py:TwoScaleNet")
    assert two.make_batch(2, 0).args[0].shape[-1] % 48 == 0  # a multiple of both patch sizes
    assert two.model.mlp[0].out_features == 64 and two.model.large_depth == 2  # prefixed sizes shrunk as their tails
    assert two.model.num_stages == 2
    rectangular = build(root, "nets.py:RectangularNet")
    assert any("image_size=(32, 32)" in note for note in rectangular.notes)


DECODER_AND_FLATTENED_LM = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class UpBlock(nn.Module):
        def __init__(self, in_channels, out_channels):
            super().__init__()
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.conv = nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU())

        def forward(self, x1, x2):
            x1 = self.up(x1)
            return self.conv(torch.cat([x2, x1], dim=1))

    class WordModel(nn.Module):
        def __init__(self, ntoken, ninp, nhid, nlayers):
            super().__init__()
            self.ntoken = ntoken
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnn = nn.GRU(ninp, nhid, nlayers)
            self.decoder = nn.Linear(nhid, ntoken)

        def forward(self, input, hidden):
            output, hidden = self.rnn(self.encoder(input), hidden)
            decoded = self.decoder(output).view(-1, self.ntoken)
            return F.log_softmax(decoded, dim=1), hidden
'''


def test_a_decoder_block_and_a_language_model_with_flattened_logits_and_a_state(tmp_path):
    root = write_tree(tmp_path, {"parts.py": DECODER_AND_FLATTENED_LM})
    up = build(root, "parts.py:UpBlock")
    x1, x2 = up.make_batch(2, 0).args
    assert x1.shape[1] + x2.shape[1] == up.model.conv[0].in_channels and x2.shape[-1] == 2 * x1.shape[-1]
    word = build(root, "parts.py:WordModel")
    tokens, hidden = word.make_batch(3, 0).args
    assert tokens.shape[1] == 3 and hidden.shape[1] == 3  # time-first, like the GRU
    assert word.task == "language_model" and word.output_batch_axis is None
    target = word.make_batch(3, 0).target
    assert torch.equal(target.view(tokens.shape)[:-1], tokens[1:])  # the next token of each row, rows in order
    assert run_checks(word, steps=STEPS).status == "passed"


def test_a_model_too_slow_for_the_budget_is_checked_on_smaller_batches_not_killed():
    from tests.test_runner_checks import classification_subject

    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = run_checks(classification_subject(model, (20,), 10), steps=2, budget_s=0.0)
    assert report.status == "passed" and any("checked on batches of 2" in note for note in report.notes)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the timed step left no trace
    roomy = run_checks(classification_subject(model, (20,), 10), steps=2, budget_s=3600.0)
    assert not any("checked on batches" in note for note in roomy.notes)


class CannotFit(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(20, 10)

    def forward(self, x):
        return self.fc(x) * 0.0


def test_steps_cut_to_fit_the_budget_make_a_loss_that_does_not_fall_a_warning_not_a_failure():
    from tests.test_runner_checks import classification_subject

    report = run_checks(classification_subject(CannotFit(), (20,), 10), steps=20, budget_s=0.0)
    assert any("checked on batches of 2, not 8, and 5 steps, not 20" in note for note in report.notes)
    overfit = check(report, "overfit-batch")
    assert overfit.status == "warn" and "too few to judge" in overfit.message
    assert check(report, "gradients").status == "fail"  # the other checks still judge it
    full = run_checks(classification_subject(CannotFit(), (20,), 10), steps=20)
    assert check(full, "overfit-batch").status == "fail"


def test_torch_threads_are_the_allowed_cores_the_machine_leaves_free(monkeypatch):
    import os

    from gpu_runner import child

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.5, 0.5))
    assert child.torch_threads(None) == 4 and child.torch_threads(2) == 2 and child.torch_threads(16) == 4
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 5.0, 4.0))  # other processes hold every core
    assert child.torch_threads(None) == 1 and child.torch_threads(3) == 3  # the job's own setting still holds
    monkeypatch.setattr(os, "getloadavg", lambda: (2.1, 2.0, 2.0))  # two busy cores...
    assert child.torch_threads(None) == 2
    assert child.torch_threads(None, own=2) == 4  # ...that were this worker's own threads

    def no_load_average():
        raise OSError("no /proc/loadavg")

    monkeypatch.setattr(os, "getloadavg", no_load_average)
    assert child.torch_threads(None) == 4
