"""Training-loop findings confirmed by running the PR's training step (gpu_runner.confirm.confirm_step): a missing
zero_grad (TR101), a validation helper without model.eval() (TR201), a loss summed with its graph (TR104) and
gradients clipped while a GradScaler still scales them (TR713) are confirmed on a step that has the bug, refuted on
one that does not, and left undecided when the run cannot tell."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bot.smoke import RUNNER_CLAIM_KEYS, static_claims, with_claims  # noqa: E402
from gpu_runner.confirm import confirm_step  # noqa: E402
from gpu_runner.runner import STEP_DECIDABLE_RULES, TargetRequest  # noqa: E402
from gpu_runner.steps import smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_steps import MODELS  # noqa: E402 (Net: Linear, ReLU, Dropout, Linear)


# each training function has one bug the static engine reports; its twin in CORRECT does it right
BUGGY = '''
import torch
from models import Net


def fit_without_zero_grad(model, loader, optimizer, criterion, device):
    model.train()
    for x, y in loader:
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()


def fit_summing_losses(model, loader, optimizer, criterion, device):
    model.train()
    running = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        running += loss
    print(f"train loss {float(running.detach()) / len(loader):.3f}")


def fit_clipping_scaled(model, loader, optimizer, criterion, device):
    model.train()
    scaler = torch.amp.GradScaler(device)
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            loss = criterion(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()


def validate(model, loader, criterion, device):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += criterion(model(x.to(device)), y.to(device)).item()
    return total / len(loader)
'''

def _fixed(source: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


# the same functions with each bug fixed
CORRECT = _fixed(
    BUGGY,
    ("    for x, y in loader:\n        loss = criterion", "    for x, y in loader:\n        optimizer.zero_grad()\n"
                                                        "        loss = criterion"),
    ("running += loss\n", "running += loss.item()\n"),
    ("float(running.detach())", "running"),
    ("scaler.scale(loss).backward()\n", "scaler.scale(loss).backward()\n        scaler.unscale_(optimizer)\n"),
    ("    total = 0.0\n", "    model.eval()\n    total = 0.0\n"),
)

# a scaler that is off (as torch.cuda.amp.GradScaler is on a machine without CUDA): nothing is scaled, nothing shown
DISABLED = BUGGY.replace("torch.amp.GradScaler(device)", "torch.amp.GradScaler(device, enabled=False)")


def line_in(source: str, text: str, function: str) -> int:
    lines = source.lstrip("\n").splitlines()
    start = next(n for n, line in enumerate(lines, 1) if line.startswith(f"def {function}("))
    return next(n for n, line in enumerate(lines, 1) if n > start and text in line)


@pytest.fixture
def code(tmp_path):
    return write_tree(tmp_path, {"models.py": MODELS, "buggy.py": BUGGY.lstrip("\n"),
                                 "correct.py": CORRECT.lstrip("\n"), "disabled.py": DISABLED.lstrip("\n")})


def claims_of(code, name: str) -> list[dict]:
    found = static_claims({name: (code / name).read_text()}).get(name, [])
    return [{k: c[k] for k in RUNNER_CLAIM_KEYS if k in c} for c in found]


def moved(claims: list[dict], to: str, source: str) -> list[dict]:
    """The buggy file's claims, at the same statements of a file that does it right (the engine, rightly, flags
    nothing there): what a run says about a finding that is wrong."""
    texts = {"TR101": ("optimizer.step()", "fit_without_zero_grad"), "TR104": ("running +=", "fit_summing_losses"),
             "TR713": ("clip_grad_norm_", "fit_clipping_scaled"), "TR201": ("total +=", "validate")}
    out = []
    for claim in claims:
        text, function = texts[claim["rule"]]
        line = line_in(source, text, function)
        out.append({**claim, "path": to, "line": line, "end_line": line})
    return out


def run(code, target: str, claims: list[dict]) -> dict:
    report = confirm_step(lambda: smoke_step(code, target, None, device="cpu"), str(code), target, claims)
    return {f["rule"]: f for f in report.get("findings", [])}


def test_the_static_engine_hands_over_the_training_loop_findings(code):
    claims = claims_of(code, "buggy.py")
    assert sorted((c["rule"], c["line"]) for c in claims) == sorted([
        ("TR101", line_in(BUGGY, "optimizer.step()", "fit_without_zero_grad")),
        ("TR104", line_in(BUGGY, "running += loss", "fit_summing_losses")),
        ("TR713", line_in(BUGGY, "clip_grad_norm_", "fit_clipping_scaled")),
        ("TR201", line_in(BUGGY, "total +=", "validate"))])
    assert claims_of(code, "correct.py") == []
    # a step target gets its file's training-loop claims, a model target none of them
    requests = [TargetRequest("buggy.py:fit_summing_losses", kind="step"), TargetRequest("buggy.py:Net")]
    with_claims(requests, {"buggy.py": static_claims({"buggy.py": (code / "buggy.py").read_text()})["buggy.py"]})
    assert sorted(c["rule"] for c in requests[0].findings) == sorted(STEP_DECIDABLE_RULES)
    assert requests[1].findings == []


def test_missing_zero_grad_is_confirmed_and_a_step_that_zeroes_is_refuted(code):
    claims = claims_of(code, "buggy.py")
    found = run(code, "buggy.py:fit_without_zero_grad", claims)
    assert found["TR101"]["verdict"] == "confirmed"
    assert "gradients are not zeroed between optimizer steps" in found["TR101"]["evidence"]
    assert "TR104" not in found and "TR713" not in found  # other functions, never called by this step
    fixed = run(code, "correct.py:fit_without_zero_grad", moved(claims, "correct.py", CORRECT))
    assert fixed["TR101"]["verdict"] == "refuted" and "reset between each of" in fixed["TR101"]["evidence"]


def test_validation_without_eval_is_confirmed_and_one_that_sets_eval_is_refuted(code):
    claims = claims_of(code, "buggy.py")
    found = run(code, "buggy.py:fit_without_zero_grad", claims)["TR201"]
    assert found["verdict"] == "confirmed" and "validate runs the model in train mode" in found["evidence"]
    fixed = run(code, "correct.py:fit_without_zero_grad", moved(claims, "correct.py", CORRECT))["TR201"]
    assert fixed["verdict"] == "refuted" and "ran the model in eval mode" in fixed["evidence"]


def test_a_loss_summed_with_its_graph_is_confirmed_and_a_summed_number_is_refuted(code):
    claims = claims_of(code, "buggy.py")
    found = run(code, "buggy.py:fit_summing_losses", claims)["TR104"]
    assert found["verdict"] == "confirmed" and "`running` still held autograd history" in found["evidence"]
    assert found["details"]["nodes"] > 10
    fixed = run(code, "correct.py:fit_summing_losses", moved(claims, "correct.py", CORRECT))["TR104"]
    assert fixed["verdict"] == "refuted" and "`running` held float" in fixed["evidence"]


def test_clipping_scaled_gradients_is_confirmed_and_clipping_after_unscale_is_refuted(code):
    claims = claims_of(code, "buggy.py")
    found = run(code, "buggy.py:fit_clipping_scaled", claims)["TR713"]
    assert found["verdict"] == "confirmed" and found["details"]["scale"] == 65536.0
    assert "still multiplied by the GradScaler's scale 65536" in found["evidence"]
    fixed = run(code, "correct.py:fit_clipping_scaled", moved(claims, "correct.py", CORRECT))["TR713"]
    assert fixed["verdict"] == "refuted" and "already unscaled" in fixed["evidence"]


def test_a_disabled_scaler_or_a_step_that_cannot_run_leaves_the_finding_undecided(code):
    claims = moved(claims_of(code, "buggy.py"), "disabled.py", DISABLED)
    found = run(code, "disabled.py:fit_clipping_scaled", claims)["TR713"]
    assert found["verdict"] == "undecided" and "disabled on this device" in found["evidence"]
    broken_source = BUGGY.replace("loss.backward()\n        optimizer.step()", "raise ValueError('no data')", 1)
    (code / "broken.py").write_text(broken_source.lstrip("\n"))
    line = line_in(broken_source, "raise ValueError", "fit_without_zero_grad")
    claim = {"rule": "TR101", "path": "broken.py", "line": line, "end_line": line}
    broken = run(code, "broken.py:fit_without_zero_grad", [claim])
    assert broken["TR101"]["verdict"] == "undecided" and "could not run" in broken["TR101"]["evidence"]


def test_the_runner_returns_the_step_verdicts_in_the_targets_report(code):
    from gpu_runner.runner import run_targets
    from gpu_runner.sandbox import SandboxLimits

    claims = claims_of(code, "buggy.py")
    requests = [TargetRequest("buggy.py:fit_without_zero_grad", kind="step", findings=claims)]
    reports, _ = run_targets(code, requests, device="cpu", steps=5, seed=0, limits=SandboxLimits(timeout_s=120),
                             sandbox=False)
    verdicts = {f["rule"]: f["verdict"] for f in reports[0]["findings"]}
    assert verdicts == {"TR101": "confirmed", "TR201": "confirmed"}


class _LazyBox:
    @property
    def total(self):
        raise RuntimeError("computed on demand, and not now")


def _step_with_a_raising_accumulator():
    box = _LazyBox()
    return box


def test_an_observation_that_raises_never_reaches_the_step():
    import inspect

    from gpu_runner.confirm import _Function, _StepWatch

    lines, first = inspect.getsourcelines(_step_with_a_raising_accumulator)
    function = _Function("_step_with_a_raising_accumulator", first, first + len(lines) - 1)
    watch = _StepWatch(__file__, [function], {function: {"box.total"}}, [])
    with watch:
        assert isinstance(_step_with_a_raising_accumulator(), _LazyBox)
    assert watch.failures == 1 and watch.returned == {}


def test_torchreview_smoke_on_a_step_prints_its_verdicts(code, monkeypatch, capsys):
    from bot.cli import main

    (code / "epoch.py").write_text(BUGGY.lstrip("\n").replace("def fit_summing_losses(", "def train_one_epoch("))
    monkeypatch.chdir(code)
    main(["smoke", "epoch.py:train_one_epoch", "--device", "cpu"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Confirmed by running: TR104 loss-accumulated-with-graph at epoch.py:" in out
    assert "`running` still held autograd history" in out
