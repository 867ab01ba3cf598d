"""The table form of smoke.targets (issue 14, item 6): models that inference cannot feed (an LSTM language model
with a tuple hidden state and a time-first output; a nanoGPT-style model through its factory, trained on the loss
it computes) expressed in configuration, validated, and smoke-run green; invalid tables give their specific
``FILE:LINE: KEY: PROBLEM`` error."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analyzers.config import ConfigError, parse_config_text  # noqa: E402
from gpu_runner.build import build_subject  # noqa: E402
from gpu_runner.checks import run_checks  # noqa: E402
from gpu_runner.runner import configured_requests  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

STEPS = 20

LSTM_LM = '''
    import torch.nn as nn


    class RNNModel(nn.Module):
        """pytorch/examples' word language model: time-first tokens, an (h, c) hidden state in and out."""

        def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.2):
            super().__init__()
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
            self.decoder = nn.Linear(nhid, ntoken)

        def forward(self, input, hidden):
            emb = self.drop(self.encoder(input))
            output, hidden = self.rnn(emb, hidden)
            return self.decoder(self.drop(output)), hidden


    def build_lm():
        return RNNModel("LSTM", ntoken=50, ninp=16, nhid=32, nlayers=2)
'''

LSTM_CONFIG = """\
smoke:
  enabled: true
  targets:
    - target: lm/model.py:RNNModel
      factory: lm/model.py:build_lm
      input:
        - {shape: [12], dtype: long, high: 50, batch_axis: 1}
        - tuple:
            - {shape: [2, 32], batch_axis: 1}
            - {shape: [2, 32], batch_axis: 1}
      output: {batch_axis: 1, select: 0}
      task: language_model
"""

NANOGPT = '''
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


    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config.n_embd)
            self.attn = nn.MultiheadAttention(config.n_embd, config.n_head, batch_first=True)
            self.ln_2 = nn.LayerNorm(config.n_embd)
            self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                     nn.Linear(4 * config.n_embd, config.n_embd))

        def forward(self, x):
            t = x.size(1)
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
            h = self.ln_1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))


    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
            self.ln_f = nn.LayerNorm(config.n_embd)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

        def forward(self, idx, targets=None):
            pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            if targets is not None:
                logits = self.lm_head(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            else:
                logits = self.lm_head(x[:, [-1], :])  # inference: the last position only
                loss = None
            return logits, loss


    def small_gpt():
        return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
'''

NANOGPT_CONFIG = """\
[tool.torchreview.smoke]
targets = [
  {factory = "model.py:small_gpt", task = "custom", output = {select = 1}, input = [
    {shape = [16], dtype = "long", high = 64},
    {name = "targets", shape = [16], dtype = "long", high = 64},
  ]},
]
"""


def configured_subject(root: Path, config_text: str, filename: str):
    config = parse_config_text(config_text, filename)
    (request,) = configured_requests(config.smoke)
    return request, build_subject(root, request.target, device="cpu", config=request.config)


def test_an_lstm_language_model_with_a_tuple_hidden_state_and_a_time_first_output(tmp_path):
    root = write_tree(tmp_path, {"lm/model.py": LSTM_LM})
    guessed = build_subject(root, "lm/model.py:RNNModel", device="cpu")  # without the config: the same layout
    assert guessed.task == "language_model" and guessed.output_batch_axis == 1 and not guessed.inputs_batch_first
    assert run_checks(guessed, steps=STEPS).status == "passed"

    request, subject = configured_subject(root, LSTM_CONFIG, ".github/torchreview.yml")
    assert request.target == "lm/model.py:RNNModel" and "target" not in request.config
    batch = subject.make_batch(8, 0)
    tokens, (h, c) = batch.args
    assert tokens.shape == (12, 8) and h.shape == c.shape == (2, 8, 32)
    assert batch.target.shape == (12, 8)  # next tokens, laid out like the time-first logits
    assert torch.equal(batch.target[:-1], tokens[1:]) and bool((batch.target[-1] == -100).all())
    report = run_checks(subject, steps=STEPS)
    assert report.status == "passed", [(c.name, c.message) for c in report.checks if c.status != "pass"]
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["forward-contract"] == statuses["overfit-batch"] == statuses["loss-at-init"] == "pass"
    assert statuses["batch-leakage"] == "skip"


def test_a_nanogpt_factory_trained_on_the_loss_it_returns(tmp_path):
    root = write_tree(tmp_path, {"model.py": NANOGPT})
    request, subject = configured_subject(root, NANOGPT_CONFIG, "pyproject.toml")
    assert request.target == "model.py:small_gpt"
    assert subject.task == "custom" and subject.model.config.n_embd == 32
    assert set(subject.make_batch(4, 0).kwargs) == {"targets"}
    report = run_checks(subject, steps=STEPS)
    assert report.status == "passed", [(c.name, c.message) for c in report.checks if c.status != "pass"]
    overfit = next(c for c in report.checks if c.name == "overfit-batch")
    first = next(iter(overfit.details["runs"].values()))
    assert first["best"] < 0.8 * first["initial"]  # the model's own loss, not the last position's logits


def test_a_configured_loss_and_loss_target_on_the_selected_output(tmp_path):
    root = write_tree(tmp_path, {"lm/model.py": LSTM_LM, "lm/losses.py": """\
        import torch.nn.functional as F

        def sequence_nll(logits, target):
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        """})
    text = LSTM_CONFIG.replace("      task: language_model\n",
                               "      loss: lm/losses.py:sequence_nll\n"
                               "      loss_target: {shape: [12], dtype: long, high: 50, batch_axis: 1}\n")
    _, subject = configured_subject(root, text, ".github/torchreview.yml")
    batch = subject.make_batch(4, 0)
    assert batch.target.shape == (12, 4) and batch.target.dtype == torch.long
    output = subject.model(*batch.args)
    assert torch.isfinite(subject.loss_fn(output, batch.target))  # the loss sees the logits, not the tuple


@pytest.mark.parametrize("text, error", [
    ("    - target: m.py:Net\n      target_shape: [3]\n",
     ".github/torchreview.yml:4: smoke.targets[0].target_shape: unknown key 'target_shape'"),
    ("    - target: m.py:Net\n      loss_target: {shape: [3], name: y}\n",
     ".github/torchreview.yml:4: smoke.targets[0].loss_target.name: unknown key 'name'"),
    ("    - target: {shape: [3]}\n",
     ".github/torchreview.yml:3: smoke.targets[0].target: must be \"path/to/file.py[:NameOrFactory]\""),
    ("    - target: m.py:Net\n      input: {shape: [16], batch_axis: 2}\n",
     ".github/torchreview.yml:4: smoke.targets[0].input.batch_axis: 2 is past the end of a 2-d tensor"),
    ("    - target: m.py:Net\n      input:\n        - {shape: [4]}\n        - {tuple: [{shape: [0]}]}\n",
     ".github/torchreview.yml:6: smoke.targets[0].input[1].tuple[0].shape: must be a list of sizes"),
    ("    - target: m.py:Net\n      output: {batch_axis: first}\n",
     ".github/torchreview.yml:4: smoke.targets[0].output.batch_axis: must be a whole number from 0 to 8, or "
     "\"none\""),
    ("    - target: m.py:Net\n      factory: build_model\n",
     ".github/torchreview.yml:4: smoke.targets[0].factory: must be \"path/to/file.py:factory\""),
    ("    - m.py:Net\n    - factory: m.py:build\n      input: {shape: [3], dtype: complex64}\n",
     ".github/torchreview.yml:5: smoke.targets[1].input.dtype: must be one of"),
    ("    - {input: {shape: [3]}}\n", ".github/torchreview.yml:3: smoke.targets[0]: needs target = "),
])
def test_invalid_tables_name_file_line_key_and_problem(text, error):
    with pytest.raises(ConfigError) as info:
        parse_config_text("smoke:\n  targets:\n" + text, ".github/torchreview.yml")
    assert str(info.value).startswith(error), str(info.value)


def test_steps_are_validated_too():
    config = parse_config_text('[tool.torchreview.smoke]\nsteps = [\n  "train.py:train_one_epoch",\n'
                               '  {step = "fit.py:fit", model = "net.py:Net", input = {shape = [4]}},\n]\n',
                               "pyproject.toml")
    requests = configured_requests(config.smoke)
    assert [(r.target, r.kind) for r in requests] == [("train.py:train_one_epoch", "step"), ("fit.py:fit", "step")]
    assert requests[1].config == {"model": "net.py:Net", "input": {"shape": [4]}}
    with pytest.raises(ConfigError, match=r"pyproject.toml:3: smoke.steps\[0\].model: must be"):
        parse_config_text('[tool.torchreview.smoke]\nsteps = [\n  {step = "fit.py:fit", model = 3},\n]\n',
                          "pyproject.toml")



def test_step_tables_take_argument_values_and_function_for_step():
    config = parse_config_text("smoke:\n  steps:\n    - {function: train.py:train_epoch, args: {cuda: false, "
                               "log_interval: 10, args: {seed: 1}}}\n", ".github/torchreview.yml")
    (request,) = configured_requests(config.smoke)
    assert (request.target, request.kind) == ("train.py:train_epoch", "step")
    assert request.config == {"args": {"cuda": False, "log_interval": 10, "args": {"seed": 1}}}
    for text, error in [
        ("{step: a.py:f, args: [1, 2]}", ".github/torchreview.yml:3: smoke.steps[0].args: must be a table of the "
                                         "step's parameter names and their values"),
        ("{step: a.py:f, args: {cuda: {a: {b: 1}}}}", ".github/torchreview.yml:3: smoke.steps[0].args.cuda.a: must "
                                                      "be a number, string, boolean, list"),
        ("{step: a.py:f, function: a.py:g}", ".github/torchreview.yml:3: smoke.steps[0].function: give the step "
                                             "once, as step or as function, not both"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config_text("smoke:\n  steps:\n    - " + text + "\n", ".github/torchreview.yml")
        assert str(info.value).startswith(error), str(info.value)


FINE_TUNE_STEP = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(16, 32)
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(torch.relu(self.encoder(x)))


    def fine_tune(model, loader, epochs):
        optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-3)
        model.train()
        for _ in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
'''

CLI_CONFIG = '''\
[smoke]
steps = [{step = "tune.py:fine_tune", model = "tune.py:Net"}]

[[smoke.targets]]
target = "lm/model.py:RNNModel"
factory = "lm/model.py:build_lm"
task = "language_model"
output = {batch_axis = 1}
input = [
  {shape = [12], dtype = "long", high = 50, batch_axis = 1},
  {tuple = [{shape = [2, 32], batch_axis = 1}, {shape = [2, 32], batch_axis = 1}]},
]
'''


def cli(*args, cwd: Path):
    import os
    import subprocess

    # the test's own fixture code, on a machine that may lack bubblewrap: the weak sandbox is enough here
    env = {**os.environ, "TORCHREVIEW_SANDBOX": "weak", "NO_COLOR": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "bot.cli", *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_the_cli_reads_the_config_targets_and_steps(tmp_path):
    import json

    import subprocess

    root = write_tree(tmp_path, {"lm/model.py": LSTM_LM, "tune.py": FINE_TUNE_STEP, ".torchreview.toml": CLI_CONFIG})
    subprocess.run(["git", "init", "-q", str(root)], check=True)  # the repository root: where target paths start
    proc = cli("smoke", "--config", ".torchreview.toml", "--device", "cpu", "--steps", "10", "--format", "json",
               cwd=root)
    assert proc.returncode == 1, proc.stderr
    targets = {t["target"]: t for t in json.loads(proc.stdout)["targets"]}
    assert targets["lm/model.py:RNNModel"]["status"] == "passed"
    step = targets["tune.py:fine_tune"]
    assert step["status"] == "failed"
    assert {c["name"] for c in step["head"]["checks"] if c["status"] == "fail"} == {"optimizer-coverage"}

    # a file named on the command line takes its configuration from the repository's file
    proc = cli("smoke", "lm/model.py:RNNModel", "--device", "cpu", "--steps", "10", "--format", "json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["targets"][0]["status"] == "passed"

    (root / ".torchreview.toml").write_text(CLI_CONFIG.replace('task = "language_model"', 'task = "lm"'))
    proc = cli("smoke", "--config", ".torchreview.toml", cwd=root)
    assert proc.returncode == 2
    assert "torchreview: error: .torchreview.toml:7: smoke.targets[0].task: must be one of" in proc.stderr
