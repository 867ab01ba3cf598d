"""A model with two outputs, each compared with a key of its own (issue 27, item 4): a step that unpacks
``topic, tags = model(words)`` and adds ``nll(topic, batch["topic"])`` to ``nll(tags.transpose(1, 2),
batch["tags"])`` reads two targets the runner's one-target batch does not hold. Each key gets class indices shaped
for the output it is compared with (the classes on dimension 1 of what is compared); the step runs and passes, and a
planted missing ``zero_grad()`` still fails. An output compared through anything the runner cannot follow stays
undecided (a skip naming the key), never a guess."""
from __future__ import annotations

import ast
import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.batch_keys import KeysUnknown, keyed_batch  # noqa: E402
from gpu_runner.steps import role_of, smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import checks, passed_notes  # noqa: E402

# A tagger that also names the topic of its sentence: one encoder, two heads.
TAGGER = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class TopicTagger(nn.Module):
        def __init__(self, vocab_size=50, topics=3, tags=7, width=16):
            super().__init__()
            self.words = nn.Embedding(vocab_size, width)
            self.topic = nn.Linear(width, topics)
            self.tags = nn.Linear(width, tags)

        def forward(self, words):
            seen = self.words(words)
            return F.log_softmax(self.topic(seen.mean(dim=1)), -1), F.log_softmax(self.tags(seen), -1)


    def train_epoch(model, loader, optimizer):
        model.train()
        for record in loader:
            topic, tags = model(record["words"])
            loss = F.nll_loss(topic, record["topic"]) + F.nll_loss(tags.transpose(1, 2), record["tags"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''


def _step(source: str) -> ast.AST:
    return ast.parse(textwrap.dedent(source)).body[0]


def test_each_output_gets_class_indices_shaped_for_its_comparison():
    step = _step('''
        def fit(model, loader, criterion):
            for record in loader:
                first, second = model(record["x"])
                criterion(first, record["a"]) + criterion(second.transpose(1, 2), record["b"])
    ''')
    batch = (torch.zeros(4, 5, dtype=torch.long), torch.zeros(4))
    outputs = (torch.zeros(4, 3), torch.zeros(4, 5, 7))
    keyed = keyed_batch(step, batch, role_of, outputs=lambda: outputs)
    assert keyed["a"].shape == (4,) and int(keyed["a"].max()) < 3
    assert keyed["b"].shape == (4, 5) and int(keyed["b"].max()) < 7 and not keyed["b"].is_floating_point()


def test_an_output_compared_through_what_the_runner_cannot_follow_stays_unknown():
    step = _step('''
        def fit(model, loader, criterion):
            for record in loader:
                first, second = model(record["x"])
                criterion(second.view(-1, 7), record["b"])
    ''')
    outputs = (torch.zeros(4, 3), torch.zeros(4, 5, 7))
    with pytest.raises(KeysUnknown, match="'b'"):
        keyed_batch(step, (torch.zeros(4, 5, dtype=torch.long), torch.zeros(4)), role_of, outputs=lambda: outputs)


def test_a_step_training_two_outputs_against_two_keys_runs_and_passes(tmp_path):
    root = write_tree(tmp_path, {"tagger.py": TAGGER})
    notes = passed_notes(smoke_step(root, "tagger.py:train_epoch", {"model": "tagger.py:TopicTagger"},
                                    device="cpu"))
    assert "reads its batch by keys (words, topic, tags)" in notes


def test_a_planted_missing_zero_grad_with_two_outputs_fails(tmp_path):
    root = write_tree(tmp_path, {"tagger.py": TAGGER.replace("            optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "tagger.py:train_epoch", {"model": "tagger.py:TopicTagger"}, device="cpu")
    assert report["status"] == "failed" and checks(report)["zero-grad"] == "fail", report
