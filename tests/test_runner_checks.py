"""The smoke checks on real small models: healthy fixtures pass every applicable check, and each planted bug is
caught by the check meant for it (and named in its message)."""
from __future__ import annotations

import time
from dataclasses import asdict, replace

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from gpu_runner.checks import CHECK_NAMES, run_checks  # noqa: E402
from gpu_runner.compare import compare_reports  # noqa: E402
from gpu_runner.subject import Batch, Subject, TargetReport  # noqa: E402
from tests.runner_support import single_thread  # noqa: E402,F401 (an autouse fixture)

BATCH = 8
STEPS = 50


# --- subjects ---------------------------------------------------------------------------------------------

def classification_subject(model: nn.Module, input_shape: tuple, num_classes: int, name: str = "") -> Subject:
    def make_batch(batch_size: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn((batch_size, *input_shape), generator=generator)
        y = torch.randint(0, num_classes, (batch_size,), generator=generator)
        return Batch(args=(x,), kwargs={}, target=y, batch_size=batch_size)

    return Subject(name=name or type(model).__name__, model=model, make_batch=make_batch, loss_fn=F.cross_entropy,
                   task="classification", device="cpu", num_classes=num_classes)


def check(report: TargetReport, name: str):
    return next(result for result in report.checks if result.name == name)


def statuses(report: TargetReport) -> dict:
    return {result.name: result.status for result in report.checks}


def failed(report: TargetReport) -> set:
    return {result.name for result in report.checks if result.status == "fail"}


# --- healthy fixtures -------------------------------------------------------------------------------------

class MLPClassifier(nn.Module):
    def __init__(self, inputs=20, hidden=64, classes=10):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


class CNNWithBatchNorm(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.features(x))


class TinyTransformerLM(nn.Module):
    def __init__(self, vocab=50, dim=32, heads=2, context=16):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        length = ids.shape[1]
        positions = torch.arange(length, device=ids.device)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        hidden = self.blocks(self.tokens(ids) + self.positions(positions), mask=causal, is_causal=True)
        return self.head(hidden)


def language_model_subject(model: nn.Module, vocab=50, length=12) -> Subject:
    def make_batch(batch_size: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, vocab, (batch_size, length + 1), generator=generator)
        return Batch(args=(tokens[:, :-1],), kwargs={}, target=tokens[:, 1:], batch_size=batch_size)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return Subject(name=type(model).__name__, model=model, make_batch=make_batch, loss_fn=loss_fn,
                   task="language_model", device="cpu", num_classes=vocab, integer_inputs=True)


class LSTMClassifier(nn.Module):
    def __init__(self, features=8, hidden=32, classes=5):
        super().__init__()
        self.rnn = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        outputs, _ = self.rnn(x)
        return self.head(outputs[:, -1])


class TwoInputModel(nn.Module):
    """An image-like input and a side-feature vector, fused."""

    def __init__(self, classes=4):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.side = nn.Sequential(nn.Linear(6, 32), nn.ReLU())
        self.head = nn.Linear(64, classes)

    def forward(self, image, side):
        return self.head(torch.cat([self.image(image), self.side(side)], dim=-1))


def two_input_subject(model: nn.Module, classes=4) -> Subject:
    def make_batch(batch_size: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        return Batch(args=(torch.randn(batch_size, 12, generator=generator),),
                     kwargs={"side": torch.randn(batch_size, 6, generator=generator)},
                     target=torch.randint(0, classes, (batch_size,), generator=generator), batch_size=batch_size)

    return Subject(name=type(model).__name__, model=model, make_batch=make_batch, loss_fn=F.cross_entropy,
                   task="classification", device="cpu", num_classes=classes)


def healthy_subjects() -> dict:
    torch.manual_seed(0)
    return {
        "mlp": classification_subject(MLPClassifier(), (20,), 10),
        "cnn-batchnorm": classification_subject(CNNWithBatchNorm(), (3, 16, 16), 10),
        "transformer-lm": language_model_subject(TinyTransformerLM()),
        "lstm": classification_subject(LSTMClassifier(), (10, 8), 5),
        "two-input": two_input_subject(TwoInputModel()),
    }


HEALTHY = healthy_subjects()

# train-eval-differ applies only where there is Dropout or BatchNorm; gradient-health where there are two
# Linear/Conv layers to compare
EXPECTED_SKIPS = {"mlp": set(), "cnn-batchnorm": set(), "transformer-lm": set(),
                  "lstm": {"train-eval-differ", "gradient-health"}, "two-input": {"train-eval-differ"}}


@pytest.fixture(scope="module")
def healthy_reports(single_thread) -> dict:  # noqa: F811 (the fixture, imported above)
    return {key: run_checks(subject, steps=STEPS, seed=0, batch_size=BATCH) for key, subject in HEALTHY.items()}


@pytest.mark.parametrize("key", list(HEALTHY))
def test_healthy_fixture_passes_every_applicable_check(healthy_reports, key):
    report = healthy_reports[key]
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    problems = {c.name: c.message for c in report.checks if c.status not in ("pass", "skip")}
    assert not problems, problems
    assert {c.name for c in report.checks if c.status == "skip"} == EXPECTED_SKIPS[key]
    assert report.status == "passed"
    for result in report.checks:
        assert result.message and "\n" not in result.message


@pytest.mark.parametrize("key", list(HEALTHY))
def test_healthy_fixture_measures(healthy_reports, key):
    measures = healthy_reports[key].measures
    model = HEALTHY[key].model
    assert measures["params"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert measures["step_time_ms"] > 0
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert measures["peak_memory_bytes"] > 4 * parameter_bytes  # parameters, gradients, Adam's two moments, activations
    overfit = check(healthy_reports[key], "overfit-batch").details["runs"]["0.001"]
    assert measures["loss_after_steps"] == overfit["final"] < overfit["initial"]


def test_mlp_suite_is_fast_and_deterministic():
    subject = classification_subject(MLPClassifier(), (20,), 10)
    started = time.perf_counter()
    first = run_checks(subject, steps=STEPS)
    assert time.perf_counter() - started < 5
    second = run_checks(subject, steps=STEPS)
    assert [(c.name, c.status, c.message) for c in first.checks] == [(c.name, c.status, c.message) for c in second.checks]
    assert first.measures["loss_after_steps"] == second.measures["loss_after_steps"]


def test_checks_do_not_modify_the_subjects_model():
    subject = classification_subject(CNNWithBatchNorm(), (3, 16, 16), 10)
    before = {k: v.clone() for k, v in subject.model.state_dict().items()}
    run_checks(subject, steps=STEPS)
    after = subject.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# --- planted bugs -----------------------------------------------------------------------------------------

class DetachedEncoder(MLPClassifier):
    def forward(self, x):
        return self.head(self.encoder(x).detach())


def test_detached_encoder_fails_gradients_naming_the_encoder():
    report = run_checks(classification_subject(DetachedEncoder(), (20,), 10), steps=STEPS)
    gradients = check(report, "gradients")
    assert gradients.status == "fail"
    assert gradients.message.startswith("encoder.0.weight, encoder.0.bias get no gradient")
    assert gradients.details["no_gradient"] == ["encoder.0.weight", "encoder.0.bias"]
    assert report.status == "failed"


class UnusedParameter(MLPClassifier):
    def __init__(self):
        super().__init__()
        self.projection = nn.Linear(64, 64)  # built, never called


def test_unused_parameter_fails_gradients_naming_it():
    report = run_checks(classification_subject(UnusedParameter(), (20,), 10), steps=STEPS)
    gradients = check(report, "gradients")
    assert gradients.status == "fail"
    assert "projection.weight, projection.bias get no gradient: detached from the loss or unused" in gradients.message
    assert failed(report) == {"gradients"}


class SoftmaxOverBatch(nn.Module):
    """Attention-style pooling weights normalised over the wrong dim: dim 0 is the batch."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(20, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        hidden = self.encoder(x)
        return self.head(hidden * torch.softmax(hidden, dim=0))


def test_softmax_over_batch_fails_batch_leakage():
    report = run_checks(classification_subject(SoftmaxOverBatch(), (20,), 10), steps=STEPS)
    leakage = check(report, "batch-leakage")
    assert leakage.status == "fail"
    assert leakage.message.startswith("output row 0 depends on input row")
    assert "information leaks across the batch" in leakage.message
    # and a batch of 4 differs from the first 4 rows of a batch of 8
    assert check(report, "eval-determinism").status == "fail"


class BatchCenteredLM(TinyTransformerLM):
    def forward(self, ids):
        length = ids.shape[1]
        hidden = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        hidden = hidden - hidden.mean(dim=0, keepdim=True)  # "centering" over dim 0, which is the batch
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        return self.head(self.blocks(hidden, mask=causal, is_causal=True))


def test_leakage_in_a_token_model_is_found_through_the_embedding():
    leakage = check(run_checks(language_model_subject(BatchCenteredLM()), steps=STEPS), "batch-leakage")
    assert leakage.status == "fail"
    assert leakage.message.startswith("output row 0 depends on input row")
    assert "(through the output of embedding 'tokens')" in leakage.message


class DoubleSoftmax(MLPClassifier):
    def forward(self, x):
        return torch.softmax(super().forward(x), dim=-1)  # then F.cross_entropy applies log_softmax again


def test_double_softmax_fails_overfit_not_loss_at_init():
    # probabilities in [0, 1] as logits cap what cross-entropy can reach: ln(1 + (C-1)/e) = 1.46 for C = 10,
    # above half of ln 10 = 1.15, so no number of steps gets there; the initial loss is exactly ln C.
    report = run_checks(classification_subject(DoubleSoftmax(), (20,), 10), steps=STEPS)
    assert check(report, "loss-at-init").status == "pass"
    overfit = check(report, "overfit-batch")
    assert overfit.status == "fail"
    assert "cannot fit a single batch" in overfit.message and "double softmax" in overfit.message
    assert failed(report) == {"overfit-batch"}


class LogFeatures(nn.Module):
    def forward(self, x):
        return torch.log(torch.relu(x))  # log(0) = -inf wherever x <= 0


class LogOfZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(20, 32)
        self.features = LogFeatures()
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(self.encoder(x)))


def test_log_of_zero_is_localized_to_its_module():
    report = run_checks(classification_subject(LogOfZero(), (20,), 10), steps=STEPS)
    localization = check(report, "nan-localization")
    assert localization.status == "fail"
    assert localization.message == "first non-finite output in module 'features' (LogFeatures) at init."
    assert "non-finite" in check(report, "forward-contract").message


class NaNInForwardCode(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(20, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.sqrt(self.encoder(x)))  # sqrt of negatives, in the model's own forward


def test_nan_made_between_modules_points_at_the_enclosing_forward():
    localization = check(run_checks(classification_subject(NaNInForwardCode(), (20,), 10), steps=STEPS),
                         "nan-localization")
    assert localization.status == "fail"
    assert localization.message.startswith("first non-finite value is an input to module 'head' (Linear)")


class SqrtOfZero(MLPClassifier):
    def forward(self, x):
        hidden = self.encoder(x)
        return self.head(hidden + torch.sqrt(hidden - hidden.detach()))  # 0 forward, inf/nan backward


def test_nan_only_in_backward_names_the_forward_line():
    report = run_checks(classification_subject(SqrtOfZero(), (20,), 10), steps=STEPS)
    assert "non-finite gradient" in check(report, "gradients").message
    localization = check(report, "nan-localization")
    assert localization.status == "fail"
    assert localization.message.startswith("the forward is finite but the backward is not at init: SqrtBackward0 "
                                           "turns finite gradients into NaN/Inf (the op at test_runner_checks.py:")
    assert "return self.head(hidden + torch.sqrt(hidden - hidden.detach()))" in localization.message


class LogGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.01))

    def forward(self, x):
        return torch.log(self.scale * x.abs())  # NaN once training pushes scale below 0


class DivergesWhileTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(20, 10)
        self.gate = LogGate()

    def forward(self, x):
        return self.gate(self.encoder(x))


def test_nan_that_appears_during_training_is_replayed_to_its_step():
    subject = classification_subject(DivergesWhileTraining(), (20,), 10)
    subject.task, subject.loss_fn = "custom", lambda output, target: output.mean()
    report = run_checks(subject, steps=STEPS)
    assert check(report, "forward-contract").status == "pass"  # finite at init
    localization = check(report, "nan-localization")
    assert localization.status == "fail"
    step = localization.details["event"]["step"]
    assert 0 < step < STEPS and localization.details["event"]["check"] == "overfit-batch"
    assert localization.message == f"first non-finite output in module 'gate' (LogGate) at step {step} of training at lr 0.001."


class ZerosWithoutDevice(nn.Module):
    def __init__(self, pass_device: bool):
        super().__init__()
        self.pass_device = pass_device
        self.encoder = nn.Linear(20, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        hidden = self.encoder(x)
        if self.pass_device:
            offset = torch.zeros(hidden.shape, device=x.device) + x.new_zeros(32) + torch.zeros_like(hidden)
        else:
            offset = torch.zeros(hidden.shape)
        return self.head(torch.relu(hidden + offset) * torch.tensor(1.0))


def test_zeros_without_device_fails_device_placement_on_cpu():
    report = run_checks(classification_subject(ZerosWithoutDevice(pass_device=False), (20,), 10), steps=STEPS)
    placement = check(report, "device-placement")
    assert placement.status == "fail"
    assert placement.message.startswith("forward creates a tensor on the CPU without device= (torch.zeros at test_runner_checks.py:")
    assert "offset = torch.zeros(hidden.shape)" in placement.message  # the offending line
    assert failed(report) == {"device-placement"}


def test_zeros_with_device_passes_device_placement():
    report = run_checks(classification_subject(ZerosWithoutDevice(pass_device=True), (20,), 10), steps=STEPS)
    assert check(report, "device-placement").status == "pass"
    assert check(report, "device-placement").details["mode"] == "fake-meta"


class MatmulWithCPUConstant(nn.Module):
    """Plain meta tensors let ``meta @ cpu`` through; fake tensors do not."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(20, 10)

    def forward(self, x):
        return self.encoder(x) @ torch.eye(10)


def test_matmul_with_cpu_constant_fails_device_placement():
    placement = check(run_checks(classification_subject(MatmulWithCPUConstant(), (20,), 10), steps=STEPS),
                      "device-placement")
    assert placement.status == "fail" and "torch.eye(10)" in placement.message


class UnregisteredTensorAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(20, 10)
        self.class_bias = torch.linspace(-1, 1, 10)  # not a buffer: model.to("cuda") leaves it on the CPU

    def forward(self, x):
        return self.encoder(x) + self.class_bias


def test_unregistered_tensor_attribute_fails_device_placement():
    placement = check(run_checks(classification_subject(UnregisteredTensorAttribute(), (20,), 10), steps=STEPS),
                      "device-placement")
    assert placement.status == "fail"
    assert placement.message.startswith("class_bias is a plain tensor attribute that model.to(device) does not move")


class TableMadeWhereItIsTold(nn.Module):
    """Built on the device its constructor is given, as torch's own layers take ``device=``: where the program
    builds it, the table is where the model runs."""

    def __init__(self, device="cpu"):
        super().__init__()
        self.encoder = nn.Linear(20, 10)
        self.table = torch.linspace(-1, 1, 10, device=device)

    def forward(self, x):
        return self.encoder(x) + self.table


def test_a_tensor_attribute_made_where_the_constructor_is_told_is_undecided():
    placement = check(run_checks(classification_subject(TableMadeWhereItIsTold(), (20,), 10), steps=STEPS),
                      "device-placement")
    assert placement.status == "skip" and "constructor takes the device" in placement.message


class DataDependentWithoutDevice(nn.Module):
    """.item() cannot run on fake tensors, so the check falls back to recording factory calls."""

    def __init__(self, pass_device: bool):
        super().__init__()
        self.pass_device = pass_device
        self.encoder = nn.Linear(20, 10)

    def forward(self, x):
        hidden = self.encoder(x)
        scale = 1.0 + 0.0 * hidden.abs().max().item()
        bias = torch.ones(10, device=x.device) if self.pass_device else torch.ones(10)
        return hidden * scale + bias


def test_device_placement_falls_back_to_recording_factories():
    bad = check(run_checks(classification_subject(DataDependentWithoutDevice(False), (20,), 10), steps=STEPS),
                "device-placement")
    assert bad.status == "warn"
    assert bad.details["mode"] == "recorded factory calls"
    assert bad.message.startswith("forward calls torch.ones at ")
    assert "bias = torch.ones(10, device=x.device) if self.pass_device else torch.ones(10)" in bad.message
    good = check(run_checks(classification_subject(DataDependentWithoutDevice(True), (20,), 10), steps=STEPS),
                 "device-placement")
    assert good.status == "pass" and good.details["mode"] == "recorded factory calls"


class HotInitialisation(MLPClassifier):
    def __init__(self):
        super().__init__()
        with torch.no_grad():
            self.head.weight.mul_(50)


def test_hot_initialisation_fails_loss_at_init():
    loss_at_init = check(run_checks(classification_subject(HotInitialisation(), (20,), 10), steps=STEPS), "loss-at-init")
    assert loss_at_init.status == "fail"
    assert "is far above ln(10)=2.3: the output layer is initialised too hot" in loss_at_init.message


class DropoutInEval(MLPClassifier):
    def forward(self, x):
        return self.head(F.dropout(self.encoder(x), 0.5))  # training=True by default, also in eval


def test_functional_dropout_in_eval_fails_eval_determinism():
    determinism = check(run_checks(classification_subject(DropoutInEval(), (20,), 10), steps=STEPS), "eval-determinism")
    assert determinism.status == "fail" and "two eval-mode forwards on the same batch differ" in determinism.message


class IgnoresInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(10))

    def forward(self, x):
        return self.logits.expand(x.shape[0], 10)


def test_output_independent_of_input_fails_input_dependence():
    report = run_checks(classification_subject(IgnoresInput(), (20,), 10), steps=STEPS)
    assert check(report, "input-dependence").message == ("the output does not depend on the input: replacing every "
                                                         "input with zeros (constant tokens) leaves it unchanged.")
    assert check(report, "input-dependence").status == "fail"


class IgnoresSideInput(TwoInputModel):
    def forward(self, image, side):
        return self.head(torch.cat([self.image(image), self.side(torch.zeros_like(side))], dim=-1))


def test_ignored_second_input_warns():
    dependence = check(run_checks(two_input_subject(IgnoresSideInput()), steps=STEPS), "input-dependence")
    assert dependence.status == "warn" and dependence.message.startswith("input 'side' does not affect the output")


class DropoutWithoutEvalSwitch(MLPClassifier):
    def forward(self, x):
        return self.head(F.dropout(self.encoder[1](self.encoder[0](x)), 0.1, training=False))


def test_dropout_module_never_used_in_either_mode_fails_train_eval_differ():
    differ = check(run_checks(classification_subject(DropoutWithoutEvalSwitch(), (20,), 10), steps=STEPS),
                   "train-eval-differ")
    assert differ.status == "fail" and "encoder.2 (Dropout)" in differ.message


class RaisesInTrainMode(MLPClassifier):
    def forward(self, x):
        if self.training and x.requires_grad is False and torch.is_grad_enabled():
            raise ValueError("boom in training")
        return super().forward(x)


def test_a_check_that_raises_fails_alone_and_the_others_still_run():
    report = run_checks(classification_subject(RaisesInTrainMode(), (20,), 10), steps=STEPS)
    gradients = check(report, "gradients")
    assert gradients.status == "fail" and "ValueError: boom in training" in gradients.message
    assert gradients.details["error"] and "raise ValueError" in gradients.details["where"]
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert check(report, "forward-contract").status == "pass"  # runs under no_grad
    assert check(report, "batch-leakage").status == "pass"


def test_make_batch_error_is_an_error_report():
    subject = classification_subject(MLPClassifier(), (20,), 10)
    subject.make_batch = lambda batch_size, seed: 1 / 0
    report = run_checks(subject)
    assert report.status == "error" and "ZeroDivisionError" in report.reason


def test_regression_task_skips_loss_at_init():
    subject = classification_subject(MLPClassifier(classes=3), (20,), 3)
    subject.task, subject.loss_fn = "regression", lambda out, y: F.mse_loss(out, torch.zeros_like(out))
    report = run_checks(subject, steps=20)
    assert check(report, "loss-at-init").status == "skip"
    assert report.status == "passed"


class ComputesItsOwnLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(20, 6)

    def forward(self, x, targets):
        return F.cross_entropy(self.body(x), targets)


def test_custom_model_returning_its_own_loss_passes():
    def make_batch(batch_size: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        return Batch(args=(torch.randn(batch_size, 20, generator=generator),
                           torch.randint(0, 6, (batch_size,), generator=generator)), kwargs={}, target=None,
                     batch_size=batch_size)

    subject = Subject(name="own-loss", model=ComputesItsOwnLoss(), make_batch=make_batch,
                      loss_fn=lambda output, target: output, task="custom", device="cpu")
    report = run_checks(subject, steps=STEPS)
    assert report.status == "passed", [(c.name, c.message) for c in report.checks if c.status != "pass"]
    assert check(report, "forward-contract").message.startswith("forward returns a finite scalar")
    assert {c.name for c in report.checks if c.status == "skip"} == {"loss-at-init", "batch-leakage",
                                                                       "train-eval-differ", "gradient-health"}


# --- compare ----------------------------------------------------------------------------------------------

def test_compare_flags_step_time_and_memory_regressions():
    base = TargetReport("t", "passed", measures={"params": 100, "step_time_ms": 10.0, "peak_memory_bytes": 1000,
                                                 "loss_after_steps": 0.5})
    head = TargetReport("t", "passed", measures={"params": 120, "step_time_ms": 13.0, "peak_memory_bytes": 1100,
                                                 "loss_after_steps": 0.4})
    rounds = [[10.0 + i * 0.01 for i in range(10)]] * 3
    head_dict = {**asdict(head), "step_time_rounds": [[t * 1.3 for t in r] for r in rounds]}
    rows = {row["measure"]: row for row in compare_reports(head_dict, {**asdict(base), "step_time_rounds": rounds})}
    assert rows["step time"]["status"] == "warning" and rows["step time"]["change"] == "+30%"
    assert rows["peak memory"]["status"] == "ok"
    assert rows["parameters"]["change"] == "+20" and rows["parameters"]["status"] == "ok"
    assert rows["loss after steps"]["change"] == "-0.1000"
    strict_memory = {row["measure"]: row for row in compare_reports(asdict(head), asdict(base),
                                                                   {"step_time": 0.5, "memory": 0.05})}
    assert strict_memory["peak memory"]["status"] == "warning" and strict_memory["step time"]["status"] == "ok"


class ZeroGatedDownsample(nn.Module):
    """LeViT's shape: a block without a residual ends in a BatchNorm whose weight starts at exactly zero, so at
    initialization every sample leaves it as the same constant and nothing before it gets a gradient."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(20, 32)
        self.down = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16))
        nn.init.zeros_(self.down[1].weight)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Dropout(0.1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.down(torch.relu(self.stem(x)))
        return self.head(x + self.block(x))


def test_a_zero_initialized_gate_is_not_called_a_dead_path():
    report = run_checks(classification_subject(ZeroGatedDownsample(), (20,), 10), steps=STEPS)
    assert not failed(report) & {"gradients", "input-dependence", "train-eval-differ"}, report.checks
    assert "down.1.weight" in check(report, "input-dependence").message
    health = check(report, "gradient-health")  # judged once the gate opened: not "vanishing", not "barely move"
    assert health.status == "pass" and health.details["update_ratio"][0] > 1e-3, health.message


class ZeroGatedIgnoresInput(IgnoresInput):
    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(1))  # ReZero's gate

    def forward(self, x):
        return self.logits.expand(x.shape[0], 10) * (1 + self.alpha)


def test_a_dead_path_is_still_a_failure_unless_a_gate_starts_closed():
    # IgnoresInput's logits start at zero too: a zero vector is not a gate, so its dead path still fails
    assert check(run_checks(classification_subject(IgnoresInput(), (20,), 10), steps=STEPS),
                 "input-dependence").status == "fail"
    gated = check(run_checks(classification_subject(ZeroGatedIgnoresInput(), (20,), 10), steps=STEPS), "input-dependence")
    assert gated.status == "warn" and "alpha" in gated.message


def test_a_hot_start_on_guessed_inputs_is_undecided():
    """Logits scale with the inputs: when the runner guessed them, a high initial loss says nothing about the
    initialisation (a graph network fed unit-variance noise where its data are normalised counts)."""

    subject = replace(classification_subject(HotInitialisation(), (20,), 10), inputs_guessed=True)
    loss_at_init = check(run_checks(subject, steps=STEPS), "loss-at-init")
    assert loss_at_init.status == "skip" and loss_at_init.message.startswith("undecided:")
    assert loss_at_init.details["undecided"] is True


class Float32Only(nn.Module):
    """A model that cannot run in float64 (a float32 tensor of its own, not a parameter or buffer), whose outputs
    for a row move by ``wobble`` (relative) with the rows beside it: ``wobble`` ~ rounding, or a real dependence."""

    def __init__(self, wobble: float):
        super().__init__()
        self.wobble = wobble
        self.head = nn.Linear(20, 10)

    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("float32 only")  # as a model mixing in float32 tensors of its own
        return self.head(x) * (1 + self.wobble * (x.shape[0] > 4))  # the halves of 8 and 6 rows see 4 and 3


def test_a_batch_difference_float64_cannot_explain_is_undecided_when_rounding_sized_and_failed_when_large():
    small = check(run_checks(classification_subject(Float32Only(3e-4), (20,), 10), steps=STEPS), "eval-determinism")
    assert small.status == "skip" and small.message.startswith("undecided:"), small.message
    assert "cannot run in float64" in small.message
    large = check(run_checks(classification_subject(Float32Only(0.5), (20,), 10), steps=STEPS), "eval-determinism")
    assert large.status == "fail", large.message
    assert "depend on the batch" in large.message


class RecordsPrecisionFlags(MLPClassifier):
    seen: list

    def forward(self, x):
        self.seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return super().forward(x)


def test_the_checks_run_without_tf32_and_leave_the_users_defaults_as_they_were():
    model = RecordsPrecisionFlags()
    model.seen = []
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        run_checks(classification_subject(model, (20,), 10), steps=STEPS)
        assert model.seen and set(model.seen[:10]) == {(False, False)}
        assert torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


class DeadUnitsOut(nn.Module):
    """A hidden layer that ends in its ReLU, its units mostly off for the runner's input: under a cross-entropy the
    runner guessed, an off class gets no gradient and the loss barely falls, which says nothing about the layer."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(20, 10)
        with torch.no_grad():
            self.proj.bias.fill_(-30.0)

    def forward(self, x):
        return F.relu(self.proj(x))


def test_a_relu_output_under_a_guessed_cross_entropy_is_undecided_not_failed():
    subject = classification_subject(DeadUnitsOut(), (20,), 10)
    guessed = run_checks(replace(subject, objective_guessed=True), steps=STEPS)
    overfit = check(guessed, "overfit-batch")
    assert overfit.status == "skip" and overfit.message.startswith("undecided: the output is a ReLU's"), overfit
    # given by whoever configured it, the same objective is a real one: the layer cannot fit it
    assert check(run_checks(subject, steps=STEPS), "overfit-batch").status == "fail"
