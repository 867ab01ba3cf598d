"""Does a training step clip its gradients: answered from what the program calls, never from words in its text; and
is a model's head one output per token it embeds (a language model), whatever its sizes are called."""
from __future__ import annotations

import pytest

from analyzers.program.clipping import ClippingFacts, clips_gradients
from analyzers.program.library import CLIPPING_OPTIONS, Does, does, method_does
from analyzers.program.modules import RepositoryIndex, summarize
from tests.test_program_model import context


@pytest.mark.parametrize("qualified", ["torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
                                       "torch.nn.utils.clip_grad.clip_grad_norm_", "timm.utils.dispatch_clip_grad"])
def test_the_table_knows_torchs_clipping_functions(qualified):
    assert does(qualified, Does.CLIPS_GRADIENTS)


def test_the_table_knows_the_libraries_clipping_methods_and_options():
    assert method_does("clip_grad_norm_", Does.CLIPS_GRADIENTS)  # accelerator / FSDP
    assert method_does("clip_gradients", Does.CLIPS_GRADIENTS)  # Fabric / LightningModule
    assert not method_does("step", Does.CLIPS_GRADIENTS)
    assert {"gradient_clip_val", "max_grad_norm", "gradient_clipping"} <= set(CLIPPING_OPTIONS)


@pytest.mark.parametrize("code", [
    "import torch\nfor b in data:\n    loss.backward()\n    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)\n",
    "from torch.nn import utils\nfor b in data:\n    loss.backward()\n    utils.clip_grad_value_(ps, 0.1)\n",
    "for b in data:\n    acc.backward(loss)\n    acc.clip_grad_norm_(net.parameters(), 2.0)\n",
    # clipping by value, by hand, in a helper of the same file
    "def bound(opt, c):\n    for g in opt.param_groups:\n        for p in g['params']:\n"
    "            p.grad.data.clamp_(-c, c)\nfor b in data:\n    loss.backward()\n    bound(opt, 5.)\n    opt.step()\n",
    # clipping by norm, by hand: the gradients rescaled in place
    "def rescale(ps, c, n):\n    for p in ps:\n        p.grad.data *= c / n\nfor b in data:\n    loss.backward()\n"
    "    rescale(net.parameters(), 1.0, 3.0)\n    opt.step()\n",
    "def rescale(ps, c, n):\n    for p in ps:\n        p.grad.mul_(c / n)\nfor b in data:\n    loss.backward()\n"
    "    rescale(net.parameters(), 1.0, 3.0)\n    opt.step()\n",
    # a method of the file's trainer class that clips, called on self
    "import torch\nclass T:\n    def clip(self):\n        torch.nn.utils.clip_grad_norm_(self.m.parameters(), 1)\n"
    "    def fit(self):\n        for b in data:\n            self.loss.backward()\n            self.clip()\n",
])
def test_a_call_that_clips_clips_every_step(code):
    ctx = context(code)
    assert ctx.facts(ClippingFacts).clips
    assert clips_gradients(ctx, own_optimizer_step=True)


@pytest.mark.parametrize("code", [
    # the words are there, the call is not
    "import argparse\np = argparse.ArgumentParser()\np.add_argument('--grad_clip', type=float)\n"
    "# TODO: clip_grad_norm_\nfor b in data:\n    loss.backward()\n    opt.step()\n",
    # clamping the loss or the activations is no gradient clipping
    "for b in data:\n    loss.clamp_(0, 10)\n    x.data.clamp_(-1, 1)\n    loss.backward()\n    opt.step()\n",
])
def test_text_that_mentions_clipping_does_not_clip(code):
    ctx = context(code)
    assert not clips_gradients(ctx, own_optimizer_step=True)


def test_a_library_option_clips_the_librarys_steps_not_the_users_optimizer_step():
    ctx = context("""
        config = {'train_batch_size': 8, 'gradient_clipping': 0.5}
        engine = make_engine(model, config)
        for b in data:
            if use_engine:
                engine.backward(loss)
                engine.step()
            else:
                loss.backward()
                opt.step()
    """)
    assert ctx.facts(ClippingFacts).options
    assert clips_gradients(ctx, own_optimizer_step=False)
    assert not clips_gradients(ctx, own_optimizer_step=True)


@pytest.mark.parametrize("option", ["gradient_clip_val=None", "gradient_clip_val=0", "max_grad_norm=0.0"])
def test_an_option_turned_off_does_not_clip(option):
    ctx = context(f"trainer = Trainer({option})\nfor b in data:\n    loss.backward()\n")
    assert not clips_gradients(ctx, own_optimizer_step=False)


def test_a_clipping_function_of_the_repository_is_followed_through_the_import(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "helpers.py").write_text(
        "def clip_all(optimizer, limit):\n    for group in optimizer.param_groups:\n"
        "        for p in group['params']:\n            if p.grad is not None:\n"
        "                p.grad.clamp_(-limit, limit)\n"
        "def keep_going(optimizer, limit):\n    clip_all(optimizer, limit)\n"
        "def log(x):\n    print(x)\n")
    script = tmp_path / "train.py"
    code = ("from helpers import {name}\nfor b in data:\n    loss.backward()\n    {name}(opt, 5.0)\n"
            "    opt.step()\n")
    index = RepositoryIndex(tmp_path)
    for name, clipped in (("clip_all", True), ("keep_going", True), ("log", False)):
        script.write_text(code.format(name=name))
        ctx = context(code.format(name=name), str(script), repository=index)
        assert clips_gradients(ctx, own_optimizer_step=True) is clipped, name


@pytest.mark.parametrize("init,predicts", [
    # the head's size is the embedding's row count, or a count computed from the embeddings' row counts
    ("self.emb = nn.Embedding(n_words, 64)\n        self.out = nn.Linear(64, n_words)", True),
    ("a = n_text + 1\n        self.t = nn.Embedding(a, 8)\n        self.i = nn.Embedding(n_image, 8)\n"
     "        total = a + n_image\n        self.total = total\n        self.head = nn.Sequential(nn.LayerNorm(8), "
     "nn.Linear(8, self.total))", True),
    # an embedding of one thing and a head over another
    ("self.emb = nn.Embedding(n_users, 16)\n        self.out = nn.Linear(16, n_classes)", False),
    ("self.out = nn.Linear(16, n_outputs)", False),
])
def test_a_head_with_one_output_per_embedded_token(init, predicts):
    code = f"import torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n" \
           f"        {init}\n"
    features = summarize(code, "m.py").classes["M"].features
    assert ("vocab-output" in features) is predicts


def test_a_helper_nothing_resolves_that_is_handed_the_trained_model_may_clip_it():
    """``helpers`` sits beside the script on ``sys.path`` at run time: no index finds it. Handed what the optimizer
    trains, it may clip: unknown, so the step is not said to lack clipping. Handed something else, it says nothing."""
    step = """
        import torch
        import helpers
        net = torch.nn.LSTM(8, 8)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for batch in data:
            loss = net(batch)[0].sum()
            loss.backward()
            helpers.{call}
            optimizer.step()
    """
    for call, clips in (("bound_gradients(net, 5.0)", True), ("rescale(net.parameters(), 5.0)", True),
                        ("log_progress(loss)", False)):
        assert clips_gradients(context(step.format(call=call)), own_optimizer_step=True) is clips, call
    # handed the model while the run is set up, outside the loop that trains: not where a step clips
    set_up = step.replace("        for batch in data:", "        helpers.distribute(model=net)\n        for batch in data:")
    set_up = set_up.format(call="log_progress(loss)")
    assert not clips_gradients(context(set_up), own_optimizer_step=True)
    # handed the model after the step, to measure it: not where clipping goes
    measured = step.replace("            optimizer.step()\n", "            optimizer.step()\n            helpers.accuracy(net)\n")
    assert not clips_gradients(context(measured.format(call="log_progress(loss)")), own_optimizer_step=True)
