"""gpu_runner.forward_body: inputs inferred from how ``forward`` uses each parameter (widths through layers and
concatenations, square matrices multiplying node features, ids into an embedding, lengths for packing)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import write_tree  # noqa: E402

MODELS = """\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class ValueHead(nn.Module):  # a critic: the action joins the state's features after the first layer
        def __init__(self, observation=17, action=6):
            super().__init__()
            self.first = nn.Linear(observation, 40)
            self.second = nn.Linear(40 + action, 30)
            self.last = nn.Linear(30, 1)

        def forward(self, obs, act):
            hidden = F.relu(self.first(obs))
            hidden = F.relu(self.second(torch.cat([hidden, act], 1)))
            return self.last(hidden)


    class Conditioned(nn.Module):  # features and a one-hot condition concatenated into one layer
        def __init__(self, features=24, n_conditions=5):
            super().__init__()
            self.mix = nn.Linear(features + n_conditions, 16)
            self.head = nn.Linear(16, 3)

        def forward(self, x, cond):
            joined = torch.cat([x, cond], dim=1)
            return self.head(torch.tanh(self.mix(joined)))


    class NodeMixer(nn.Module):  # a graph layer: node features times a weight, mixed by the adjacency
        def __init__(self, n_in=12, n_out=7):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)
            self.head = nn.Linear(n_out, 3)

        def forward(self, feats, neighbours):
            support = torch.mm(feats, self.weight)
            return self.head(torch.spmm(neighbours, support))


    class Packed(nn.Module):  # token ids and their lengths, packed for a GRU
        def __init__(self, vocab=50, width=8):
            super().__init__()
            self.table = nn.Embedding(vocab, width)
            self.rnn = nn.GRU(width, width, batch_first=True)
            self.out = nn.Linear(width, 4)

        def forward(self, seq, seq_len):
            packed = nn.utils.rnn.pack_padded_sequence(self.table(seq), seq_len, batch_first=True)
            _, last = self.rnn(packed)
            return self.out(last[-1])


    class Demanding(nn.Module):  # rejects every input the runner can make: its own check fails
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(8, 4)
            self.second = nn.Linear(4 + 3, 2)

        def forward(self, x, extra):
            assert extra.shape[-1] > 98, "extra must be 99 wide"  # not an equality: no size the reader takes
            return self.second(torch.cat([self.first(x), extra], 1))
    """


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("inputs"), {"models.py": MODELS})


def _shapes(subject, batch: int = 3) -> list[tuple]:
    return [tuple(t.shape) for t in subject.make_batch(batch, 0).args]


def test_a_concatenated_input_is_as_wide_as_the_layer_leaves_room_for(root):
    subject = build_subject(root, "models.py:ValueHead", device="cpu")
    assert isinstance(subject, Subject), subject
    assert _shapes(subject) == [(3, 17), (3, 6)]
    assert any("after 40 computed features" in note for note in subject.notes)


def test_two_inputs_concatenated_into_one_layer_split_it_by_the_constructor_sizes(root):
    subject = build_subject(root, "models.py:Conditioned", device="cpu")
    assert isinstance(subject, Subject), subject
    assert _shapes(subject) == [(3, 24), (3, 5)]


def test_a_matrix_multiplying_node_features_is_a_square_adjacency(root):
    subject = build_subject(root, "models.py:NodeMixer", device="cpu")
    assert isinstance(subject, Subject), subject
    features, adjacency = subject.make_batch(5, 0).args
    assert features.shape == (5, 12) and adjacency.shape == (5, 5)


def test_ids_and_pack_padded_lengths(root):
    subject = build_subject(root, "models.py:Packed", device="cpu")
    assert isinstance(subject, Subject), subject
    ids, lengths = subject.make_batch(4, 0).args
    assert ids.dtype == torch.long and int(ids.max()) < 50 and ids.shape[0] == 4
    assert lengths.device.type == "cpu" and lengths.dtype == torch.long and lengths.shape == (4,)
    assert lengths.tolist() == sorted(lengths.tolist(), reverse=True) and int(lengths[0]) == ids.shape[1]
    assert int(lengths.min()) >= 1


def test_a_forward_that_rejects_every_input_still_skips_with_its_own_error(root):
    skipped = build_subject(root, "models.py:Demanding", device="cpu")
    assert isinstance(skipped, Skip)
    assert "could not infer an input" in skipped.reason and "extra must be 99 wide" in skipped.reason


STEPS = """\
    import torch
    from torch import nn


    class TimeConditioned(nn.Module):  # an image and one time value per sample, flattened before its layer
        def __init__(self, channels=3, width=8):
            super().__init__()
            self.conv = nn.Conv2d(channels, width, 3, padding=1)
            self.time = nn.Linear(1, width)

        def forward(self, x, t):
            return self.conv(x) + self.time(t.view(-1, 1)).view(-1, 8, 1, 1)


    class Scored(nn.Module):  # the concatenation happens in a helper method of the class
        def __init__(self, a=6, b=4):
            super().__init__()
            self.attn = nn.Linear(a + b, 1)

        def score(self, left, right):
            return self.attn(torch.cat([left, right], 1))

        def forward(self, query, keys):
            return self.score(query, keys)
    """


def test_a_flattened_input_and_a_helper_method_are_read_too(tmp_path):
    root = write_tree(tmp_path, {"steps.py": STEPS})
    conditioned = build_subject(root, "steps.py:TimeConditioned", device="cpu")
    assert isinstance(conditioned, Subject), conditioned
    assert _shapes(conditioned) == [(3, 3, 32, 32), (3, 1)]
    scored = build_subject(root, "steps.py:Scored", device="cpu")
    assert isinstance(scored, Subject), scored
    assert _shapes(scored) == [(3, 6), (3, 4)]


STACK = """\
    from torch import nn

    LAYOUTS = {"small": [8, "M", 16, "M"]}


    class Stack(nn.Module):  # its layers are built outside and handed in
        def __init__(self, features, num_class=10):
            super().__init__()
            self.features = features
            self.head = nn.Linear(16 * 8 * 8, num_class)

        def forward(self, x):
            return self.head(self.features(x).flatten(1))


    def stack_layers(layout):
        layers, channels = [], 3
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU()]
                channels = item
        return nn.Sequential(*layers)
    """


def test_an_argument_the_forward_calls_is_never_a_guessed_size(tmp_path):
    with_factory = write_tree(tmp_path / "a", {"stack.py": STACK + """\

    def small_stack():
        return Stack(stack_layers(LAYOUTS["small"]))
    """})
    subject = build_subject(with_factory, "stack.py:Stack", device="cpu")
    assert isinstance(subject, Subject), subject
    assert any("small_stack()" in note for note in subject.notes) and _shapes(subject) == [(3, 3, 32, 32)]
    other_class = STACK + """\

    class Other(nn.Module):  # a module class of the file: not what `features` is (an instance, built outside)
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 2)

        def forward(self, x):
            return self.layer(x)
    """
    without = build_subject(write_tree(tmp_path / "b", {"stack.py": other_class}), "stack.py:Stack", device="cpu")
    assert isinstance(without, Skip) and "cannot guess constructor argument 'features'" in without.reason


HEADS = """\
    import torch
    from torch import nn


    class Head(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)

        def forward(self, nodes, links):
            return torch.relu(torch.mm(links, nodes @ self.weight))


    class MultiHead(nn.Module):  # heads kept in a plain list, each registered, called in a comprehension
        def __init__(self, n_in=10, n_out=4, heads=2):
            super().__init__()
            self.heads = [Head(n_in, n_out) for _ in range(heads)]
            for i, head in enumerate(self.heads):
                self.add_module(f"head_{i}", head)

        def forward(self, feats, links):
            return torch.cat([head(feats, links) for head in self.heads], dim=1)
    """


def test_heads_called_in_a_comprehension_are_read_like_the_first_head(tmp_path):
    subject = build_subject(write_tree(tmp_path, {"heads.py": HEADS}), "heads.py:MultiHead", device="cpu")
    assert isinstance(subject, Subject), subject
    features, links = subject.make_batch(5, 0).args
    assert features.shape == (5, 10) and links.shape == (5, 5)


SIZED = """\
    import torch
    from torch import nn


    class Patches(nn.Module):  # only images of the side it was built for: its forward asserts it
        def __init__(self, side=40, patch=8):
            super().__init__()
            self.side = side
            self.cut = nn.Conv2d(3, 12, patch, stride=patch)

        def forward(self, images):
            batch, channels, height, width = images.shape
            assert height == self.side and width == self.side, "wrong image size"
            return self.cut(images).flatten(2).transpose(1, 2)


    class Squares(nn.Module):
        def __init__(self, edge=20):
            super().__init__()
            self.edge = edge
            self.conv = nn.Conv2d(2, 4, 3, padding=1)

        def forward(self, x):
            assert x.shape[2] == x.size(-1) == self.edge
            return self.conv(x)
    """


def test_sizes_an_assert_in_the_forward_requires_are_the_inputs_sizes(tmp_path):
    # neither 40 nor 20 is a side the guesses try; the asserts in the forward say them
    root = write_tree(tmp_path, {"sized.py": SIZED})
    patches = build_subject(root, "sized.py:Patches", device="cpu")
    assert isinstance(patches, Subject), patches
    assert _shapes(patches) == [(3, 3, 40, 40)]
    squares = build_subject(root, "sized.py:Squares", device="cpu")
    assert isinstance(squares, Subject), squares
    assert _shapes(squares) == [(3, 2, 20, 20)]


HELPERS = """\
    import math

    import torch
    from torch import nn

    import features


    def phase_code(steps, width):  # a helper of the repository: one scalar per sample in, `width` features out
        assert steps.dim() == 1, "one step per sample"
        scale = torch.exp(torch.arange(width // 2) * -(math.log(100.0) / width))
        angle = steps.float()[:, None] * scale[None, :]
        return torch.cat([angle.sin(), angle.cos()], dim=1)


    class Stepped(nn.Module):  # the step reaches only a helper function, whose assert says its shape
        def __init__(self, width=12):
            super().__init__()
            self.width = width
            self.image = nn.Conv2d(3, width, 3, padding=1)
            self.step = nn.Linear(width, width)

        def forward(self, x, s):
            code = self.step(phase_code(s, self.width))
            return self.image(x) + code[:, :, None, None]


    class ThroughModule(nn.Module):  # the same through a function of another file, called as module.function
        def __init__(self):
            super().__init__()
            self.mix = nn.Linear(6, 6)

        def forward(self, level):
            return self.mix(features.ramp(level))


    class Method(nn.Module):  # and through a method of the model, whose helper asserts with len(x.shape)
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(4, 2)

        def forward(self, when):
            return self.out(self.expand(when))

        def expand(self, moments):
            return features.checked(moments).repeat(1, 4)
    """

FEATURES = """\
    import torch


    def ramp(values):
        assert len(values.shape) == 1
        return values[:, None] * torch.linspace(0, 1, 6)


    def checked(values):
        assert values.ndim == 1
        return values.float()[:, None]
    """


def test_an_assert_in_a_helper_the_forward_calls_shapes_the_input(tmp_path):
    # each second input is one value per sample ([B]); only a helper called with it says so, by its assert
    root = write_tree(tmp_path, {"helpers.py": HELPERS, "features.py": FEATURES})
    stepped = build_subject(root, "helpers.py:Stepped", device="cpu")
    assert isinstance(stepped, Subject), stepped
    assert _shapes(stepped)[1] == (3,)
    assert any("one value per sample" in note for note in stepped.notes), stepped.notes
    for target in ("helpers.py:ThroughModule", "helpers.py:Method"):
        subject = build_subject(root, target, device="cpu")
        assert isinstance(subject, Subject), (target, subject)
        assert _shapes(subject) == [(3,)], target


def test_the_reader_takes_the_rank_only_of_a_parameter_passed_unchanged():
    from torch import nn

    from gpu_runner import forward_body

    class Shifted(nn.Module):  # the helper sees x.flatten(1), not x: its assert says nothing of x
        def forward(self, x, y):
            return _one_axis(x.flatten(1)) + _one_axis(y)

    facts = forward_body.read_forward(Shifted())
    assert facts["x"].rank is None
    assert facts["y"].rank == 1


def _one_axis(values):
    assert values.dim() == 1
    return values


PAINTED = """\
    import torch
    from torch import nn


    class Painted(nn.Module):  # a label vector painted over every pixel, joined to the image as extra channels
        def __init__(self, labels=6, width=16):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3 + labels, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, 3, 3, padding=1))

        def forward(self, image, label):
            label = label.reshape(label.shape[0], label.shape[1], 1, 1)
            label = label.expand(-1, -1, image.shape[2], image.shape[3])
            return self.body(torch.cat([image, label], dim=1))
    """


def test_a_vector_spread_over_the_pixels_is_one_vector_per_sample_and_the_split_takes_the_constructors_size(tmp_path):
    # 9 input channels shared by an image and a label vector: the split uses the constructor's 6 (3 + 6), and the
    # label stays a [B, 6] vector, not an image of 6 channels
    root = write_tree(tmp_path, {"painted.py": PAINTED})
    subject = build_subject(root, "painted.py:Painted", device="cpu")
    assert isinstance(subject, Subject), subject
    image, label = _shapes(subject)
    assert image[:2] == (3, 3) and label == (3, 6)
