"""Context lowers severity where the harm is small: the same bug in a training script keeps its severity, in a pytest
test, a benchmark or a tutorial on tiny synthetic data it is one level lower and says why (issue 26, item 2)."""
from __future__ import annotations

import json

from analyzers.config import Config
from analyzers.engine import analyze_notebook_text, analyze_source
from analyzers.model import Severity

# a softmax fed to CrossEntropyLoss (TR401, high): the same line in every fixture below
BUG = "loss = criterion(torch.softmax(model(x), dim=1), y)"
CONFIG = Config(preview=True, measured_severities=False)


def _findings(source: str, path: str, config: Config = CONFIG, rule: str = "TR401"):
    return [f for f in analyze_source(source, path, config).findings if f.rule == rule]


TRAINING = f"""\
import torch
import torch.nn as nn
from data import make_loader  # the repository's own data: real batches

model = nn.Linear(10, 3)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in make_loader():
    {BUG}
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

PYTEST = f"""\
import pytest
import torch
import torch.nn as nn


@pytest.fixture
def model():
    return nn.Linear(10, 3)


def test_loss_is_finite(model):
    criterion = nn.CrossEntropyLoss()
    x, y = torch.randn(4, 10), torch.randint(0, 3, (4,))
    {BUG}
    assert torch.isfinite(loss)
"""

BENCHMARK = f"""\
import time
import torch
import torch.nn as nn

model = nn.Linear(1024, 1000)
criterion = nn.CrossEntropyLoss()
x = torch.randn(256, 1024)
y = torch.randint(0, 1000, (256,))
start = time.perf_counter()
for _ in range(100):
    {BUG}
print("per step", (time.perf_counter() - start) / 100)
"""


def _notebook(*cells: str) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": cell}
        for cell in cells]})


TUTORIAL = _notebook(
    "import torch\nimport torch.nn as nn\nimport matplotlib.pyplot as plt",
    "N = 64\nx = torch.randn(N, 10)\ny = torch.randint(0, 3, (N,))\nmodel = nn.Linear(10, 3)\n"
    "criterion = nn.CrossEntropyLoss()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
    f"for step in range(100):\n    {BUG}\n    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()",
)


def test_a_training_script_keeps_the_rule_s_severity():
    [finding] = _findings(TRAINING, "train.py")
    assert finding.severity is Severity.HIGH and finding.context is None


def test_a_pytest_test_is_one_level_lower_and_says_why():
    [finding] = _findings(PYTEST, "tests/test_model.py")
    assert finding.severity is Severity.MEDIUM and finding.context == "lowered: test code"
    assert finding.to_dict()["context"] == "lowered: test code"
    # a unittest.TestCase anywhere, whatever the file is called
    unittest_case = ("import unittest\nimport torch\nimport torch.nn as nn\n\nclass LossCheck(unittest.TestCase):\n"
                     "    def runTest(self):\n        model = nn.Linear(10, 3)\n        criterion = nn.CrossEntropyLoss()\n"
                     "        x, y = torch.randn(4, 10), torch.randint(0, 3, (4,))\n        " + BUG + "\n")
    assert _findings(unittest_case, "checks.py")[0].context == "lowered: test code"


def test_a_file_named_test_that_holds_no_tests_is_not_test_code():
    # in ML repositories test.py / test_model.py often evaluates a trained model: its bugs matter
    evaluation = TRAINING.replace("train", "evaluate")
    [finding] = _findings(evaluation, "test_model.py")
    assert finding.severity is Severity.HIGH and finding.context is None


def test_a_benchmark_is_lowered_but_timing_inside_training_is_not():
    [finding] = _findings(BENCHMARK, "bench/loss_speed.py")
    assert finding.severity is Severity.MEDIUM and finding.context == "lowered: benchmark"
    # a training loop that logs how long its epochs take is still training
    timed_training = TRAINING.replace("for x, y", "import time\nstarted = time.time()\nfor x, y")
    assert _findings(timed_training, "train.py")[0].severity is Severity.HIGH


def test_a_tutorial_notebook_on_tiny_synthetic_data_is_lowered():
    result = analyze_notebook_text(TUTORIAL, "tutorials/intro.ipynb", CONFIG)
    [finding] = [f for f in result.findings if f.rule == "TR401"]
    assert finding.severity is Severity.MEDIUM and finding.context == "lowered: tiny synthetic data"
    # the same notebook on real data (a dataset download), or on a large synthetic batch, is not
    real = TUTORIAL.replace("import matplotlib.pyplot as plt", "import torchvision\\n"
                            "data = torchvision.datasets.MNIST('.', download=True)")
    assert [f.severity for f in analyze_notebook_text(real, "intro.ipynb", CONFIG).findings
            if f.rule == "TR401"] == [Severity.HIGH]
    large = TUTORIAL.replace("N = 64", "N = 1_000_000")
    assert [f.severity for f in analyze_notebook_text(large, "intro.ipynb", CONFIG).findings
            if f.rule == "TR401"] == [Severity.HIGH]


def test_security_rules_are_not_lowered_in_tests():
    # TR601 decides about test code itself (the program model's test role: it stays silent there), so context
    # never lowers it on top; outside test code it keeps its severity
    source = "import pytest\nimport torch\n\ndef test_load(path):\n    state = torch.load(path, weights_only=False)\n"
    assert not _findings(source, "checks/io_checks.py", CONFIG, "TR601")
    script = "import sys\nimport torch\nstate = torch.load(sys.argv[1], weights_only=False)\n"
    [finding] = _findings(script, "tools/convert.py", CONFIG, "TR601")
    assert finding.context is None and finding.severity is Severity.CRITICAL
    # while the test file's other findings are lowered: it is test code
    also = "import torch.nn as nn\n" + source + PYTEST.split("\n\n\n", 1)[1]
    assert _findings(also, "checks/io_checks.py")[0].context == "lowered: test code"


def test_an_explicit_severity_wins_and_the_option_turns_it_off():
    pinned = Config(preview=True, measured_severities=False, severity={"TR401": Severity.CRITICAL})
    [finding] = _findings(PYTEST, "tests/test_model.py", pinned)
    assert finding.severity is Severity.CRITICAL and finding.context is None
    off = Config(preview=True, measured_severities=False, context_severity=False)
    assert _findings(PYTEST, "tests/test_model.py", off)[0].severity is Severity.HIGH
    loaded = Config.from_mapping({"context_severity": False})
    assert loaded.context_severity is False and loaded.to_dict()["context_severity"] is False


def test_never_below_low_and_never_a_security_rule():
    from analyzers.levels import context_lowered

    assert context_lowered(Severity.LOW, "numerics", "test code") == (Severity.LOW, None)
    assert context_lowered(Severity.CRITICAL, "numerics", "benchmark") == (Severity.HIGH, "lowered: benchmark")
    assert context_lowered(Severity.HIGH, "serialization", "test code") == (Severity.HIGH, None)


def test_a_clock_without_repetitions_is_not_a_benchmark():
    # a progress bar's step timer, in a helper module that trains nothing itself
    progress = ("import time\nimport torch\n\nlast = time.time()\n\ndef progress(step, total):\n"
                "    global last\n    now = time.time()\n    print(step, total, now - last)\n    last = now\n\n"
                "model = torch.nn.Linear(10, 3)\ncriterion = torch.nn.CrossEntropyLoss()\n"
                "def check(x, y):\n    " + BUG + "\n    return loss\n")
    [finding] = _findings(progress, "utils.py")
    assert finding.context is None
    assert _findings(progress.replace("def check(x, y):", "for _ in range(10):\n    x, y = None, None\n"
                                      "def check(x, y):"), "utils.py")[0].context == "lowered: benchmark"


def test_every_output_says_why_a_finding_was_lowered():
    import io

    from analyzers.engine import RunResult
    from analyzers.output import render
    from bot.review import comment_body

    [finding] = _findings(PYTEST, "tests/test_model.py")
    run = RunResult(files=1, findings=[finding])
    shown = {}
    for fmt in ("text", "json", "sarif", "github"):
        stream = io.StringIO()
        render(run, fmt, stream, **({"color": False} if fmt == "text" else {}))
        shown[fmt] = stream.getvalue()
    assert "(lowered: test code)" in shown["text"]
    assert json.loads(shown["json"])["findings"][0]["context"] == "lowered: test code"
    assert json.loads(shown["sarif"])["runs"][0]["results"][0]["properties"]["context"] == "lowered: test code"
    assert "(medium%2C lowered%3A test code)" in shown["github"]  # commas and colons of a title are escaped
    assert "· lowered: test code" in comment_body(finding, "digest").splitlines()[0]


def test_tr601_judges_a_file_by_the_tests_it_holds_not_the_folder_it_sits_in():
    # a self-play script kept under test/ that resumes from a path on its command line: exposed like any script
    script = ("import argparse\nimport torch\n\nparser = argparse.ArgumentParser()\nparser.add_argument('--resume')\n"
              "args = parser.parse_args()\nstate = torch.load(args.resume)\n")
    [finding] = _findings(script, "test/selfplay/resume.py", CONFIG, "TR601")
    assert finding.line == 7
    # a pytest test of the same folder reloading what it saved is not
    test = ("import torch\n\ndef test_roundtrip(tmp_path):\n    torch.save({'w': 1}, tmp_path / 'x.pt')\n"
            "    assert torch.load(tmp_path / 'x.pt') == {'w': 1}\n")
    assert not _findings(test, "test/test_io.py", CONFIG, "TR601")


# A speed-only finding (TR702: a training loader with no workers, on a CUDA job) is silent where the code never runs
# long enough for the advice to pay: test code, a program on tiny synthetic data. A benchmark keeps it.
_LOADER_LOOP = """\
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _speed_program(header: str, body_indent: str = "") -> str:
    body = "".join(body_indent + line + "\n" for line in _LOADER_LOOP.splitlines())
    return header + body


SPEED_TRAINING = _speed_program("""\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from data import ImageFiles  # the repository's own images, read from disk

dataset = ImageFiles("train/")
model = nn.Linear(10, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def train():
""")

SPEED_PYTEST = _speed_program("""\
import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from data import ImageFiles


def test_one_epoch_lowers_the_loss():
    dataset = ImageFiles("fixtures/")
    model = nn.Linear(10, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
""")


def test_a_speed_only_finding_is_silent_in_test_code_and_kept_in_a_training_script():
    assert [f.rule for f in _findings(SPEED_TRAINING, "train.py", rule="TR702")] == ["TR702"]
    assert _findings(SPEED_PYTEST, "tests/test_train.py", rule="TR702") == []
    # with context severity off, nothing is silenced
    off = Config(preview=True, measured_severities=False, context_severity=False)
    assert [f.rule for f in _findings(SPEED_PYTEST, "tests/test_train.py", off, rule="TR702")] == ["TR702"]


def test_only_rules_whose_harm_is_speed_alone_are_silenced():
    from analyzers.levels import context_silences
    from analyzers.program.harm import BENCHMARK, TEST_CODE, TINY_DATA
    from analyzers.rules import all_rules
    speed = {rule.id for rule in all_rules() if rule.speed_only}
    assert {"TR105", "TR106", "TR702", "TR703"} <= speed
    assert not speed & {"TR101", "TR201", "TR401", "TR601", "TR705"}  # bugs stay bugs in a test
    assert context_silences(True, TEST_CODE) and context_silences(True, TINY_DATA)
    assert not context_silences(True, BENCHMARK) and not context_silences(True, None)
    assert not context_silences(False, TEST_CODE)


# a loader without workers (TR702, low, speed) and a hard-coded CUDA device (TR704, low): hygiene advice
PINNED = """\
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


model = Net().to(device)
for x in batches:
    x = x.cuda()
    model(x)
"""

PINNED_PYTEST = PINNED + """

def test_runs_on_gpu():
    assert model is not None
"""

DEPRECATED_PYTEST = """\
import torch


def test_loss_per_item():
    loss = torch.nn.MSELoss(reduce=False)
    assert loss(torch.ones(2), torch.zeros(2)).shape == (2,)
"""


def test_a_low_finding_says_nothing_in_test_code_and_is_kept_elsewhere():
    assert [f.rule for f in _findings(PINNED, "gpu.py", rule="TR704")] == ["TR704"]
    # low in a test, it says nothing: the test pins the device on purpose
    assert _findings(PINNED_PYTEST, "tests/test_gpu.py", rule="TR704") == []
    # a file that holds a test function but is no test file (a script's self-check) keeps it
    assert [f.rule for f in _findings(PINNED_PYTEST, "check_gpu.py", rule="TR704")] == ["TR704"]
    # as does a run without context
    off = Config(preview=True, measured_severities=False, context_severity=False)
    assert [f.rule for f in _findings(PINNED_PYTEST, "tests/test_gpu.py", off, rule="TR704")] == ["TR704"]


def test_a_deprecated_api_in_a_test_is_still_reported():
    # the release that removes the argument breaks the test as it breaks training code
    assert [f.rule for f in _findings(DEPRECATED_PYTEST, "tests/test_loss.py", rule="TR818")] == ["TR818"]


def test_only_low_findings_of_hygiene_rules_in_test_code_are_dropped():
    from analyzers.levels import context_drops
    from analyzers.model import Category
    from analyzers.program.harm import BENCHMARK, TEST_CODE, TINY_DATA
    assert context_drops(Severity.LOW, Category.DEVICE.value, TEST_CODE)
    assert not context_drops(Severity.MEDIUM, Category.DEVICE.value, TEST_CODE)  # a high one lowered in a test
    assert not context_drops(Severity.LOW, Category.SECURITY.value, TEST_CODE)
    assert not context_drops(Severity.LOW, Category.DEPRECATION.value, TEST_CODE)
    assert not context_drops(Severity.LOW, Category.DEVICE.value, BENCHMARK)
    assert not context_drops(Severity.LOW, Category.DEVICE.value, TINY_DATA)
    assert not context_drops(Severity.LOW, Category.DEVICE.value, None)
