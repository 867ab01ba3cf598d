"""gpu_runner.parents and build._build_inside_parent: a class the runner cannot build alone, built the way another
class of the repository builds it, and fed what that class's forward feeds it."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import parents  # noqa: E402
from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

# A widening residual unit whose widths mean nothing to the guess table: only the trunk's staging helper, handed
# the class as a value, knows them (the output width is the middle width times the class's growth factor).
WIDENING = """\
    import torch
    from torch import nn


    class Widening(nn.Module):
        grow = 4

        def __init__(self, a_in, b_mid, step=1):
            super().__init__()
            self.squeeze = nn.Conv2d(a_in, b_mid, 1)
            self.spread = nn.Conv2d(b_mid, b_mid * self.grow, 3, step, padding=1)
            self.skip = nn.Conv2d(a_in, b_mid * self.grow, 1, step)

        def forward(self, x):
            return torch.relu(self.spread(torch.relu(self.squeeze(x))) + self.skip(x))
    """
TRUNK = """\

    class Trunk(nn.Module):
        def __init__(self, classes=10):
            super().__init__()
            self.width = 16
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.first = self._stage(Widening, 8, 2)
            self.second = self._stage(Widening, 16, 1, step=2)
            self.head = nn.Linear(16 * Widening.grow, classes)

        def _stage(self, unit, b_mid, count, step=1):
            units = []
            for i in range(count):
                units.append(unit(self.width, b_mid, step if i == 0 else 1))
                self.width = b_mid * unit.grow
            return nn.Sequential(*units)

        def forward(self, images):
            h = self.second(self.first(self.stem(images)))
            return self.head(h.mean(dim=(2, 3)))
    """

# An attention mixer that needs a key mask only its parent makes from the token ids.
MIXER = """\
    import torch
    from torch import nn


    class Mixer(nn.Module):
        def __init__(self, qw, ng):
            super().__init__()
            self.ng = ng
            self.qkv = nn.Linear(qw, 3 * qw)
            self.out = nn.Linear(qw, qw)

        def forward(self, x, keep):
            b, t, c = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.ng, c // self.ng).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-1, -2)) / (c // self.ng) ** 0.5
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
            mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
            return x + self.out(mixed)
    """
TOWER = """\
    from torch import nn
    from blocks.mixing import Mixer


    class Tower(nn.Module):
        def __init__(self, vocab_size=50, d_model=32):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d_model)
            self.mix = Mixer(d_model, 4)
            self.head = nn.Linear(d_model, vocab_size)

        def forward(self, tokens):
            keep = tokens != 0
            keep[:, 0] = True
            return self.head(self.mix(self.embed(tokens), keep))
    """


def _build(root, target):
    return build_subject(root, target, device="cpu")


def test_alone_neither_block_builds(tmp_path):
    """Without their parents, guessing cannot build the two blocks: the tests below prove the parents."""
    root = write_tree(tmp_path, {"net.py": WIDENING, "blocks/__init__.py": "", "blocks/mixing.py": MIXER})
    for target, argument in (("net.py:Widening", "a_in"), ("blocks/mixing.py:Mixer", "qw")):
        skipped = _build(root, target)
        assert isinstance(skipped, Skip), skipped
        assert skipped.reason == (f"cannot guess constructor argument '{argument}' of {target}; configure "
                                  "smoke.targets with a factory"), skipped.reason


def test_builders_are_classes_that_call_the_class_or_hand_it_on(tmp_path):
    root = write_tree(tmp_path, {"net.py": WIDENING + TRUNK, "blocks/__init__.py": "", "blocks/mixing.py": MIXER,
                                 "tower.py": TOWER})
    assert parents.builders(root, "net.py", "Widening") == [("net.py", "Trunk")]
    assert parents.builders(root, "blocks/mixing.py", "Mixer") == [("tower.py", "Tower")]
    assert parents.builders(root, "tower.py", "Tower") == []


def test_a_residual_unit_takes_the_widths_its_trunk_expands_to(tmp_path):
    subject = _build(write_tree(tmp_path, {"net.py": WIDENING + TRUNK}), "net.py:Widening")
    assert isinstance(subject, Subject), subject
    unit = subject.model
    assert type(unit).__name__ == "Widening"
    assert (unit.squeeze.in_channels, unit.squeeze.out_channels, unit.spread.out_channels) == (16, 8, 32)
    assert any(n.startswith("built inside Trunk (net.py) as the repository builds it: Widening(a_in=16, b_mid=8, "
                            "step=1)") for n in subject.notes), subject.notes
    assert any(n == "input from what net.py:Trunk feeds it: float [B, 16, 32, 32]" for n in subject.notes), \
        subject.notes
    batch = subject.make_batch(3, 0)
    assert [tuple(a.shape) for a in batch.args] == [(3, 16, 32, 32)]


def test_an_attention_block_takes_the_mask_only_its_parent_passes(tmp_path):
    root = write_tree(tmp_path, {"blocks/__init__.py": "", "blocks/mixing.py": MIXER, "tower.py": TOWER})
    subject = _build(root, "blocks/mixing.py:Mixer")
    assert isinstance(subject, Subject), subject
    assert (subject.model.qkv.in_features, subject.model.ng) == (32, 4)
    assert any(n.startswith("built inside Tower (tower.py) as the repository builds it: Mixer(qw=32, ng=4)")
               for n in subject.notes), subject.notes
    batch = subject.make_batch(3, 0)
    assert [(tuple(a.shape), a.dtype) for a in batch.args] == [((3, 16, 32), torch.float32), ((3, 16), torch.bool)]


def test_without_a_parent_the_skip_reason_is_unchanged(tmp_path):
    """A parent that only names the class in a comment or a string, or subclasses it, does not build it."""
    root = write_tree(tmp_path, {"net.py": WIDENING + """
    class Wider(Widening):
        \"\"\"Not a builder of Widening: a subclass.\"\"\"
        grow = 8
    """})
    skipped = _build(root, "net.py:Widening")
    assert isinstance(skipped, Skip), skipped
    assert skipped.reason == ("cannot guess constructor argument 'a_in' of net.py:Widening; configure smoke.targets "
                              "with a factory"), skipped.reason


def test_a_captured_input_is_used_only_where_it_follows_the_batch():
    """What a parent feeds at batch 4 and at batch 2: an input whose one moving axis follows the batch is described
    on that axis (a sequence-first [T, B, C] too); a number, a tensor that moves on two axes, or a shared tensor
    whose first axis is a size the checks' batches take is no input plan (a shared [T, T] bias is: below)."""
    from gpu_runner.build import _plan_from_two_calls

    class Block(torch.nn.Module):
        def forward(self, x, mask=None):
            return x

    block = Block()
    plan = _plan_from_two_calls(block, ((torch.zeros(7, 4, 5),), {"mask": None}), ((torch.zeros(7, 2, 5),),
                                                                                    {"mask": None}))
    assert plan.describe() == "float [7, B, 5]" and plan.args[0].batch_axis == 1
    table = torch.zeros(8, 7)
    for first, second, why in (
            ((torch.zeros(4, 7), table), (torch.zeros(2, 7), table), "argument 2 [8, 7] stays the same with the "
                                                                      "batch, its first axis a batch size"),
            ((torch.ones(7), torch.ones(7)), (torch.ones(7), torch.ones(7)), "none of its tensors follows the batch"),
            ((torch.zeros(4, 7), 3), (torch.zeros(2, 7), 3), "argument 2 is a int"),
            ((torch.zeros(4, 4),), (torch.zeros(2, 2),), "argument 1 [4, 4] does not follow the batch")):
        reason = _plan_from_two_calls(block, (first, {}), (second, {}))
        assert isinstance(reason, str) and reason.startswith(why), reason


def test_a_block_built_alone_without_an_input_takes_the_one_its_parent_feeds(tmp_path):
    """The defaults build the pooler, but no inferred input matches its grid of positions (a feature map of
    grid x grid cells); the backbone that holds it feeds it one."""
    pooler = """\
        import torch
        from torch import nn


        class Pooler(nn.Module):
            def __init__(self, grid=5, width=24):
                super().__init__()
                self.place = nn.Parameter(torch.randn(grid * grid, width))
                self.read = nn.Linear(width, width)

            def forward(self, fmap):
                return self.read((fmap.flatten(2).transpose(1, 2) + self.place).mean(dim=1))
        """
    backbone = """\

        class Backbone(nn.Module):
            def __init__(self, channels=3, width=24):
                super().__init__()
                self.stem = nn.Conv2d(channels, width, 4, stride=4)
                self.pool = Pooler(5, width)

            def forward(self, images):
                return self.pool(self.stem(images[:, :, :20, :20]))
        """
    alone = _build(write_tree(tmp_path / "alone", {"net.py": pooler}), "net.py:Pooler")
    assert isinstance(alone, Skip) and alone.reason.startswith("could not infer an input for net.py:Pooler"), alone
    subject = _build(write_tree(tmp_path / "held", {"net.py": pooler + backbone}), "net.py:Pooler")
    assert isinstance(subject, Subject), subject
    assert "input from what net.py:Backbone feeds it: float [B, 24, 5, 5]" in subject.notes, subject.notes
    assert [tuple(a.shape) for a in subject.make_batch(2, 0).args] == [(2, 24, 5, 5)]



# A parent whose constructor reads a command line that needs an option nobody gives it: argparse ends the process
# (SystemExit, not an Exception). That parent does not help; the block is then skipped as without a parent, and the
# worker that builds it goes on to its next target.
EXITING_TOWER = """\
    import argparse

    from torch import nn
    from blocks.mixing import Mixer


    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            parser = argparse.ArgumentParser()
            parser.add_argument("--run_dir", required=True)
            parser.add_argument("--d_model", type=int, default=32)
            options = parser.parse_args([])
            self.mix = Mixer(options.d_model, 4)

        def forward(self, x):
            return self.mix(x, x[..., 0] > 0)
    """


def test_a_parent_whose_constructor_exits_is_a_parent_that_does_not_help(tmp_path):
    root = write_tree(tmp_path, {"blocks/__init__.py": "", "blocks/mixing.py": MIXER, "tower.py": EXITING_TOWER})
    skipped = _build(root, "blocks/mixing.py:Mixer")
    assert isinstance(skipped, Skip), skipped
    assert skipped.reason.startswith("could not infer an input for blocks/mixing.py:Mixer"), skipped.reason


def test_a_table_shared_by_the_whole_batch_is_fed_as_the_parent_made_it():
    """A [T, T] bias or a rotary table a parent hands every block is the same at both batch sizes: one tensor for
    the whole batch, fed with the values the parent gave it (not random ones: a mask's -inf must stay where it was)."""
    from gpu_runner.build import _plan_from_two_calls

    class Block(torch.nn.Module):
        def forward(self, x, bias):
            return x

    bias = torch.triu(torch.full((7, 7), float("-inf")), diagonal=1)
    plan = _plan_from_two_calls(Block(), ((torch.zeros(4, 7, 5), bias), {}), ((torch.zeros(2, 7, 5), bias), {}))
    assert plan.describe() == "float [B, 7, 5], float [7, 7] (one for the whole batch)", plan.describe()
    x, made = plan.make(3, torch.Generator().manual_seed(0), torch.float32, "cpu")[0]
    assert tuple(x.shape) == (3, 7, 5) and torch.equal(made, bias)
    assert not plan.has_token_inputs()


# A llama-style stack: the model makes rotary tables once and hands them, with the hidden states, to every block,
# whose mixer it calls through ``.forward`` (no module hook sees that call). Built alone from its defaults, the mixer
# gets no input: its second and third arguments are [T, D/2] tables no guess makes, and its block holds no input
# of its own either; the stack that builds the block feeds the mixer.
ROTARY_STACK = """\
    import torch
    from torch import nn


    class Mixer(nn.Module):
        def __init__(self, dim=32, n_heads=4):
            super().__init__()
            self.n_heads, self.head_dim = n_heads, dim // n_heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.out = nn.Linear(dim, dim)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
            q1, q2 = q[..., ::2], q[..., 1::2]
            q = torch.cat([q1 * cos[None, :, None] - q2 * sin[None, :, None],
                           q1 * sin[None, :, None] + q2 * cos[None, :, None]], dim=-1)
            att = torch.einsum("bthd,bshd->bhts", q, k).softmax(-1)
            return self.out(torch.einsum("bhts,bshd->bthd", att, v).reshape(b, t, -1))


    class Layer(nn.Module):
        def __init__(self, dim=32, n_heads=4):
            super().__init__()
            self.mixer = Mixer(dim, n_heads)
            self.norm = nn.LayerNorm(dim)

        def forward(self, x, cos, sin):
            return x + self.mixer.forward(self.norm(x), cos, sin)


    class Stack(nn.Module):
        def __init__(self, vocab=50, dim=32, n_heads=4, depth=2, longest=64):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList([Layer(dim, n_heads) for _ in range(depth)])
            angles = torch.outer(torch.arange(longest).float(), torch.arange(dim // n_heads // 2).float())
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens):
            t = tokens.shape[1]
            h = self.embed(tokens)
            for layer in self.layers:
                h = layer(h, self.cos[:t], self.sin[:t])
            return self.head(h)
    """


@pytest.mark.parametrize("target", ["Layer", "Mixer"])
def test_blocks_take_the_tables_their_stack_hands_them(tmp_path, target):
    subject = _build(write_tree(tmp_path, {"model.py": ROTARY_STACK}), f"model.py:{target}")
    assert isinstance(subject, Subject), subject
    assert any(n.startswith("input from what model.py:") and n.endswith(
        "float [B, 16, 32], float [16, 4] (one for the whole batch), float [16, 4] (one for the whole batch)")
        for n in subject.notes), subject.notes
    batch = subject.make_batch(3, 0)
    assert [tuple(a.shape) for a in batch.args] == [(3, 16, 32), (16, 4), (16, 4)]
