"""A training step that reads its batch by keys (``batch["pixels"]``, ``batch["kind"]``), unconfigured (issue 27,
item 4): the runner's batches are dicts whose keys hold what the step does with them (the model's input, the
target its loss compares with), so the step runs and is checked; a planted missing ``zero_grad()`` fails at its
line; a key the step uses otherwise, or a batch spread into the model's keywords, is a skip naming why, unless the
step makes its own loader."""
from __future__ import annotations

import ast
import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.batch_keys import KeysUnknown, keyed_batch  # noqa: E402
from gpu_runner.steps import role_of, smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import assert_zero_grad_fails_at, checks  # noqa: E402

# A leaf classifier over colour patches; its epoch reads each batch as a record of named fields.
LEAVES = '''
    import torch
    import torch.nn as nn


    class LeafNet(nn.Module):
        def __init__(self, kinds=5):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.head = nn.Linear(4, kinds)

        def forward(self, patches):
            return self.head(torch.relu(self.conv(patches)).mean((2, 3)))


    def train_one_epoch(model, loader, optimizer, criterion, device):
        model.train()
        for step, record in enumerate(loader):
            patches = record["pixels"].to(device).float()
            kinds = record["kind"].to(device)
            optimizer.zero_grad()
            scores = model(patches)
            loss = criterion(scores, kinds)
            loss.backward()
            optimizer.step()
'''

# The same model, trained one batch per call by a trainer's method.
PER_BATCH = LEAVES + '''

    class Gardener:
        def __init__(self, model, optimizer):
            self.model, self.optimizer = model, optimizer

        def train_step(self, batch):
            x, y = batch["pixels"], batch["kind"]
            self.optimizer.zero_grad()
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            return loss.item()
'''


def test_a_step_reading_its_batch_by_keys_runs_on_dict_batches(tmp_path):
    root = write_tree(tmp_path, {"leaves.py": LEAVES})
    report = smoke_step(root, "leaves.py:train_one_epoch", None, device="cpu")
    assert report["status"] == "passed", report
    assert checks(report)["zero-grad"] == "pass" and checks(report)["params-updated"] == "pass"
    keyed = next(n for n in report["notes"] if "reads its batch by keys" in n)
    assert "pixels" in keyed and "kind" in keyed


def test_a_planted_missing_zero_grad_fails_at_its_line_on_dict_batches(tmp_path):
    root = write_tree(tmp_path, {"leaves.py": LEAVES.replace("            optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "leaves.py:train_one_epoch", None, device="cpu")
    assert_zero_grad_fails_at(report, root, "leaves.py", "optimizer.step()")


def test_a_missing_backward_on_dict_batches_is_not_a_pass(tmp_path):
    root = write_tree(tmp_path, {"leaves.py": LEAVES.replace("            loss.backward()\n", "")})
    report = smoke_step(root, "leaves.py:train_one_epoch", None, device="cpu")
    assert report["status"] != "passed", report


def test_a_trainers_per_batch_step_gets_a_dict_batch_and_its_planted_bug_fails(tmp_path):
    root = write_tree(tmp_path, {"leaves.py": PER_BATCH})
    report = smoke_step(root, "leaves.py:Gardener.train_step", None, device="cpu")
    assert report["status"] == "passed", report
    planted = write_tree(tmp_path / "planted", {"leaves.py": PER_BATCH.replace(
        "            self.optimizer.zero_grad()\n", "")})
    report = smoke_step(planted, "leaves.py:Gardener.train_step", None, device="cpu")
    assert_zero_grad_fails_at(report, planted, "leaves.py", "self.optimizer.step()")


def test_a_key_used_for_something_else_is_a_skip_naming_it(tmp_path):
    source = LEAVES.replace('kinds = record["kind"].to(device)',
                            'kinds = record["kind"].to(device)[record["keep"]]')
    report = smoke_step(write_tree(tmp_path, {"leaves.py": source}), "leaves.py:train_one_epoch", None, device="cpu")
    assert report["status"] == "skipped" and "'keep'" in report["reason"], report


# The step makes its own records, with a field the runner could not fill: it runs on them as it always did.
OWN_RECORDS = LEAVES + '''

    def fit_own(model, optimizer, criterion, device):
        model.train()
        own_loader = [{"pixels": torch.rand(8, 3, 32, 32), "kind": torch.randint(0, 5, (8,)),
                       "keep": torch.ones(8, dtype=torch.bool)}] * 6
        for record in own_loader:
            optimizer.zero_grad()
            loss = criterion(model(record["pixels"])[record["keep"]], record["kind"][record["keep"]])
            loss.backward()
            optimizer.step()
'''


def test_a_step_with_its_own_records_runs_on_them_even_with_a_key_the_runner_cannot_fill(tmp_path):
    report = smoke_step(write_tree(tmp_path, {"leaves.py": OWN_RECORDS}), "leaves.py:fit_own", None, device="cpu")
    assert report["status"] == "passed", report


# A Lightning-style tagger whose training_step reads named fields and calls itself.
TAGGER = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class ToneTagger(nn.Module):
        def __init__(self, features=10, tones=3):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(features, 16), nn.GELU())
            self.head = nn.Linear(16, tones)

        def forward(self, signal):
            return self.head(self.body(signal))

        def training_step(self, batch, batch_idx):
            logits = self(batch["signal"])
            return F.cross_entropy(logits, batch["tone"])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)
'''


def test_a_lightning_style_step_reading_keys_runs_and_its_partial_optimizer_fails(tmp_path):
    report = smoke_step(write_tree(tmp_path, {"tagger.py": TAGGER}), "tagger.py:ToneTagger.training_step", None,
                        device="cpu")
    assert report["status"] == "passed", report
    assert any("training_step reads its batch by keys" in n for n in report["notes"])
    planted = TAGGER.replace("torch.optim.Adam(self.parameters(), lr=1e-3)",
                             "torch.optim.Adam(self.head.parameters(), lr=1e-3)")
    report = smoke_step(write_tree(tmp_path / "planted", {"tagger.py": planted}), "tagger.py:ToneTagger.training_step",
                        None, device="cpu")
    assert report["status"] == "failed" and checks(report)["optimizer-coverage"] == "fail", report


def step_node(source: str) -> ast.AST:
    return ast.parse(textwrap.dedent(source)).body[0]


def test_keys_are_the_inputs_and_target_by_what_the_step_does_with_them():
    batch = (torch.zeros(2, 3), torch.ones(2, 4), torch.tensor([1, 0]))
    node = step_node('''
        def step(net, batch, loss_fn):
            left = batch["left"].cuda()
            out = net(left, batch["right"])
            return loss_fn(out, batch["label"].long())
    ''')
    keyed = keyed_batch(node, batch, role_of)
    assert set(keyed) == {"left", "right", "label"}
    assert keyed["left"] is batch[0] and keyed["right"] is batch[1] and keyed["label"] is batch[2]
    assert keyed_batch(step_node("def step(model, batch):\n    return model(*batch)\n"), batch, role_of) is None


def test_a_batch_spread_into_the_models_keywords_is_not_guessed():
    node = step_node('''
        def step(model, batch):
            labels = batch["labels"]
            return model(**batch).loss
    ''')
    with pytest.raises(KeysUnknown, match=r"model\(\*\*batch\)"):
        keyed_batch(node, (torch.zeros(2, 3), torch.tensor([1, 0])), role_of)
