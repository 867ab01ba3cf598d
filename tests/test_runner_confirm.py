"""The runner's experiments on static findings (gpu_runner.confirm): each finding a run can decide is confirmed on a
model that has the bug, refuted on one that does not show it, and left undecided when the run cannot tell."""
from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")

from bot.smoke import RUNNER_CLAIM_KEYS, static_claims  # noqa: E402
from gpu_runner.child import smoke_one  # noqa: E402
from gpu_runner.confirm import cross_entropy_floor  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

MODELS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, features=16, classes=10):
        super().__init__()
        self.hidden = nn.Linear(features, 32)
        self.out = nn.Linear(32, classes)

    def forward(self, x):
        return F.softmax(self.out(F.relu(self.hidden(x))), dim=1)


class Tagger(nn.Module):
    def __init__(self, features=16, tags=5, drop=0.3):
        super().__init__()
        self.fc1 = nn.Linear(features, 32)
        self.fc2 = nn.Linear(32, tags)
        self.drop = drop

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(x)), p=self.drop)
        return self.fc2(h)


class Quiet(Tagger):
    def __init__(self):
        super().__init__(drop=0.0)


class Gentle(nn.Module):
    def __init__(self, features=16, drop=0.2):
        super().__init__()
        self.fc = nn.Linear(features, 4)
        self.drop = drop

    def drop_options(self):
        return {"p": self.drop, "training": self.training}

    def forward(self, x):
        return self.fc(F.dropout(x, **self.drop_options()))


class Noisy(nn.Module):
    def __init__(self, features=16, noise=False):
        super().__init__()
        self.fc = nn.Linear(features, 4)
        self.noise = noise

    def forward(self, x):
        if self.noise:
            x = F.dropout(x, 0.2)
        return self.fc(x)


class Stack(nn.Module):
    def __init__(self, width=8, depth=3):
        super().__init__()
        self.layers = [nn.Linear(width, width) for _ in range(depth)]
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


class Critic(nn.Module):
    def __init__(self, features=12):
        super().__init__()
        self.score = nn.Linear(features, 1)

    def forward(self, x):
        return torch.sigmoid(self.score(x))


class Biased(nn.Module):
    def __init__(self, features=16):
        super().__init__()
        self.fc = nn.Linear(features, 4)

    def forward(self, x):
        bias = torch.ones(x.size(0), 4)
        return self.fc(x) + bias


class Scaled(nn.Module):
    def __init__(self, features=16):
        super().__init__()
        self.fc = nn.Linear(features, 4)

    def forward(self, x):
        weights = torch.ones(x.size(0))
        return self.fc(x) * weights.mean()


def train(loader, epochs=2):
    biased, scaled = Biased().cuda(), Scaled().cuda()
    model = Classifier()
    critic = Critic()
    criterion = nn.CrossEntropyLoss()
    adversarial = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(list(model.parameters()) + list(critic.parameters()), lr=1e-3)
    for _ in range(epochs):
        for x, y, real in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y) + adversarial(critic(x[:, :12]), real)
            loss.backward()
            optimizer.step()
"""
LINES = MODELS.lstrip("\n").splitlines()


def line_of(text: str) -> int:
    return next(number for number, line in enumerate(LINES, 1) if text in line)


@pytest.fixture
def code(tmp_path):
    return write_tree(tmp_path, {"models.py": MODELS.lstrip("\n")})


@pytest.fixture
def claims(code):
    """What the worker sends: the static engine's decidable findings of the file, runner fields only."""
    found = static_claims({"models.py": (code / "models.py").read_text()})["models.py"]
    return [{k: c[k] for k in RUNNER_CLAIM_KEYS if k in c} for c in found]


def verdicts(code, name: str, claims: list[dict]) -> dict:
    report = smoke_one(code, f"models.py:{name}", None, "cpu", 5, 0, None, claims)
    assert report["status"] in ("passed", "failed"), report.get("reason")
    return {finding["rule"]: finding for finding in report.get("findings", [])}


def test_the_static_engine_hands_over_each_decidable_finding(claims):
    assert sorted((c["rule"], c["line"]) for c in claims) == [
        ("TR302", line_of("self.layers = [")), ("TR401", line_of("loss = criterion")),
        ("TR403", line_of("loss = criterion")), ("TR513", line_of("h = F.dropout(")),
        ("TR513", line_of("F.dropout(x, **self.drop_options())")), ("TR513", line_of("x = F.dropout(x, 0.2)")),
        ("TR701", line_of("bias = torch.ones(")),
        ("TR701", line_of("weights = torch.ones("))]
    by_rule = {c["rule"]: c for c in claims}
    assert by_rule["TR401"]["forward_of"] == "Classifier" and by_rule["TR403"]["forward_of"] == "Critic"
    assert by_rule["TR302"]["attribute"] == "layers" and by_rule["TR302"]["class"] == "Stack"


def test_softmax_output_into_cross_entropy_is_confirmed_with_the_loss_floor(code, claims):
    found = verdicts(code, "Classifier", claims)
    assert set(found) == {"TR401"}  # the other findings are about classes this model does not contain
    verdict = found["TR401"]
    assert verdict["verdict"] == "confirmed"
    assert verdict["details"]["floor"] == pytest.approx(math.log(1 + 9 / math.e))
    assert verdict["details"]["reached"] >= verdict["details"]["floor"] - 1e-5
    assert "cannot fall below log(1 + 9/e) = 1.46" in verdict["evidence"]


def test_the_cross_entropy_floor_is_the_lowest_loss_probabilities_reach():
    classes = 7
    floor = cross_entropy_floor(classes)
    one_hot = torch.zeros(1, classes)
    one_hot[0, 2] = 1.0
    target = torch.tensor([2])
    assert float(torch.nn.functional.cross_entropy(one_hot, target)) == pytest.approx(floor, rel=1e-6)
    # no probability vector does better, and descending over the simplex ends at the floor
    samples = torch.distributions.Dirichlet(torch.full((classes,), 0.3)).sample((20000,))
    assert float(torch.nn.functional.cross_entropy(samples, target.expand(20000), reduction="none").min()) >= floor
    logits = torch.zeros(1, classes, requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    for _ in range(500):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits.softmax(dim=1), target)
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) == pytest.approx(floor, abs=1e-3)


def test_functional_dropout_without_training_is_confirmed_in_eval_mode(code, claims):
    verdict = verdicts(code, "Tagger", claims)["TR513"]
    assert verdict["verdict"] == "confirmed" and verdict["line"] == line_of("h = F.dropout(")
    assert f"models.py:{verdict['line']} still ran with training=True and p=0.3" in verdict["evidence"]
    assert verdict["details"]["difference"] > 0


def test_a_subclass_built_with_p_zero_is_confirmed_by_raising_p_at_the_flagged_call(code, claims):
    verdict = verdicts(code, "Quiet", claims)["TR513"]
    assert verdict["verdict"] == "confirmed" and verdict["details"]["p"] == 0 and verdict["details"]["difference"] > 0
    assert "still ran with training=True; this build's p is 0" in verdict["evidence"]
    assert "with p=0.5 at that call two eval-mode forwards of the same batch differ" in verdict["evidence"]


def test_dropout_told_the_mode_another_way_is_not_reproduced(code, claims):
    verdict = verdicts(code, "Gentle", claims)["TR513"]
    assert verdict["verdict"] == "refuted" and verdict["line"] == line_of("F.dropout(x, **self.drop_options())")
    assert "ran with training=False" in verdict["evidence"] and "agree" in verdict["evidence"]


def test_dropout_the_eval_forward_never_reaches_is_undecided(code, claims):
    verdict = verdicts(code, "Noisy", claims)["TR513"]
    assert verdict["verdict"] == "undecided" and "never reached" in verdict["evidence"]


def test_modules_in_a_plain_list_are_confirmed_missing_from_the_parameters(code, claims):
    verdict = verdicts(code, "Stack", claims)["TR302"]
    assert verdict["verdict"] == "confirmed"
    missing, total = verdict["details"]["missing"], verdict["details"]["total"]
    assert missing == total and total and total % (8 * 8 + 8) == 0  # every layer's (the builder may shrink depth)
    assert "`self.layers`" in verdict["evidence"]


def test_sigmoid_output_into_bce_with_logits_is_confirmed(code, claims):
    verdict = verdicts(code, "Critic", claims)["TR403"]
    assert verdict["verdict"] == "confirmed"
    assert verdict["details"]["reached"] >= verdict["details"]["floor"] - 1e-5
    assert "log 2 = 0.693" in verdict["evidence"]


def test_a_cpu_tensor_made_in_forward_is_confirmed_on_a_stand_in_for_a_gpu(code, claims):
    verdict = verdicts(code, "Biased", claims)["TR701"]
    assert verdict["verdict"] == "confirmed"
    assert f"`torch.ones` at models.py:{line_of('bias = torch.ones(')} made a CPU tensor" in verdict["evidence"]
    # torch's own words for the mismatch, which changed between releases ("two different devices" up to 2.11)
    assert re.search(r"same device|two different devices", verdict["evidence"]), verdict["evidence"]


def test_a_cpu_tensor_that_only_meets_the_model_as_a_scalar_is_not_reproduced(code, claims):
    verdict = verdicts(code, "Scaled", claims)["TR701"]
    assert verdict["verdict"] == "refuted" and "the forward went through" in verdict["evidence"]


def test_a_model_whose_output_is_logits_refutes_an_activation_claim(code):
    # claims are data: one naming Tagger's forward as returning an activation is refuted by its logits
    claims = [{"rule": "TR401", "line": 1, "end_line": 1, "class": None, "forward_of": "Tagger"},
              {"rule": "TR403", "line": 1, "end_line": 1, "class": None, "forward_of": "Tagger"}]
    found = verdicts(code, "Tagger", claims)
    assert found["TR401"]["verdict"] == "refuted" and "not a probability vector" in found["TR401"]["evidence"]
    assert found["TR403"]["verdict"] == "refuted" and "not a sigmoid's" in found["TR403"]["evidence"]


def test_verdicts_cross_the_sandboxed_child_and_the_model_is_left_as_built(code, claims):
    from gpu_runner.runner import TargetRequest, run_targets
    from gpu_runner.sandbox import SandboxLimits

    reports, _ = run_targets(code, [TargetRequest("models.py:Tagger", 1, findings=claims)], device="cpu", steps=5,
                             seed=0, limits=SandboxLimits(timeout_s=120), sandbox=False)
    assert [(f["rule"], f["verdict"]) for f in reports[0]["findings"]] == [("TR513", "confirmed")]
    assert reports[0]["findings"][0]["line"] == line_of("h = F.dropout(")
