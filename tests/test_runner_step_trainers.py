"""A trainer class that builds its own model around a backbone it is given (issue 27, item 4): its loop steps
through an optimizer wrapper under the wrapper's own name (found by the ``zero_grad()`` beside ``backward()``);
its constructor's backbone, annotated with a module class of the repository, is built as the runner builds that
model, and its sizes are guessed by name as a model's are, so they agree; its loop reads each batch by keys from a
named ``enumerate`` of its loader. It runs and passes; a planted missing ``zero_grad()`` fails."""
from __future__ import annotations

import ast
import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.batch_keys import keyed_batch  # noqa: E402
from gpu_runner.steps import role_of, smoke_step  # noqa: E402
from gpu_runner.targets import find_step_targets  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import checks, passed_notes  # noqa: E402

# Reading comprehension in miniature: a word encoder, a reader that answers from it, a tutor that trains the reader.
READER = '''
    import torch
    import torch.nn as nn


    class WordEncoder(nn.Module):
        def __init__(self, vocab_size, width=16):
            super().__init__()
            self.width = width
            self.words = nn.Embedding(vocab_size, width)

        def forward(self, tokens):
            return self.words(tokens).mean(dim=1)


    class Reader(nn.Module):
        def __init__(self, encoder, answers):
            super().__init__()
            self.encoder = encoder
            self.answer = nn.Linear(encoder.width, answers)

        def forward(self, tokens):
            return self.answer(self.encoder(tokens))
'''

TUTOR = '''
    import torch
    import torch.nn as nn
    from reader import Reader, WordEncoder


    class Pacer:
        """Steps its optimizer and keeps count, under a name of its own."""

        def __init__(self, optimizer):
            self.optimizer, self.count = optimizer, 0

        def zero_grad(self):
            self.optimizer.zero_grad()

        def step_and_count(self):
            self.optimizer.step()
            self.count += 1


    class Tutor:
        def __init__(self, encoder: WordEncoder, vocab_size: int, data_loader, lr: float = 1e-2):
            self.model = Reader(encoder, vocab_size)
            self.pacer = Pacer(torch.optim.Adam(self.model.parameters(), lr=lr))
            self.data_loader = data_loader
            self.criterion = nn.CrossEntropyLoss()

        def lesson(self, epoch, data_loader):
            self.model.train()
            numbered = enumerate(data_loader)
            for i, data in numbered:
                guess = self.model(data["tokens"])
                loss = self.criterion(guess, data["answer"])
                self.pacer.zero_grad()
                loss.backward()
                self.pacer.step_and_count()
'''


def test_a_trainers_loop_through_an_optimizer_wrapper_is_found():
    found = find_step_targets({"tutor.py": textwrap.dedent(TUTOR)}, {"tutor.py": None})
    assert [t.name for t in found] == ["Tutor.lesson"]
    without = TUTOR.replace("                self.pacer.zero_grad()\n", "")
    assert find_step_targets({"tutor.py": textwrap.dedent(without)}, {"tutor.py": None}) == []


def test_a_loop_that_only_backpropagates_for_gradients_is_not_a_step():
    saliency = textwrap.dedent('''
        class Highlighter:
            def __init__(self, model):
                self.model = model

            def highlight(self, data_loader):
                maps = []
                for x, y in data_loader:
                    self.model.zero_grad()
                    x.requires_grad_(True)
                    self.model(x)[:, 0].sum().backward()
                    maps.append(x.grad.abs())
                return maps
    ''')
    assert find_step_targets({"saliency.py": saliency}, {"saliency.py": None}) == []


def test_a_trainer_given_a_repository_backbone_and_sizes_runs_and_passes(tmp_path):
    root = write_tree(tmp_path, {"reader.py": READER, "tutor.py": TUTOR})
    notes = passed_notes(smoke_step(root, "tutor.py:Tutor.lesson", None, device="cpu"))
    assert "takes a WordEncoder ('encoder')" in notes and "vocab_size=" in notes
    assert "reads its batch by keys" in notes


def test_a_planted_missing_zero_grad_in_the_trainer_fails(tmp_path):
    root = write_tree(tmp_path, {"reader.py": READER,
                                 "tutor.py": TUTOR.replace("            self.optimizer.zero_grad()\n",
                                                           "            pass\n")})
    report = smoke_step(root, "tutor.py:Tutor.lesson", None, device="cpu")
    assert report["status"] == "failed" and checks(report)["zero-grad"] == "fail", report


def test_a_batch_read_from_a_named_enumerate_of_the_loader_is_keyed():
    step = ast.parse(textwrap.dedent('''
        def epoch(model, loader, criterion):
            progress = wrap(enumerate(loader), total=3)
            for i, record in progress:
                loss = criterion(model(record["x"]), record["y"])
    ''')).body[0]
    keyed = keyed_batch(step, (torch.zeros(2, 3), torch.ones(2)), role_of)
    assert set(keyed) == {"x", "y"} and keyed["y"].tolist() == [1.0, 1.0]
