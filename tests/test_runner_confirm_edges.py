"""The runner's experiments on static findings at their edges: a verdict must follow from the flagged code (not
from a neighbour's bug or a function's defaults read wrong), an experiment that cannot run or has no time left
says so without costing the target its report, and the model and random state leave as they came."""
from __future__ import annotations

import math
import time

import pytest

torch = pytest.importorskip("torch")

from bot.smoke import RUNNER_CLAIM_KEYS, static_claims  # noqa: E402
from gpu_runner.child import smoke_one  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)

MODELS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfNormalizing(nn.Module):
    def __init__(self, features=16, hidden=32):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x):
        h = F.alpha_dropout(F.selu(self.fc1(x)), 0.1)
        return self.fc2(h)


class Gated(nn.Module):
    def __init__(self, features=16):
        super().__init__()
        self.fc = nn.Linear(features, 4)

    def forward(self, x):
        gate = torch.ones(x.size(1)).to(x.device)
        offset = torch.zeros(x.size(0), 4)
        return self.fc(x * gate) + offset


class Picky(nn.Module):
    def __init__(self, features=16):
        super().__init__()
        self.fc = nn.Linear(features, 4)

    def forward(self, x):
        if not self.training:
            raise RuntimeError("Picky is for training; call predict() for inference")
        return self.fc(F.dropout(x, 0.1))


class Ranker(nn.Module):
    def __init__(self, features=16, classes=6):
        super().__init__()
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=0)


class Frozen(nn.Module):
    def __init__(self, features=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(features, 16), nn.BatchNorm1d(16))
        self.head = nn.Linear(16, 4)
        self.stem.eval()
        self.drop = 0.25

    def forward(self, x):
        return self.head(F.dropout(self.stem(x), self.drop))
"""
LINES = MODELS.lstrip("\n").splitlines()


def line_of(text: str) -> int:
    return next(number for number, line in enumerate(LINES, 1) if text in line)


@pytest.fixture
def code(tmp_path):
    return write_tree(tmp_path, {"models.py": MODELS.lstrip("\n")})


def runner_claims(code) -> list[dict]:
    found = static_claims({"models.py": (code / "models.py").read_text()}).get("models.py", [])
    return [{k: c[k] for k in RUNNER_CLAIM_KEYS if k in c} for c in found]


def verdicts(code, name: str, claims: list[dict], **kwargs) -> dict:
    report = smoke_one(code, f"models.py:{name}", None, "cpu", 5, 0, None, claims, **kwargs)
    assert report["status"] in ("passed", "failed"), report.get("reason")
    return {(finding["rule"], finding["line"]): finding for finding in report.get("findings", [])}


def test_alpha_dropout_without_training_is_off_by_default_so_it_is_not_reproduced(code):
    # F.alpha_dropout's training= defaults to False (F.dropout's to True): in eval mode it drops nothing, so the
    # static rule leaves it alone, and a claim made about it anyway is not reproduced
    line = line_of("h = F.alpha_dropout(")
    claims = [c for c in runner_claims(code) if c["rule"] == "TR513"]
    assert [c["line"] for c in claims] == [line_of("return self.fc(F.dropout(x, 0.1))"),
                                           line_of("F.dropout(self.stem(x)")]
    claims.append({"rule": "TR513", "path": "models.py", "line": line, "end_line": line, "class": "SelfNormalizing"})
    verdict = verdicts(code, "SelfNormalizing", claims)[("TR513", line)]
    assert verdict["verdict"] == "refuted" and "ran with training=False" in verdict["evidence"]


def test_a_cpu_tensor_that_is_moved_is_not_confirmed_by_another_lines_mismatch(code):
    # both lines make a tensor without device=; only `offset` reaches the model's tensors on the CPU
    gate, offset = line_of("gate = torch.ones("), line_of("offset = torch.zeros(")
    claims = [{"rule": "TR701", "path": "models.py", "line": n, "end_line": n, "class": "Gated"}
              for n in (gate, offset)]
    found = verdicts(code, "Gated", claims)
    assert found[("TR701", offset)]["verdict"] == "confirmed"
    assert found[("TR701", gate)]["verdict"] == "refuted", found[("TR701", gate)]["evidence"]


def test_a_malformed_claim_costs_the_target_neither_its_report_nor_the_other_verdicts(code):
    # the executor takes claims from a request body: whatever they hold, the checks' report comes back
    good = [c for c in runner_claims(code) if c["rule"] == "TR513" and c["class"] == "Frozen"]
    claims = [{"rule": ["TR513"], "line": 3}, {"rule": "TR513", "line": 5, "end_line": "six", "class": "Frozen"},
              {"rule": "TR302", "line": 7, "class": "Frozen", "attribute": 12}] + good
    found = verdicts(code, "Frozen", claims)
    assert found[("TR513", good[0]["line"])]["verdict"] == "confirmed"


def test_experiments_left_no_time_are_undecided_and_the_checks_still_report(code):
    claims = [c for c in runner_claims(code) if c["class"] == "Frozen"]
    found = verdicts(code, "Frozen", claims, findings_deadline=time.perf_counter() - 1)
    assert [v["verdict"] for v in found.values()] == ["undecided"]
    assert "no time was left" in next(iter(found.values()))["evidence"]


def test_the_model_keeps_its_modes_and_the_random_state_is_untouched(code):
    from gpu_runner.build import build_subject
    from gpu_runner.confirm import confirm_findings

    subject = build_subject(code, "models.py:Frozen", device="cpu", seed=0)
    subject.model.eval()
    subject.model.head.train()
    modes = {name: module.training for name, module in subject.model.named_modules()}
    state = torch.get_rng_state()
    claims = [c for c in runner_claims(code) if c["class"] == "Frozen"]
    assert [v["verdict"] for v in confirm_findings(subject, "models.py", claims)] == ["confirmed"]
    assert {name: module.training for name, module in subject.model.named_modules()} == modes
    assert torch.equal(torch.get_rng_state(), state)


def test_the_workers_static_analysis_is_bounded_as_the_static_reviews(code):
    # files past the limits give no claims; those within them keep theirs
    source = (code / "models.py").read_text()
    sources = {"a/models.py": source, "b/models.py": source}
    assert sorted(static_claims(sources)) == ["a/models.py", "b/models.py"]
    assert sorted(static_claims(sources, max_files=1)) == ["a/models.py"]
    assert sorted(static_claims({"big.py": source + "#" * 4000, **sources}, max_bytes=2 * len(source) + 10)) == [
        "a/models.py", "b/models.py"]


def test_the_cli_prints_a_verdict_on_a_file_whose_name_looks_like_markup(capsys):
    from bot.cli import _print_smoke
    from gpu_runner.runner import SmokeRun, TargetOutcome

    path = "models/[v2]/net[/].py"
    verdict = {"rule": "TR513", "path": path, "line": 4, "verdict": "confirmed", "evidence": "dropped [bold]",
               "details": {}}
    head = {"target": f"{path}:Net", "status": "passed", "checks": [], "measures": {}, "reason": "", "notes": [],
            "findings": [verdict]}
    claims = {path: [{"rule": "TR513", "path": path, "line": 4, "end_line": 4, "class": "Net",
                      "slug": "functional-dropout-always-on", "message": "m"}]}
    _print_smoke(SmokeRun([TargetOutcome(f"{path}:Net", 1, head)], "cpu", 0.1), claims)
    assert f"at {path}:4 (on {path}:Net): dropped [bold]" in " ".join(capsys.readouterr().out.split())


def test_a_training_scripts_finding_goes_to_the_model_class_it_imports_not_to_a_namesake(tmp_path):
    from bot.smoke import with_claims
    from gpu_runner.runner import TargetRequest

    net = """
        import torch.nn as nn
        import torch.nn.functional as F


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 5)

            def forward(self, x):
                return {}
    """
    root = write_tree(tmp_path, {
        "legacy/net.py": net.format("self.fc(x)"),
        "current/net.py": net.format("F.softmax(self.fc(x), dim=1)"),
        "train.py": """
            import torch.nn as nn
            from current.net import Net


            def fit(loader):
                model = Net()
                criterion = nn.CrossEntropyLoss()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
        """})
    sources = {p: (root / p).read_text() for p in ("legacy/net.py", "current/net.py", "train.py")}
    claims = static_claims(sources, root=root)
    assert [(c["rule"], c["forward_of"], c["forward_path"]) for c in claims["train.py"]] == [
        ("TR401", "Net", "current/net.py")]
    requests_ = [TargetRequest("legacy/net.py:Net"), TargetRequest("current/net.py:Net")]
    with_claims(requests_, claims)
    assert [[c["rule"] for c in r.findings] for r in requests_] == [[], ["TR401"]]


def test_an_experiment_the_models_code_stops_is_undecided_and_says_where(code):
    line = line_of("return self.fc(F.dropout(x, 0.1))")
    claims = [c for c in runner_claims(code) if c["class"] == "Picky"]
    verdict = verdicts(code, "Picky", claims)[("TR513", line)]
    assert verdict["verdict"] == "undecided" and verdict["details"]["error"] == "model"
    assert (f"the model's code raised RuntimeError at models.py:{line_of('raise RuntimeError(')} in forward"
            in verdict["evidence"])


def test_a_dropout_of_another_file_with_the_same_name_and_line_does_not_decide_the_flagged_one(tmp_path):
    # lib/models.py:11 tells its dropout the mode; models.py:11, flagged, is not reached in eval mode
    root = write_tree(tmp_path, {
        "lib/models.py": """\
            import torch.nn as nn
            import torch.nn.functional as F


            class Smooth(nn.Module):
                def __init__(self, p=0.1):
                    super().__init__()
                    self.p = p

                def forward(self, x):
                    return F.dropout(x, self.p, self.training)
        """,
        "models.py": """\
            import torch.nn as nn
            import torch.nn.functional as F
            from lib.models import Smooth

            class Wrapper(nn.Module):
                def __init__(self, features=16, noise=False):
                    super().__init__()
                    self.fc, self.smooth, self.noise = nn.Linear(features, 4), Smooth(), noise

                def forward(self, x):
                    x = F.dropout(x, 0.2) if self.noise else self.smooth(x)
                    return self.fc(x)
        """})
    assert "F.dropout(x, 0.2)" in (root / "models.py").read_text().splitlines()[10]
    claims = [{"rule": "TR513", "path": "models.py", "line": 11, "end_line": 11, "class": "Wrapper"}]
    verdict = verdicts(root, "Wrapper", claims)[("TR513", 11)]
    assert verdict["verdict"] == "undecided" and "never reached" in verdict["evidence"]


def test_a_softmax_over_the_batch_still_bounds_the_cross_entropy(code):
    # not a probability vector per row, but every entry is in [0, 1]: the loss has the same floor
    claims = [{"rule": "TR401", "path": "train.py", "line": 9, "end_line": 9, "class": None, "forward_of": "Ranker"}]
    verdict = verdicts(code, "Ranker", claims)[("TR401", 9)]
    assert verdict["verdict"] == "confirmed", verdict["evidence"]
    assert verdict["details"]["floor"] == pytest.approx(math.log(1 + 5 / math.e))
    assert verdict["details"]["reached"] >= verdict["details"]["floor"] - 1e-5
    assert "lies in [0, 1] without summing to 1 over its 6 classes (dim 1" in verdict["evidence"]


def test_the_floor_holds_for_any_input_in_the_unit_cube():
    from gpu_runner.confirm import cross_entropy_floor

    classes = 5
    inputs = torch.rand(20000, classes, generator=torch.Generator().manual_seed(1))
    target = torch.zeros(20000, dtype=torch.long)
    losses = torch.nn.functional.cross_entropy(inputs, target, reduction="none")
    assert float(losses.min()) >= cross_entropy_floor(classes)


def test_a_verdicts_details_from_the_child_are_bounded_like_its_other_text():
    from gpu_runner.runner import _sanitized

    verdict = {"rule": "TR513", "path": "m.py", "line": 3, "verdict": "confirmed", "evidence": "e",
               "details": {"p": 0.5, "note": "x" * 100_000, **{f"k{i}": i for i in range(1000)}}}
    clean = _sanitized({"status": "passed", "findings": [verdict]}, "m.py:Net")["findings"][0]["details"]
    assert clean["p"] == 0.5 and len(clean["note"]) <= 201 and len(clean) <= 20
