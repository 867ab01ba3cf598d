"""Smoke checks on a built Subject: Karpathy's recipe turned into numeric pass/fail checks.

``run_checks`` runs every check on the model reset to its initial state (and a copy of one fixed batch),
seeded, so no check can disturb another and a rerun gives the same report; the remaining checks still run
when one raises.

Checks, in order (see each function's docstring for its exact criterion):
forward-contract, module-registration, loss-at-init, gradients, gradient-health, params-change, overfit-batch,
input-dependence, batch-leakage, eval-determinism, train-eval-differ, device-placement, nan-localization.
A check that raises in the model's code is a ``fail``; one that raises in the runner's own code (or in torch
called by it) is an ``error`` of that check, never the model's failure.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import inspect
import math
import os
import re
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from gpu_runner import forward_body
from gpu_runner.subject import OUT_OF_MEMORY_REASON, Batch, CheckResult, Subject, TargetReport, out_of_memory, phase

# --- thresholds (calibrated on the healthy fixtures in tests/test_runner_checks.py) -----------------------

OVERFIT_LEARNING_RATES = (1e-3, 3e-3, 1e-2)  # Adam; each next one only when the one before does not get there
OVERFIT_TARGET_FRACTION = 0.5  # pass when the loss falls to half its initial value (or less)
# short of half: still a pass when the loss fell by a quarter (the model learns, only slower than ``steps`` allow),
# a warning from a tenth, a failure below that (it does not learn) or when it diverged or is a double softmax
OVERFIT_PASS_PROGRESS = 0.25
# a reachable regression target can be close enough that Adam's first steps (each parameter moves by ~lr)
# overshoot it: smaller learning rates too, tried last
REACHABLE_EXTRA_LEARNING_RATES = (3e-4, 1e-4)
OVERFIT_SLOW_FRACTION = 0.1
PARAMS_CHANGE_LR = 1e-3
# |loss0 - ln C| must stay below LOSS_AT_INIT_RELATIVE * ln C + LOSS_AT_INIT_ABSOLUTE
LOSS_AT_INIT_RELATIVE = 0.5
LOSS_AT_INIT_ABSOLUTE = 0.5
LOSS_AT_INIT_BATCHES = 3  # the fixed batch and two more, averaged, so 8 samples of noise do not decide it
LEAKAGE_RELATIVE_TOLERANCE = 1e-6  # |d out[i] / d x[j]| against |d out[i] / d x[i]|
OUTPUT_MATCH_TOLERANCE = 1e-4  # eval determinism and batch-size invariance, relative to the output's scale
INPUT_DEPENDENCE_TOLERANCE = 1e-6  # relative change of the output when the inputs are blanked
TRAIN_EVAL_MIN_DIFFERENCE = 1e-6  # relative; Dropout/BatchNorm move outputs by far more (>1e-2 on the fixtures)
TIMING_WARMUP_STEPS = 3
TIMING_STEPS = 10
SCALED_TIMING_STEPS = (1, 5)  # warm-up and timed steps for a model scaled down to fit the time budget


_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)
_RUNNER_DIR = os.path.dirname(_THIS_FILE) + os.sep


# --- shared state of one run ------------------------------------------------------------------------------

@dataclass
class NonFiniteEvent:
    """Where a check saw NaN/Inf, so that nan-localization can replay exactly that computation."""

    check: str
    what: str  # "output", "loss", "gradient"
    lr: Optional[float] = None  # set when it happened during training
    step: Optional[int] = None


_GATE_NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def _starts(names: list) -> str:
    return "starts" if len(names) == 1 else "start"


OPENING_STEPS = 3  # Adam steps that open a zero-initialized gate before a dead path is called a bug


@dataclass
class _Run:
    subject: Subject
    steps: int
    seed: int
    batch_size: int
    fixed_batch: Batch
    steps_cut: bool = False  # fewer steps than asked for, to fit the time budget
    scaled: bool = False  # smaller batches or fewer steps than asked for, to fit the time budget
    over_budget: bool = False  # too slow for the budget even at the smallest batch, steps and input
    budget_cause: str = ""  # when over_budget: the step time, input and budget that make it so
    nonfinite_events: list[NonFiniteEvent] = field(default_factory=list)
    loss_after_steps: Optional[float] = None

    _initial: Optional[dict] = None
    _warmed: Optional[dict] = None
    _zero_gates: Optional[list] = None

    def model(self) -> nn.Module:
        """The subject's model reset to its initial state: parameters, buffers, requires_grad flags, no
        gradients, train mode. The same object every time (a deep copy is not faithful: a forward written as a
        lambda over a submodule, ``self.f = lambda x: m.fc(x)``, would keep calling the original's layers)."""
        model = self.subject.model
        if self._initial is None:
            self._initial = _snapshot(model)
        _restore(model, self._initial)
        return model.train()

    def eval_model(self) -> nn.Module:
        """The model in eval mode, its BatchNorm running statistics from a few batches seen in train mode (an
        untrained net's running mean 0 / var 1 would judge eval mode on statistics no trained model has)."""
        model = self.model()
        if self._warmed is None:
            _warm_batch_norm(model, self.subject, self.batch_size, self.seed)
            self._warmed = _snapshot(model)
        _restore(model, self._warmed)
        return model.eval()

    def opened_model(self) -> tuple[nn.Module, list[str]]:
        """The model after ``OPENING_STEPS`` Adam steps on the fixed batch, in train mode, and the trainable
        parameters that were exactly zero at initialization but get a gradient. Zero-initialized gates (the
        last BatchNorm of a LeViT block, ReZero, zero-init residuals) cut the path from the input to the loss
        at initialization on purpose; the first steps open it. Judging a dead path needs this model too."""
        model = self.model()
        loss = _loss(self, _forward(model, self.batch()), self.batch())
        opened = []
        if loss.requires_grad:
            loss.backward()
            opened = [n for n, p in _trainable(model)
                      if not bool(p.detach().any()) and p.grad is not None and bool(p.grad.any())]
        model.zero_grad(set_to_none=True)
        if opened:
            optimizer = torch.optim.Adam([p for _, p in _trainable(model)], lr=PARAMS_CHANGE_LR)
            for _ in range(OPENING_STEPS):
                optimizer.zero_grad(set_to_none=True)
                _loss(self, _forward(model, self.batch()), self.batch()).backward()
                optimizer.step()
            model.zero_grad(set_to_none=True)
        return model.train(), opened

    def zero_gates(self) -> list[str]:
        """Gates that start exactly closed: a normalization layer's weight zeroed so a block starts as identity or
        as a constant (LeViT, zero-init residuals), or a single-number multiplier at zero (ReZero's alpha).
        Until they open the output may not depend on the input at all, so a dead path there is not evidence of
        a bug. Other zero parameters (a logits vector, a class token) are not gates."""
        if self._zero_gates is None:
            model = self.model()
            gates = [f"{module_name}.weight" if module_name else "weight"
                     for module_name, module in model.named_modules()
                     if isinstance(module, _GATE_NORMS) and isinstance(getattr(module, "weight", None), nn.Parameter)
                     and module.weight.requires_grad and not bool(module.weight.detach().any())]
            gates += [n for n, p in _trainable(model) if p.numel() == 1 and not bool(p.detach().any())]
            self._zero_gates = gates
        return self._zero_gates

    def batch(self) -> Batch:
        """A private copy of the fixed batch (a forward that modifies its input in place cannot leak)."""
        return copy.deepcopy(self.fixed_batch)

    def seed_everything(self, offset: int = 0) -> None:
        torch.manual_seed(self.seed + offset)

    def note_nonfinite(self, check: str, what: str, lr: Optional[float] = None, step: Optional[int] = None) -> None:
        self.nonfinite_events.append(NonFiniteEvent(check, what, lr, step))


BATCH_NORM_WARMUP_BATCHES = 4


def _snapshot(model: nn.Module) -> dict:
    return {"state": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
                      if isinstance(v, torch.Tensor)},
            "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()}}


def _restore(model: nn.Module, snapshot: dict) -> None:
    with torch.no_grad():
        for key, value in model.state_dict(keep_vars=True).items():
            saved = snapshot["state"].get(key)
            if isinstance(value, torch.Tensor) and saved is not None:
                if value.shape == saved.shape and value.dtype == saved.dtype:
                    value.copy_(saved)
    for name, param in model.named_parameters():
        param.grad = None
        param.requires_grad_(snapshot["requires_grad"].get(name, param.requires_grad))


def _warm_batch_norm(model: nn.Module, subject: Subject, batch_size: int, seed: int) -> None:
    """Sets the BatchNorm running statistics of ``model`` to the cumulative average over a few batches seen in
    train mode (no gradient, no parameter change)."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            momenta[module] = module.momentum
            module.reset_running_stats()
            module.momentum = None  # a cumulative moving average
    if not momenta:
        return
    model.train()
    try:
        with torch.no_grad():
            for index in range(BATCH_NORM_WARMUP_BATCHES):
                batch = subject.make_batch(batch_size, seed + 1000 + index)
                model(*batch.args, **batch.kwargs)
    finally:
        for module, momentum in momenta.items():
            module.momentum = momentum


# --- public API -------------------------------------------------------------------------------------------

CHECK_STEP_EQUIVALENTS = 7  # training steps the checks take per --steps (measured: 6.3 on a small ViT)
SMALLER_BATCHES = (4, 2)
FEWEST_STEPS = 5  # a model too slow even on batches of 2 is checked with fewer steps, not fewer than this
# the measures after the checks, in training steps: a scaled run's warm-up and timed steps and the step whose
# tensors are counted (part of the target's time, so part of its plan)
MEASURE_STEPS = sum(SCALED_TIMING_STEPS) + 1


def _planned_seconds(steps: int, step_s: float) -> float:
    """What the checks and the measures after them take, for a training step of ``step_s`` seconds."""
    return (CHECK_STEP_EQUIVALENTS * steps + MEASURE_STEPS) * step_s


def _timed_step(subject: Subject, batch_size: int, seed: int) -> float:
    model = subject.model
    batch = subject.make_batch(batch_size, seed)
    started = time.perf_counter()
    subject.loss_fn(model(*batch.args, **batch.kwargs), batch.target).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def _scaled_to_budget(subject: Subject, steps: int, batch_size: int, budget_s: float,
                      seed: int) -> tuple[int, int, str, float]:
    """The batch size (``batch_size``, else 4, else 2) and number of steps (``steps``, else fewer, down to 5) at
    which a timed training step says the checks fit in ``budget_s`` seconds, and a note when they are smaller: a
    slow model is checked smaller rather than killed at the per-target timeout. The smallest batch is timed first:
    it is cheap, a bigger batch's step costs at least as much and (the samples of a batch share the work) at most
    in proportion, so a bigger batch is timed only when those bounds do not decide it; a slow model never pays
    for a full-batch step it cannot afford. The first step of a model pays for its allocations, so a step that
    looks a little too slow is timed again. Also returns the training step's time at the batch chosen (0 when it
    could not be timed). The model's state is restored."""
    model = subject.model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def cost(step_s: float) -> float:
        return _planned_seconds(steps, step_s)

    def timed(size: int) -> float:
        step_s = _timed_step(subject, size, seed)
        if budget_s < cost(step_s) <= 3 * budget_s:
            step_s = min(step_s, _timed_step(subject, size, seed))
        return step_s

    sizes = [batch_size, *(b for b in SMALLER_BATCHES if b < batch_size)]
    smallest = sizes[-1]
    chosen, step = smallest, 0.0
    try:
        floor = timed(smallest)
        chosen, step = smallest, floor
        for size in sizes[:-1]:
            if cost(floor) > budget_s:
                break  # a bigger batch costs at least this much
            if cost(floor * size / smallest) <= budget_s:
                chosen, step = size, floor * size / smallest  # fits even if it grew in proportion
                break
            size_step = timed(size)
            if cost(size_step) <= budget_s:
                chosen, step = size, size_step
                break
    except Exception:  # noqa: BLE001 - the checks will say what is wrong
        return batch_size, steps, "", 0.0
    finally:
        model.zero_grad(set_to_none=True)
        model.load_state_dict(state)
    if chosen == batch_size and cost(step) <= budget_s:
        return batch_size, steps, "", step
    fewer = steps if cost(step) <= budget_s else \
        max(min(steps, FEWEST_STEPS), int((budget_s / step - MEASURE_STEPS) / CHECK_STEP_EQUIVALENTS))
    what = f"batches of {chosen}, not {batch_size}" if chosen < batch_size else f"batches of {batch_size}"
    what += f", and {fewer} steps, not {steps}" if fewer < steps else ""
    full = f"at least {cost(step):.0f}s" if chosen < batch_size else f"about {cost(step):.0f}s"
    return chosen, fewer, (f"checked on {what}: one training step took {step:.2f}s on {chosen} samples, so the "
                           f"checks and measures on {batch_size} would take {full}, more than the {budget_s:.1f}s "
                           "left of the time budget"), step


# The plan at the smallest batch, steps and input overestimates what the checks take (the check that only warns is
# left out; on the tune corpus, GoogLeNet's checks planned 106 s and took about 76 s, R2AttU_Net's 144 s and 93 s): a
# model is skipped as too slow for its timeout only past this multiple of the time left before it
PLAN_OVERESTIMATE = 1.5
SLOW_MODEL_HINT = ("give it a smaller input or model in smoke.targets (input, init_args), run it on a GPU runner, "
                   "or raise smoke.timeout")


def _budget_cause(run: _Run, step_s: float, left_s: float, halvings: list[str], of: str = "of it") -> str:
    """Why a target does not fit its time budget even at its smallest: the step's time at the input it was timed
    on, what was shrunk before, and what was left of the budget."""
    if halvings:
        smallest = f"after shrinking its input ({halvings[-1].removeprefix('for the time budget: ')})"
    elif run.subject.smaller is None:
        smallest = "an input the runner cannot make smaller"
    else:
        smallest = "at the smallest input its forward takes"
    timed = f"one training step took {step_s:.2f}s" if step_s > 0 else "a training step could not be timed"
    return (f"{timed} at input {_input_shapes(run)} ({smallest}), so {run.steps} steps of checks "
            f"and the measures need about {_planned_seconds(run.steps, step_s):.0f}s, more than the {left_s:.1f}s left "
            f"{of}")


def _smaller_subject(subject: Subject) -> Optional[Subject]:
    """``subject.smaller(subject)``, the model's state and RNG left as they were (the forward probes run it)."""
    state = {k: v.detach().clone() for k, v in subject.model.state_dict().items()}
    try:
        with torch.random.fork_rng(devices=_cuda_devices(subject.device)):
            return subject.smaller(subject)
    except Exception:  # noqa: BLE001 - the PR's forward on a smaller input: the sizes it had are kept
        return None
    finally:
        subject.model.zero_grad(set_to_none=True)
        subject.model.load_state_dict(state)


def run_checks(subject: Subject, *, steps: int = 50, seed: int = 0, batch_size: int = 8,
               budget_s: Optional[float] = None, limit_s: Optional[float] = None) -> TargetReport:
    """Run every smoke check on ``subject`` and take its measures; status is "failed" when any check failed.
    With ``budget_s``, a model too slow to be checked in that time is checked on smaller batches and, if it must,
    with fewer steps (then a loss that does not fall enough is a warning, not a failure). ``limit_s``: the
    seconds before the target would be killed (its timeout); a model whose plan at its smallest still needs more
    is skipped, naming the step time and input, rather than killed without a report."""
    return _checked(subject, steps, seed, batch_size, budget_s, with_checks=True, limit_s=limit_s)


def measure_subject(subject: Subject, *, steps: int = 50, seed: int = 0, batch_size: int = 8,
                    budget_s: Optional[float] = None, limit_s: Optional[float] = None) -> TargetReport:
    """Only the measures of ``run_checks`` (on the same batch size): another round of step times for comparing
    head and base (gpu_runner.runner interleaves them)."""
    return _checked(subject, steps, seed, batch_size, budget_s, with_checks=False, limit_s=limit_s)


def _checked(subject: Subject, steps: int, seed: int, batch_size: int, budget_s: Optional[float],
             with_checks: bool, limit_s: Optional[float] = None) -> TargetReport:
    with torch.random.fork_rng(devices=_cuda_devices(subject.device)):  # leave the caller's RNG state alone
        budget_note = ""
        requested_steps = steps
        over_budget = False
        started = time.perf_counter()
        if budget_s is not None:
            deadline = started + budget_s  # the probes below spend it too

            def left() -> float:
                return max(0.0, deadline - time.perf_counter())

            torch.manual_seed(seed)
            requested_batch = batch_size
            phase("the timing of a training step that plans the checks within the time budget")
            batch_size, steps, budget_note, step_s = _scaled_to_budget(subject, steps, batch_size, left(), seed)
            halvings: list[str] = []
            # batch and steps cut and still too slow: smaller inputs (the plan's own timed step says so)
            while steps <= FEWEST_STEPS and _planned_seconds(steps, step_s) > left() and subject.smaller is not None:
                phase("the halving of the input's resolution or length for the time budget")
                smaller = _smaller_subject(subject)
                if smaller is None:
                    break
                subject = smaller
                halvings.append(subject.notes[-1])
                torch.manual_seed(seed)
                batch_size, steps, budget_note, step_s = _scaled_to_budget(subject, requested_steps, requested_batch,
                                                                           left(), seed)
            over_budget = _planned_seconds(steps, step_s) > left()
            left_at_plan = left()
            if halvings:
                budget_note = "; ".join([halvings[-1], *[budget_note] * bool(budget_note)])
        try:
            torch.manual_seed(seed)
            fixed_batch = subject.make_batch(batch_size, seed)
        except Exception as exc:  # noqa: BLE001 - the PR's code can raise anything
            if out_of_memory(exc):
                return TargetReport(target=subject.name, status="skipped", reason=f"making a batch of {batch_size} "
                                    f"{OUT_OF_MEMORY_REASON}: {type(exc).__name__}: {exc}")
            return TargetReport(target=subject.name, status="error",
                                reason=f"could not make a batch of {batch_size}: {type(exc).__name__}: {exc}")
        run = _Run(subject, steps, seed, batch_size, fixed_batch, steps_cut=steps < requested_steps,
                   scaled=bool(budget_note), over_budget=over_budget)
        if over_budget:
            run.budget_cause = _budget_cause(run, step_s, left_at_plan, halvings)
            limit_left = None if limit_s is None else limit_s - (time.perf_counter() - started)
            if limit_left is not None and _planned_seconds(steps, step_s) > PLAN_OVERESTIMATE * limit_left:
                return TargetReport(target=subject.name, status="skipped", notes=[budget_note] * bool(budget_note),
                                    reason="too slow to check before its timeout, even shrunk: "
                                    + _budget_cause(run, step_s, max(limit_left, 0.0), halvings, "before its timeout")
                                    + f"; {SLOW_MODEL_HINT}")
        run.model()  # the initial state, restored before every check and at the end
        global _CONFIGURED_LAYOUT
        configured = subject.output_select is not None or subject.output_batch_axis != 0
        _CONFIGURED_LAYOUT = subject if configured else None
        checks: list[CheckResult] = []
        try:
            if with_checks:
                with _full_precision_on_cuda():
                    checks = [_run_isolated(name, function, run) for name, function in _CHECKS]
                    run.model()
                    checks = [_reproduced(check, run) if check.status == "fail" else check for check in checks]
            phase(f"the measures (step time, memory) on batches of {batch_size}")
            measures, step_times, notes = _take_measures(run)
            notes = [budget_note] * bool(budget_note) + notes
        finally:
            _CONFIGURED_LAYOUT = None
            run.model()  # the subject leaves as it came
    status = "failed" if any(check.status == "fail" for check in checks) else "passed"
    return TargetReport(target=subject.name, status=status, checks=checks, measures=measures, notes=notes,
                        step_times_ms=step_times)


@contextlib.contextmanager
def _full_precision_on_cuda() -> Iterator[None]:
    """The checks compare outputs to 1e-4 relative; TF32, which cuDNN uses for float32 convolutions by default, rounds
    to ~1e-3 and picks kernels by batch size, so on an H200 a convolutional model's rows came out 2e-4 apart in a
    batch of 8 and a batch of 4. The checks run in full float32 (the measures keep the user's defaults)."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _second_batch_size(batch_size: int) -> int:
    return batch_size - 2 if batch_size > 4 else batch_size + 2


def _reproduced(check: CheckResult, run: _Run) -> CheckResult:
    """``check`` (a fail) as reported: the fail when the check fails again on a second batch size and seed (a
    failure only one batch shows is the batch's, not the model's), else undecided. The checks whose non-finite
    values nan-localization replays run first on the second batch too."""
    batch_size, seed = _second_batch_size(run.batch_size), run.seed + 1
    function = dict(_CHECKS)[check.name]
    try:
        run.subject.model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        again = _Run(run.subject, run.steps, seed, batch_size, run.subject.make_batch(batch_size, seed),
                     steps_cut=run.steps_cut, scaled=run.scaled)
        if check.name == "nan-localization":
            for earlier in dict.fromkeys(event.check for event in run.nonfinite_events):
                if earlier in dict(_CHECKS):
                    _run_isolated(earlier, dict(_CHECKS)[earlier], again)
        second = _run_isolated(check.name, function, again)
    except Exception as exc:  # noqa: BLE001 - the PR's code can raise anything making the batch
        second = CheckResult(check.name, "error", f"{type(exc).__name__}: {_one_line(exc, 160)}")
    finally:
        run.model()
    where = f"a batch of {batch_size} (seed {seed})"
    if second.status == "fail":
        check.details["reproduced"] = {"batch_size": batch_size, "seed": seed}
        return check
    return _undecided(check.name, f"it failed on a batch of {run.batch_size} (seed {run.seed}) but not on {where}, "
                      f"so it is not reported as a failure: {check.message} (then: {second.message})",
                      {**check.details, "first": check.status, "second": second.status})


def _cuda_devices(device: str) -> list[int]:
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return []
    index = torch.device(device).index
    return [torch.cuda.current_device() if index is None else index]


# Checks that only ever warn: left out of a run that cannot fit its time budget even at its smallest, so the
# checks that can fail keep the time
WARNING_ONLY_CHECKS = ("gradient-health",)


def _run_isolated(name: str, function: Callable[[_Run], CheckResult], run: _Run) -> CheckResult:
    if run.over_budget and name in WARNING_ONLY_CHECKS:
        return CheckResult(name, "skip", f"not run: the target does not fit its time budget: {run.budget_cause}; "
                           "this check only warns.",
                           {"seconds": 0.0, "budget": True})
    phase(f"the {name} check on batches of {run.batch_size}, {run.steps} steps")
    run.seed_everything()
    started = time.perf_counter()
    try:
        result = function(run)
    except Exception as exc:  # noqa: BLE001 - a check that crashes must not stop the others
        result = _raised(name, exc, run)
    result.details["seconds"] = round(time.perf_counter() - started, 4)
    return result


def _raised(name: str, exc: Exception, run: _Run) -> CheckResult:
    """What a check that raised says: the model's bug when the model's code raised (on inputs the configuration
    supplied) or when autograd rejects the graph its forward built; undecided when the model's code raised on the
    runner's guessed inputs; else the runner's error."""
    where = _user_frame(exc.__traceback__)
    details = {"error": True, "where": where, "traceback": traceback.format_exc(limit=-6)}
    text = f"{type(exc).__name__}: {_one_line(exc)}"
    if out_of_memory(exc):
        return CheckResult(name, "error", f"the check {OUT_OF_MEMORY_REASON}: {text}", details)
    if not where and _raised_in_backward(exc):
        located = _locate_backward_error(run)
        if located is not None:  # the replay of one plain training step raises too: the model cannot train
            details["where"] = located
            return CheckResult(name, "fail", f"the backward raised {text}; the model's code at {located} builds a "
                               "graph autograd cannot differentiate (an in-place change of a tensor it saved, or an "
                               "output detached from the parameters).", details)
    if where and run.subject.inputs_guessed:
        return _undecided(name, f"the model's code raised {text} at {where} on the runner's guessed input: the guess "
                          "may be wrong (configure smoke.targets' input to decide).", details)
    if where:  # the model's own code raised on inputs it was given: a finding
        return CheckResult(name, "fail", f"the check raised {text}", details)
    # raised in torchreview or in torch called by it: the runner's fault, never the model's
    return CheckResult(name, "error", f"the check could not run (a runner error, not a finding about the model): "
                       f"{text}", details)


def _undecided(name: str, message: str, details: Optional[dict] = None) -> CheckResult:
    """A check the run could not decide: never a FAIL, and it says why."""
    return CheckResult(name, "skip", f"undecided: {message}", {**(details or {}), "undecided": True})


_AUTOGRAD_ENTRY = (os.path.join("torch", "autograd", "__init__.py"), os.path.join("torch", "_tensor.py"),
                   os.path.join("torch", "autograd", "graph.py"))


def _raised_in_backward(exc: BaseException) -> bool:
    """``exc`` came out of autograd's engine (``loss.backward()``, ``torch.autograd.grad``)."""
    return isinstance(exc, RuntimeError) and any(
        frame.filename.endswith(_AUTOGRAD_ENTRY) and frame.name in ("backward", "grad", "_engine_run_backward")
        for frame in traceback.extract_tb(exc.__traceback__))


def _locate_backward_error(run: _Run) -> Optional[str]:
    """Where the model's code made the graph node whose backward raises, from a replay of one plain training step
    (the fixed batch, train mode) under anomaly mode; the model's forward itself when its output is detached.
    None when the replay goes through (then the check's own use of autograd raised)."""
    import warnings

    model = run.model()
    batch = run.batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=False):
                _loss(run, _forward(model, batch), batch).backward()
        except RuntimeError as exc:
            if not _raised_in_backward(exc):
                return None
            forward_traces = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message)]
            located = next((line for line in map(_last_user_line, forward_traces) if line), "")
            return located or _forward_definition(model)
        finally:
            model.zero_grad(set_to_none=True)
    return None


def _forward_definition(model: nn.Module) -> str:
    """``file.py:line in forward`` of the model's class (where an output detached from the graph comes from)."""
    import inspect

    forward = type(model).forward
    try:
        filename, line = inspect.getsourcefile(forward) or "?", inspect.getsourcelines(forward)[1]
    except (OSError, TypeError):
        return f"{type(model).__name__}.forward"
    return f"{os.path.basename(filename)}:{line} in {type(model).__name__}.forward"


# --- helpers ----------------------------------------------------------------------------------------------

def _forward(model: nn.Module, batch: Batch) -> Any:
    return model(*batch.args, **batch.kwargs)


# The subject being checked when its output layout is configured (smoke.targets' output.select / batch_axis); set
# by run_checks, so that every helper that sees only an output looks at the configured tensor, batch axis first.
_CONFIGURED_LAYOUT: Optional[Subject] = None


def _primary_output(output: Any) -> Optional[torch.Tensor]:
    """The tensor the checks look at: the configured selection, else the output itself, ``.logits``, or the
    first tensor in a tuple/dict; with a configured batch axis moved first."""
    layout = _CONFIGURED_LAYOUT
    if layout is None:
        return _first_tensor(output)
    picked = layout.output_select(output) if layout.output_select is not None else _first_tensor(output)
    axis = layout.output_batch_axis
    if isinstance(picked, torch.Tensor) and axis and picked.dim() > axis:
        picked = picked.movedim(axis, 0)
    return picked if isinstance(picked, torch.Tensor) else None


def _first_tensor(output: Any) -> Optional[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, dict):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        candidates: Iterable = output.values()
    elif isinstance(output, (tuple, list)):
        candidates = output
    else:
        return None
    for item in candidates:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _require_output(output: Any) -> torch.Tensor:
    primary = _primary_output(output)
    if primary is None:
        raise TypeError(f"forward returned {type(output).__name__}, which holds no tensor")
    return primary


def _loss(run: _Run, output: Any, batch: Batch) -> torch.Tensor:
    loss = run.subject.loss_fn(output, batch.target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(f"loss_fn returned {shape}, expected a scalar tensor")
    return loss.reshape(())


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def _is_finite(tensor: torch.Tensor) -> bool:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return True  # integer and bool tensors cannot hold NaN/Inf
    return bool(torch.isfinite(tensor).all())


def _input_tensors(batch: Batch) -> list[tuple[str, torch.Tensor]]:
    """(label, tensor) for every tensor input; labels read like "input 0" or "input 'mask'"."""
    found = []
    for index, arg in enumerate(batch.args):
        for leaf in pytree.tree_leaves(arg):
            if isinstance(leaf, torch.Tensor):
                found.append((f"input {index}", leaf))
    for key, value in batch.kwargs.items():
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                found.append((f"input '{key}'", leaf))
    return found


def _map_inputs(batch: Batch, function: Callable[[torch.Tensor], Any]) -> Batch:
    """A Batch whose tensor inputs are replaced by ``function(tensor)`` (the target is kept)."""
    def apply(value):
        return function(value) if isinstance(value, torch.Tensor) else value

    return Batch(args=tuple(pytree.tree_map(apply, arg) for arg in batch.args),
                 kwargs={key: pytree.tree_map(apply, value) for key, value in batch.kwargs.items()},
                 target=batch.target, batch_size=batch.batch_size)


def _relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over the larger of their max magnitudes; inf when shapes or NaN/Inf positions differ."""
    if a.shape != b.shape:
        return math.inf
    a, b = a.detach().double(), b.detach().double()
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b) or not torch.equal(a[~finite_a].nan_to_num(), b[~finite_b].nan_to_num()):
        return math.inf
    a, b = a[finite_a], b[finite_b]
    if a.numel() == 0:
        return 0.0
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-12)
    return float((a - b).abs().max()) / scale


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _is_user_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    return not path.startswith(_TORCH_DIR) and not path.startswith(_RUNNER_DIR) and "importlib" not in path


def _format_frame(frame: traceback.FrameSummary) -> str:
    code = f": `{frame.line.strip()}`" if frame.line else ""
    return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}{code}"


def _user_frame(tb) -> str:
    """The innermost frame of the traceback that is the PR's code (not torch, not this file)."""
    frames = [f for f in traceback.extract_tb(tb) if _is_user_file(f.filename)] if tb is not None else []
    return _format_frame(frames[-1]) if frames else ""


def _thin(curve: list[float], points: int = 11) -> list[float]:
    """About ``points`` evenly spaced values of a loss curve, first and last included."""
    if len(curve) <= points:
        return list(curve)
    stride = (len(curve) - 1) / (points - 1)
    return [curve[round(i * stride)] for i in range(points)]


def _train(run: _Run, model: nn.Module, batch: Batch, lr: float, steps: int,
           stop_below: Optional[float] = None, keep_mode: bool = False) -> tuple[list[float], Optional[int]]:
    """Adam on one batch; returns the loss before every step plus the loss after the last one, and the step
    at which the loss became non-finite (training stops there), if it did. Train mode unless ``keep_mode``."""
    if not keep_mode:
        model.train()
    optimizer = torch.optim.Adam([p for _, p in _trainable(model)], lr=lr)
    curve: list[float] = []
    for step in range(steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(run, _forward(model, batch), batch)
        curve.append(float(loss.detach()))
        if not math.isfinite(curve[-1]):
            return curve, step
        if step == steps or (stop_below is not None and curve[-1] <= stop_below):
            break
        loss.backward()
        optimizer.step()
    return curve, None


# --- the checks -------------------------------------------------------------------------------------------

def check_forward_contract(run: _Run) -> CheckResult:
    """The output's first dim is the batch size, its dtype is floating (integer allowed for custom tasks),
    and every value is finite. A custom task may instead return a scalar: the model's own loss."""
    name, batch_size = "forward-contract", run.batch_size
    model = run.model().train()
    with torch.no_grad():
        output = _primary_output(_forward(model, run.batch()))
    if output is None:
        return CheckResult(name, "fail", "forward returned no tensor (nor a tuple/dict/object with .logits "
                           "holding one).")
    shape = tuple(output.shape)
    details = {"shape": list(shape), "dtype": str(output.dtype)}
    problems = []
    returns_its_loss = not shape and run.subject.task == "custom"  # forward(x, targets) -> scalar loss
    if returns_its_loss:
        if not _is_finite(output):
            run.note_nonfinite(name, "output")
            return CheckResult(name, "fail", f"the model's own loss is {float(output)} at init.", details)
        return CheckResult(name, "pass", f"forward returns a finite scalar {float(output):.4g} (the model computes its "
                           "own loss); the per-row checks do not apply.", details)
    batch_problem = ""
    if run.subject.output_batch_axis is None:
        details["batch_axis"] = "none (configured)"
    elif not shape or shape[0] != batch_size:
        where = [dim for dim, size in enumerate(shape) if size == batch_size]
        hint = f" (the batch is on dim {where[0]}: sequence-first output?)" if where else ""
        problems.append(f"output shape {shape} does not start with the batch size {batch_size}{hint}")
    batch_problem = problems[0] if problems else ""
    integer_ok = run.subject.task == "custom" and not output.is_floating_point() and not output.is_complex()
    if not output.is_floating_point() and not integer_ok:
        problems.append(f"output dtype is {output.dtype}, expected a floating dtype for a {run.subject.task} task")
    if output.is_floating_point() and not _is_finite(output):
        bad = int((~torch.isfinite(output)).sum())
        run.note_nonfinite(name, "output")
        problems.append(f"the output has {bad} non-finite values (NaN/Inf) out of {output.numel()} at init")
    if problems == problems[:1] and batch_problem and run.subject.inputs_guessed:
        # the model may take another layout (a feature vector where an image was guessed, time first): its output
        # rows say which, not that the model is wrong
        return _undecided(name, f"{batch_problem} on the runner's guessed input {_input_shapes(run)}, which the model "
                          "does not declare: the model may expect another shape or layout (configure smoke.targets' "
                          "input to decide).", {**details, "problems": problems})
    if problems:
        return CheckResult(name, "fail", problems[0] + ".", {**details, "problems": problems})
    return CheckResult(name, "pass", f"output {shape} {str(output.dtype).replace('torch.', '')}, all finite.", details)


def _input_shapes(run: _Run) -> str:
    return ", ".join(str(tuple(tensor.shape)) for _, tensor in _input_tensors(run.fixed_batch)) or "(none)"


def _num_classes(run: _Run, output: torch.Tensor) -> tuple[Optional[int], str]:
    if run.subject.num_classes:
        return int(run.subject.num_classes), "given"
    if output.dim() in (2, 3) and output.is_floating_point():
        return int(output.shape[-1]), "inferred from the output's last dim"
    return None, ""


def check_loss_at_init(run: _Run) -> CheckResult:
    """For classification/LM: the mean initial loss over a few batches is within
    ``0.5·ln C + 0.5`` of ln C, the loss of a uniform prediction over C classes."""
    name, task = "loss-at-init", run.subject.task
    if task not in ("classification", "language_model"):
        return CheckResult(name, "skip", f"no expected initial loss for a {task} task.")
    model = run.model().train()
    losses, classes, source = [], None, ""
    with torch.no_grad():
        for index in range(LOSS_AT_INIT_BATCHES):
            batch = run.batch() if index == 0 else run.subject.make_batch(run.batch_size, run.seed + index)
            output = _forward(model, batch)
            if classes is None:
                classes, source = _num_classes(run, _require_output(output))
            losses.append(float(_loss(run, output, batch)))
    if classes is None or classes < 2:
        return CheckResult(name, "skip", "the number of classes is unknown: set num_classes for the target.")
    loss = sum(losses) / len(losses)
    expected = math.log(classes)
    tolerance = LOSS_AT_INIT_RELATIVE * expected + LOSS_AT_INIT_ABSOLUTE
    details = {"initial_loss": loss, "losses": losses, "expected": expected, "tolerance": tolerance,
               "num_classes": classes, "num_classes_source": source}
    if not math.isfinite(loss):
        run.note_nonfinite(name, "loss")
        return CheckResult(name, "fail", f"the initial loss is {loss}: the forward or the loss produces NaN/Inf "
                           "at init.", details)
    if loss > expected + tolerance and run.subject.inputs_guessed:
        # logits scale with the inputs: on inputs whose scale the runner guessed (unit-variance noise where the
        # data may be normalised counts), a hot start says nothing about the initialisation
        return _undecided(name, f"initial loss {loss:.3g} is above ln({classes})={expected:.3g}, but on inputs the "
                          "runner guessed, whose scale sets the logits' (configure smoke.targets' inputs to decide).",
                          details)
    if loss > expected + tolerance:
        return CheckResult(name, "fail", f"initial loss {loss:.3g} is far above ln({classes})={expected:.3g}: the "
                           "output layer is initialised too hot (or the targets do not match the outputs).", details)
    if loss < expected - tolerance:
        return CheckResult(name, "fail", f"initial loss {loss:.3g} is far below ln({classes})={expected:.3g}: the "
                           f"loss is not a cross-entropy over {classes} classes, or the target leaks into the input.",
                           details)
    return CheckResult(name, "pass", f"initial loss {loss:.3g} is close to ln({classes})={expected:.3g}.", details)


def check_gradients(run: _Run) -> CheckResult:
    """One backward: every trainable parameter gets a gradient that is not None, finite and not all zero."""
    name = "gradients"
    if not _trainable(run.subject.model):
        return CheckResult(name, "skip", "the model has no trainable parameters.")
    model = run.model().train()
    batch = run.batch()
    loss = _loss(run, _forward(model, batch), batch)
    if not loss.requires_grad:
        return CheckResult(name, "fail", "the loss does not require grad: the whole forward is detached "
                           "(torch.no_grad, .detach() or .item() on the output).")
    loss.backward()
    missing, non_finite, zero = [], [], []
    for param_name, param in _trainable(model):
        if param.grad is None:
            missing.append(param_name)
        elif not _is_finite(param.grad):
            non_finite.append(param_name)
        elif not bool(param.grad.any()):
            zero.append(param_name)
    loss_is_finite = math.isfinite(float(loss.detach()))
    if not loss_is_finite or non_finite:
        run.note_nonfinite(name, "gradient" if loss_is_finite else "loss")
    details = {"no_gradient": missing, "non_finite_gradient": non_finite, "zero_gradient": zero,
               "trainable": len(_trainable(model))}
    elsewhere = _reached_only_through_other_outputs(run, missing + zero) if missing or zero else []
    if elsewhere:  # parameters that only feed outputs the smoke loss does not train on: not dead
        details["other_outputs_only"] = elsewhere
        missing = [n for n in missing if n not in elsewhere]
        zero = [n for n in zero if n not in elsewhere]
        if not missing and not zero and not non_finite:
            return CheckResult(name, "pass", f"every trainable parameter gets a finite, non-zero gradient; "
                               f"{_names(elsewhere)} only through the parts of the output the smoke loss does not "
                               "train on (the output is a tuple or mapping).", details)
    varying = _gradient_with_other_seeds(run, missing + zero) if missing or zero else []
    if varying:  # dropped at random by design (stochastic depth, drop-path): only a deterministic loss is a bug
        details["gradient_varies_with_seed"] = varying
        missing = [n for n in missing if n not in varying]
        zero = [n for n in zero if n not in varying]
        if not missing and not zero and not non_finite:
            return _undecided(name, f"{_names(varying)} got no gradient on seed {run.seed} but did on another of "
                              f"{GRADIENT_SEEDS} seeds with the same parameters and batch: the forward drops that path "
                              "at random (stochastic depth, drop-path), so the gaps are not a bug.", details)
    if missing:
        branches = _untaken_branches(run, missing)
        if branches and set(branches) == set(missing):
            details["untaken_branches"] = branches
            uncalled = _names(sorted(set(branches.values())))
            return CheckResult(name, "warn", f"{_names(missing)} {'gets' if len(missing) == 1 else 'get'} no gradient "
                               f"because the forward did not call {uncalled} on this input, "
                               "although the code uses it on a path this input does not take: not a training bug, but "
                               "DistributedDataParallel needs find_unused_parameters=True for such a model.", details)
        verb = "gets" if len(missing) == 1 else "get"
        return CheckResult(name, "fail", f"{_names(missing)} {verb} no gradient: detached from the loss or unused "
                           "in forward.", details)
    if non_finite:
        return CheckResult(name, "fail", f"{_names(non_finite)} {'has' if len(non_finite) == 1 else 'have'} a "
                           "non-finite gradient (NaN/Inf): see nan-localization.", details)
    if zero:
        opened_model, opened = run.opened_model()
        if opened:
            loss = _loss(run, _forward(opened_model, run.batch()), run.batch())
            loss.backward()
            still = [n for n, p in _trainable(opened_model) if p.grad is None or not bool(p.grad.any())]
            opened_model.zero_grad(set_to_none=True)
            details["zero_initialized"] = opened
            if not still:
                return CheckResult(name, "pass", f"all {details['trainable']} trainable parameters get a finite, "
                                   f"non-zero gradient after {OPENING_STEPS} Adam steps; at initialization "
                                   f"{_names(zero)} had none because {_names(opened)} starts at exactly zero (a "
                                   "deliberate initialization that the first steps open).", details)
            zero = still
        if run.zero_gates():
            details["zero_gates"] = run.zero_gates()
            return CheckResult(name, "warn", f"{_names(zero)} {'has' if len(zero) == 1 else 'have'} an all-zero "
                               f"gradient at initialization, but {_names(run.zero_gates())} {_starts(run.zero_gates())} at exactly zero (a "
                               "deliberate gate that closes the path until it opens): not judged.", details)
        single = _dead_only_through_single_element_softmax(run, zero)
        if single:
            details["single_element_softmax"] = single
            return CheckResult(name, "warn", f"{_names(zero)} {'gets' if len(zero) == 1 else 'get'} an all-zero "
                               f"gradient only because the model takes a softmax over a dimension of size 1 (at "
                               f"{single}: an attention window holding one position), which is the constant 1; "
                               "what feeds that softmax cannot learn on this input.", details)
        return CheckResult(name, "fail", f"{_names(zero)} {'has' if len(zero) == 1 else 'have'} an all-zero "
                           "gradient: the path to the loss is dead (multiplied by zero, dead ReLU, a constant).",
                           details)
    return CheckResult(name, "pass", f"all {details['trainable']} trainable parameters get a finite, non-zero "
                       "gradient.", details)


GRADIENT_SEEDS = 8  # seeds a gradient gap must persist over before it is a bug and not a random drop


def _gradient_with_other_seeds(run: _Run, names: list[str]) -> list[str]:
    """Those of ``names`` that get a finite, non-zero gradient from the same parameters and batch under another of
    ``GRADIENT_SEEDS`` seeds: their gap depends on the random draws of the forward, not on the code."""
    if not _forward_draws_random(run):
        return []
    remaining, found = set(names), []
    import random

    numpy = sys.modules.get("numpy")
    saved = random.getstate(), numpy.random.get_state() if numpy is not None else None
    for offset in range(1, GRADIENT_SEEDS):
        model = run.model().train()
        torch.manual_seed(run.seed + offset)
        random.seed(run.seed + offset)  # the other generators a forward may draw from, seeded too: reproducible
        if numpy is not None:
            numpy.random.seed(run.seed + offset)
        loss = _loss(run, _forward(model, run.batch()), run.batch())
        if loss.requires_grad:
            loss.backward()
            parameters = dict(_trainable(model))
            got = {n for n in remaining if parameters[n].grad is not None and bool(parameters[n].grad.any())
                   and _is_finite(parameters[n].grad)}
            found += sorted(got)
            remaining -= got
        model.zero_grad(set_to_none=True)
        if not remaining:
            break
    random.setstate(saved[0])
    if numpy is not None:
        numpy.random.set_state(saved[1])
    run.model()
    return [n for n in names if n in found]


def _random_states(device: str) -> list:
    import random

    states = [torch.get_rng_state(), random.getstate()]
    numpy = sys.modules.get("numpy")  # only when something imported it: a forward drawing from it did
    if numpy is not None:
        _, keys, position, *_ = numpy.random.get_state()
        states.append((keys.tobytes(), position))
    if str(device).startswith("cuda") and torch.cuda.is_available():
        states.append(torch.cuda.get_rng_state(torch.device(device)))
    return states


def _forward_draws_random(run: _Run) -> bool:
    """Whether a training-mode forward draws from torch's, Python's or numpy's random generators (dropout, a random
    drop of a block): only then can what gets a gradient vary with the seed."""
    model = run.model().train()
    before = _random_states(run.subject.device)
    with torch.no_grad():
        _forward(model, run.batch())
    after = _random_states(run.subject.device)
    run.model()
    return any(not torch.equal(a, b) if isinstance(a, torch.Tensor) else a != b for a, b in zip(before, after))


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def _untaken_branches(run: _Run, names: list[str]) -> dict[str, str]:
    """For each parameter of ``names`` that lies under a module the forward never called, whose caller's code does
    name it outside ``__init__`` (a branch for another input size or configuration, not taken on this input): the
    parameter and ``Class.attribute``. A submodule or parameter no method but ``__init__`` mentions is a dead
    registration (its parameters can never train) and is left out, as is a parameter under a called module."""
    model = run.model().train()
    called: set[int] = set()
    hooks = [module.register_forward_pre_hook(lambda module, args: called.add(id(module)))
             for module in model.modules()]
    try:
        with torch.no_grad():
            _forward(model, run.batch())
    finally:
        for hook in hooks:
            hook.remove()
    branches = {}
    for param_name in names:
        parts = param_name.split(".")
        owner, chain = model, [model]
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if not isinstance(owner, nn.Module):
                break
            chain.append(owner)
        else:
            # the outermost module on the path that was not called, below one that was (containers are never called)
            for depth in range(1, len(chain)):
                if id(chain[depth]) not in called and not isinstance(chain[depth], _CONTAINERS):
                    caller_depth = depth - 1
                    while caller_depth > 0 and isinstance(chain[caller_depth], _CONTAINERS):
                        caller_depth -= 1
                    caller, attribute = chain[caller_depth], parts[caller_depth]
                    if attribute in _attributes_used_outside_init(type(caller)):
                        branches[param_name] = f"{type(caller).__name__}.{attribute}"
                    break
    return branches


def _attributes_used_outside_init(cls: type) -> set[str]:
    """The ``self.<name>`` attributes (and string constants, for ``getattr(self, "name")``) that the methods of
    ``cls`` and its bases other than ``__init__`` mention; torch's own classes excluded."""
    import ast
    import inspect
    import textwrap

    used: set[str] = set()
    for klass in cls.__mro__:
        if klass in (nn.Module, object) or (klass.__module__ or "").startswith("torch."):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and function.name != "__init__":
                for node in ast.walk(function):
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                        used.add(node.attr)
                    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                        used.add(node.value)
    return used


def _reached_only_through_other_outputs(run: _Run, names: list[str]) -> list[str]:
    """Those of ``names`` that get a gradient from the model's whole output (every float tensor of a tuple or
    mapping, randomly weighted) when the loss trains on one element of it: CrossViT's cross-attention returns
    (small, large) tokens, and the large branch's parameters only reach the second."""
    model = run.model().train()
    output = _forward(model, run.batch())
    tensors = [t for t in _tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if isinstance(output, torch.Tensor) or len(tensors) < 2:
        model.zero_grad(set_to_none=True)
        return []
    generator = torch.Generator().manual_seed(run.seed)
    total = sum((t.float() * torch.randn(t.shape, generator=generator).to(t.device)).sum() for t in tensors)
    total.backward()
    parameters = dict(_trainable(model))
    found = [n for n in names if n in parameters and parameters[n].grad is not None and bool(parameters[n].grad.any())
             and _is_finite(parameters[n].grad)]
    model.zero_grad(set_to_none=True)
    return found


class _SingleElementSoftmaxPassThrough(torch.overrides.TorchFunctionMode):
    """Makes a softmax over a dimension of size 1 (the constant 1, whose gradient is exactly zero) pass its
    gradient through unchanged, and notes where it happened."""

    def __init__(self):
        super().__init__()
        self.shapes: list[list[int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("softmax", "log_softmax") and args and isinstance(args[0], torch.Tensor):
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            tensor = args[0]
            if isinstance(dim, int) and tensor.dim() and tensor.shape[dim] == 1 and tensor.is_floating_point():
                self.shapes.append(list(tensor.shape))
                constant = torch.zeros_like(tensor) if func.__name__ == "log_softmax" else torch.ones_like(tensor)
                return constant + (tensor - tensor.detach())
        return func(*args, **kwargs)


def _dead_only_through_single_element_softmax(run: _Run, zero: list[str]) -> Optional[str]:
    """The shape of a softmax over a dimension of size 1 when it is what leaves every parameter of ``zero``
    without a gradient (they get one once that softmax passes its gradient through); None otherwise."""
    model = run.model().train()
    with _SingleElementSoftmaxPassThrough() as through:
        loss = _loss(run, _forward(model, run.batch()), run.batch())
    if not through.shapes or not loss.requires_grad:
        model.zero_grad(set_to_none=True)
        return None
    loss.backward()
    gradients = dict(_trainable(model))
    revived = all(gradients[n].grad is not None and bool(gradients[n].grad.any()) for n in zero if n in gradients)
    model.zero_grad(set_to_none=True)
    return str(through.shapes[0]) if revived else None


def check_params_change(run: _Run) -> CheckResult:
    """After one Adam step (lr 1e-3), every trainable parameter that got a non-zero gradient has changed."""
    name = "params-change"
    if not _trainable(run.subject.model):
        return CheckResult(name, "skip", "the model has no trainable parameters.")
    model = run.model().train()
    batch = run.batch()
    trainable = _trainable(model)
    before = {param_name: param.detach().clone() for param_name, param in trainable}
    optimizer = torch.optim.Adam([p for _, p in trainable], lr=PARAMS_CHANGE_LR)
    _loss(run, _forward(model, batch), batch).backward()
    optimizer.step()
    stepped = [(n, p) for n, p in trainable if p.grad is not None and bool(p.grad.any())]
    unchanged = [n for n, p in stepped if torch.equal(p.detach(), before[n])]
    details = {"stepped": len(stepped), "unchanged": unchanged}
    if not stepped:
        return CheckResult(name, "skip", "no parameter got a non-zero gradient (see gradients).", details)
    if unchanged:
        return CheckResult(name, "fail", f"{_names(unchanged)} did not change after an optimizer step although "
                           "it has a gradient: something resets it in forward, or its dtype cannot hold the update.",
                           details)
    return CheckResult(name, "pass", f"all {len(stepped)} parameters with a gradient changed after one Adam step.",
                       details)


def _looks_like_probabilities(output: torch.Tensor) -> bool:
    if not output.is_floating_point() or output.dim() < 2 or not _is_finite(output):
        return False
    sums = output.detach().sum(dim=-1)
    return bool((output >= 0).all()) and bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3))


TEACHER_PERTURBATION = 0.1  # relative size of the parameter change that makes a reachable regression target


def _reachable_regression_batch(run: _Run) -> Optional[Batch]:
    """For the regression task (a guess: the target is random noise the model may have no way to fit), a batch
    whose target the model can certainly reach: its own output with every parameter moved by ~10% of its size
    (dropout modules off). Overfitting then asks whether training moves the model where it should go, with a
    floor of 0, instead of asking it to memorise noise. None for other tasks."""
    if run.subject.task != "regression":
        return None
    model = run.model()
    _dropout_off(model)
    generator = torch.Generator(device="cpu").manual_seed(run.seed + 7)
    batch = run.batch()
    with torch.no_grad():
        for _, param in _trainable(model):
            if param.is_floating_point():
                noise = torch.randn(param.shape, generator=generator).to(param.device, param.dtype)
                param.add_(noise * TEACHER_PERTURBATION * (param.abs() + 1e-2))
        output = _primary_output(_forward(model, batch))
    if output is None or not isinstance(batch.target, torch.Tensor) or output.shape != batch.target.shape:
        return None
    return Batch(args=batch.args, kwargs=batch.kwargs, target=output.detach().float(), batch_size=batch.batch_size)


def _dropout_off(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, _DROPOUT_TYPES):
            module.eval()


def _bounded_logits_floor(model: nn.Module, run: _Run) -> Optional[tuple[float, float]]:
    """(bound, floor) when the trained model's logits still lie in [-1, 1] (cosine-similarity heads): cross-entropy
    over C classes cannot go below log(1 + (C-1)·e^-2) there, however well the model learns."""
    if run.subject.task not in ("classification", "language_model"):
        return None
    with torch.no_grad():
        output = _primary_output(_forward(model, run.batch()))
    if output is None or not output.is_floating_point() or output.dim() < 2 or not _is_finite(output):
        return None
    output = output.detach()
    bound = float(output.abs().max())
    if bound > 1.0 + 1e-3 or float(output.min()) >= 0 or _looks_like_probabilities(output):
        return None  # probabilities (a softmax before the loss) are a bug, not a bounded head
    classes = int(run.subject.num_classes or output.shape[-1])
    return 1.0, math.log(1 + (classes - 1) * math.exp(-2.0))


# autograd nodes that only move, mix or rescale values element by element (no learned projection): an output
# reached through these alone from embedding lookups and raw parameters is a representation, not a prediction
_PASS_THROUGH_NODES = {"Add", "Sub", "Mul", "Div", "Neg", "NativeDropout", "View", "ReshapeAlias", "UnsafeView",
                       "Permute", "Transpose", "T", "Expand", "Clone", "Slice", "Select", "Index", "Squeeze",
                       "Unsqueeze", "Cat", "Stack", "NativeLayerNorm", "ToCopy", "Alias", "AsStrided", "Repeat",
                       "Split", "SplitWithSizes", "Unbind", "MaskedFill"}
_LOOKUP_NODES = {"Embedding": "embedding lookups", "EmbeddingBag": "embedding lookups",
                 "AccumulateGrad": "parameters"}
_GRAPH_NODE_LIMIT = 5000


def _output_only_looked_up(run: _Run) -> str:
    """What the model's output is made of when it comes from embedding lookups (and parameters, constants) through
    sums, scalings, normalizations and reshapes alone, with no learned projection (matmul, convolution, ...) on any
    path: "embedding lookups and parameters"; "" otherwise (or when the graph is too large to walk)."""
    if not any(isinstance(module, (nn.Embedding, nn.EmbeddingBag)) for module in run.subject.model.modules()):
        return ""  # no lookup table, so the one forward this takes is spared (F.embedding on a bare tensor is missed)
    model = run.model().train()
    try:
        output = _primary_output(_forward(model, run.batch()))
        if output is None or output.grad_fn is None:
            return ""
        seen, stack, sources = set(), [output.grad_fn], set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _GRAPH_NODE_LIMIT:
                return ""
            kind = re.sub(r"Backward\d*$", "", type(node).__name__)
            if kind in _LOOKUP_NODES:
                sources.add(_LOOKUP_NODES[kind])
                continue
            if kind not in _PASS_THROUGH_NODES:
                return ""
            stack.extend(next_node for next_node, _ in node.next_functions)
        return " and ".join(sorted(sources)) if "embedding lookups" in sources else ""
    finally:
        model.zero_grad(set_to_none=True)
        run.model()


def check_overfit_batch(run: _Run) -> CheckResult:
    """Adam on one fixed batch, at lr 1e-3, then 3e-3, then 1e-2 (each only when the one before falls short):
    pass when the loss halves within ``steps`` steps, or falls by a quarter (it learns, slower); warn from a
    tenth; fail below that, on NaN/Inf, or when the output is already a softmax (double softmax). Regression
    targets are made reachable (the model's own output with its parameters moved 10%; then lr 3e-4 and 1e-4 are
    tried too); logits bounded in [-1, 1] (cosine heads) are measured against the cross-entropy floor the bound
    allows. The lr 1e-3 run always goes all ``steps``: its end point is the loss_after_steps measure. Skipped
    for a model with no trainable parameter."""
    name = "overfit-batch"
    if not _trainable(run.subject.model):
        return CheckResult(name, "skip", "the model has no trainable parameters.")
    if run.subject.objective_guessed:
        looked_up = _output_only_looked_up(run)
        if looked_up:
            return _undecided(name, f"the output is made of {looked_up} with no learned projection after them (an "
                              "embedding layer or a representation, not a prediction), and the loss is the runner's "
                              "guess, so whether it can fall in a few steps says nothing (configure smoke.targets' "
                              "task and loss to decide).", {"output_from": looked_up})
    reachable = _reachable_regression_batch(run)
    floor, floor_note = 0.0, ""
    if reachable is not None:
        floor_note = " (the target: the model's own output with its parameters moved by 10%)"
    runs: dict = {}
    trained: dict = {}
    for lr in OVERFIT_LEARNING_RATES + (REACHABLE_EXTRA_LEARNING_RATES if reachable is not None else ()):
        run.seed_everything()
        first_run = not runs
        stop_below = None if first_run else next(iter(runs.values()))["target"]
        model = run.model()
        _dropout_off(model)
        curve, nonfinite_step = _train(run, model, reachable or run.batch(), lr, run.steps, stop_below=stop_below,
                                       keep_mode=True)
        trained[lr] = model
        initial = curve[0]
        target = (floor + OVERFIT_TARGET_FRACTION * (initial - floor) if floor and initial > floor
                  else initial - OVERFIT_TARGET_FRACTION * abs(initial))
        reached_at = next((step for step, value in enumerate(curve) if value <= target), None)
        finite = [value for value in curve if math.isfinite(value)]
        runs[f"{lr:g}"] = {"initial": initial, "final": curve[-1], "best": min(finite) if finite else math.nan,
                           "target": target, "floor": floor, "reached_at": reached_at, "steps": len(curve) - 1,
                           "nonfinite_step": nonfinite_step, "curve": _thin(curve)}
        if first_run and nonfinite_step is None:
            run.loss_after_steps = curve[-1]
        if nonfinite_step is not None:
            run.note_nonfinite(name, "loss", lr=lr, step=nonfinite_step)
        if not math.isfinite(initial):
            return CheckResult(name, "fail", f"the initial loss is {initial}: nothing to overfit (see "
                               "nan-localization).", {"runs": runs})
        if initial == 0:
            return CheckResult(name, "skip", "the initial loss is already 0.", {"runs": runs})
        if reached_at is not None:
            further = f", and to {curve[-1]:.3g} after {len(curve) - 1}" if len(curve) - 1 > reached_at else ""
            how = "half or less" if reachable is None else "half or less, against a reachable target"
            return CheckResult(name, "pass", f"loss fell from {initial:.3g} to {curve[reached_at]:.3g} ({how}) in "
                               f"{reached_at} Adam steps at lr {lr:g} on one batch{further}.",
                               {"runs": runs, "lr": lr})
    first = next(iter(runs.values()))
    best = min(r["best"] for r in runs.values())
    bounded = None
    if all(r["nonfinite_step"] is None for r in runs.values()):
        bounded = _bounded_logits_floor(trained[max(trained)], run)
    if bounded is not None:
        bound, bounded_floor = bounded
        needed = bounded_floor + OVERFIT_TARGET_FRACTION * (first["initial"] - bounded_floor)
        details = {"runs": runs, "logit_bound": bound, "floor": bounded_floor}
        if best <= needed:
            return CheckResult(name, "pass", f"loss fell from {first['initial']:.3g} to {best:.3g}, halfway to "
                               f"{bounded_floor:.3g}, the lowest cross-entropy logits bounded in [-{bound:g}, {bound:g}] "
                               "allow (a cosine-similarity head).", details)
        return CheckResult(name, "skip", f"the logits stay in [-{bound:g}, {bound:g}] (a cosine-similarity head?), where "
                           f"cross-entropy cannot go below {bounded_floor:.3g}; the loss went from "
                           f"{first['initial']:.3g} to {best:.3g}. Configure a loss with a temperature to check it.",
                           details)
    with torch.no_grad():
        output = _primary_output(_forward(run.eval_model(), run.batch()))
    probabilities = run.subject.task in ("classification", "language_model") and output is not None \
        and _looks_like_probabilities(output)
    diverged = [(lr, r["nonfinite_step"]) for lr, r in runs.items() if r["nonfinite_step"] is not None]
    if probabilities and not diverged and run.subject.objective_guessed:
        reader = forward_body.output_read_as_probabilities(run.subject.model)
        if reader:
            return _undecided(name, f"the output sums to 1 over its last dim and {reader} reads it as probabilities "
                              "(samples from it or takes its log): a distribution by design, so the runner's guessed "
                              "cross-entropy on it, which expects logits, says nothing (configure smoke.targets' "
                              "loss to decide).", {"runs": runs, "read_as_probabilities_by": reader})
    progress = (first["initial"] - best) / abs(first["initial"]) if math.isfinite(best) else 0.0
    if not probabilities and not diverged and progress >= OVERFIT_SLOW_FRACTION:
        status = "pass" if progress >= OVERFIT_PASS_PROGRESS else "warn"
        return CheckResult(name, status, f"loss fell from {first['initial']:.3g} to {best:.3g} ({progress:.0%}) in "
                           f"{run.steps} Adam steps at lr {' or '.join(runs)}: the model learns, but slower than "
                           "halving the loss on one batch; more steps (--steps) would tell more.", {"runs": runs})
    clamped = _clamping_output(run) if run.subject.objective_guessed and not probabilities and not diverged and \
        run.subject.task in ("classification", "language_model") else ""
    if clamped:
        return _undecided(name, f"the output is {clamped}'s (never below zero, exactly zero and without gradient where "
                          "a unit is off), and the loss is the runner's guess, a cross-entropy that reads it as logits: "
                          "a class whose unit is off cannot be raised, so a slow fall says nothing about the model (a "
                          "layer that ends in its activation, not a classifier; configure smoke.targets' task and "
                          "loss to decide).", {"runs": runs, "output_from": clamped})
    if run.steps_cut and not probabilities and not diverged:
        return CheckResult(name, "warn", f"loss fell from {first['initial']:.3g} to {best:.3g} ({progress:.0%}) in "
                           f"only {run.steps} Adam steps at lr {' or '.join(runs)} (all that fit the time budget): "
                           "too few to judge; a longer smoke.timeout would tell more.", {"runs": runs})
    message = (f"loss only fell from {first['initial']:.3g} to {best:.3g} in "
               f"{run.steps} Adam steps at lr {' or '.join(runs)} (needed ≤ {first['target']:.3g}{floor_note}): "
               "the model cannot fit a single batch")
    if diverged:
        message += f"; the loss became NaN/Inf at step {diverged[0][1]} (lr {diverged[0][0]})"
    if probabilities:
        message += ("; the output already sums to 1 over its last dim, so a softmax is applied before a loss that "
                    "expects logits (double softmax)")
    return CheckResult(name, "fail", message + ".", {"runs": runs})


# autograd nodes of activations that clamp at zero: below it their output is 0 and passes no gradient back
_CLAMPING_NODES = {"relubackward0": "a ReLU", "relu6backward0": "a ReLU6", "hardtanhbackward0": "a clamp",
                   "clampminbackward0": "a clamp", "clampbackward0": "a clamp", "thresholdbackward0": "a threshold"}


def _clamping_output(run: _Run) -> str:
    """"a ReLU" (or another activation that clamps at zero) when the selected output is made by one; "" else."""
    try:
        with torch.enable_grad():
            output = _primary_output(_forward(run.eval_model(), run.batch()))
    except Exception:  # noqa: BLE001 - the PR's forward: no claim then
        return ""
    node = getattr(output, "grad_fn", None)
    return _CLAMPING_NODES.get(type(node).__name__.lower(), "") if node is not None else ""


def _blank(tensor: torch.Tensor) -> torch.Tensor:
    """Zeros for float inputs; for integer/bool inputs a constant (the first value, so token ids stay valid)."""
    if tensor.is_floating_point() or tensor.is_complex():
        return torch.zeros_like(tensor)
    return torch.full_like(tensor, tensor.reshape(-1)[0].item()) if tensor.numel() else tensor.clone()


def _output_moves(model: nn.Module, reference: torch.Tensor, batch: Batch) -> Optional[float]:
    """Relative change of the output for ``batch`` against ``reference``; None when the forward raises (which
    means the input is used: the model cannot even run without it)."""
    try:
        with torch.no_grad():
            output = _require_output(_forward(model, batch))
    except Exception:  # noqa: BLE001
        return None
    return _relative_difference(reference, output)


def check_input_dependence(run: _Run) -> CheckResult:
    """In eval mode, replacing every input by zeros (constant tokens for integer inputs) changes the output;
    with several inputs, each one on its own should change it too (warn when one does not)."""
    name = "input-dependence"
    model = run.eval_model()
    batch = run.batch()
    with torch.no_grad():
        reference = _require_output(_forward(model, batch))
    inputs = _input_tensors(batch)
    blankable = [(label, tensor) for label, tensor in inputs if not torch.equal(_blank(tensor), tensor)]
    if not blankable:
        return CheckResult(name, "skip", "every input is already constant, so there is nothing to blank.")
    blank_ids = {id(tensor) for _, tensor in blankable}
    all_blank = _map_inputs(batch, lambda t: _blank(t) if id(t) in blank_ids else t)
    change = _output_moves(model, reference, all_blank)
    details = {"change_all_blank": change}
    if change is not None and change <= INPUT_DEPENDENCE_TOLERANCE:
        opened_model, opened = run.opened_model()
        if opened:
            opened_model.eval()
            with torch.no_grad():
                opened_reference = _require_output(_forward(opened_model, batch))
            opened_change = _output_moves(opened_model, opened_reference, all_blank)
            details.update(zero_initialized=opened, change_after_opening=opened_change)
            if opened_change is None or opened_change > INPUT_DEPENDENCE_TOLERANCE:
                return CheckResult(name, "pass", f"the output changes when the input is replaced by zeros after "
                                   f"{OPENING_STEPS} Adam steps; at initialization it did not, because "
                                   f"{_names(opened)} starts at exactly zero (a deliberate initialization).", details)
        if run.zero_gates():
            details["zero_gates"] = run.zero_gates()
            return CheckResult(name, "warn", "the output does not depend on the input at initialization, but "
                               f"{_names(run.zero_gates())} {_starts(run.zero_gates())} at exactly zero (a deliberate gate): not judged.",
                               details)
        return CheckResult(name, "fail", "the output does not depend on the input: replacing every input with zeros "
                           "(constant tokens) leaves it unchanged.", details)
    ignored = []
    if len(blankable) > 1:
        for label, tensor in blankable:
            one_blank = _map_inputs(batch, lambda t, target=tensor: _blank(t) if t is target else t)
            one_change = _output_moves(model, reference, one_blank)
            details[f"change_{label}"] = one_change
            if one_change is not None and one_change <= INPUT_DEPENDENCE_TOLERANCE:
                ignored.append(label)
    if ignored:
        verb, pronoun = ("does", "it") if len(ignored) == 1 else ("do", "them")
        return CheckResult(name, "warn", f"{_names(ignored)} {verb} not affect the output: blanking {pronoun} leaves "
                           "the output unchanged (ignored or overwritten in forward).", details)
    return CheckResult(name, "pass", "the output changes when the input is replaced by zeros/constant tokens.",
                       details)


def _first_embedding_output_hook(model: nn.Module, batch_size: int, captured: list):
    """Hooks every nn.Embedding: the first output with the batch on dim 0 is replaced by a leaf that requires
    grad, so the leakage check can differentiate with respect to it. Returns the hook handles."""
    def hook(module, inputs, output):
        if captured or not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != batch_size:
            return None
        leaf = output.detach().requires_grad_(True)
        captured.append((module, leaf))
        return leaf

    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Embedding)]


def check_batch_leakage(run: _Run) -> CheckResult:
    """In eval mode, ∂out[i]/∂x[j] is ~0 for j ≠ i (i = first and last row; relative tolerance 1e-6 against
    ∂out[i]/∂x[i]). Integer inputs are differentiated through the output of the first nn.Embedding."""
    name, batch_size = "batch-leakage", run.batch_size
    if batch_size < 2:
        return CheckResult(name, "skip", "needs a batch of at least 2.")
    if run.subject.graph:
        return CheckResult(name, "skip", "the batch's rows are the nodes of one graph (an adjacency input): rows "
                           "depend on their neighbours by design.")
    if not run.subject.inputs_batch_first or run.subject.output_batch_axis != 0:
        return CheckResult(name, "skip", "the configured inputs or output are not batch-first (batch_axis); rows are "
                           "compared only along dim 0.")
    sequence_first = _sequence_first_layers(run.subject.model)
    if sequence_first and all(t.dim() > 0 and t.shape[0] == batch_size for _, t in _input_tensors(run.fixed_batch)):
        return CheckResult(name, "skip", f"{sequence_first[0]} is sequence-first (batch_first=False), so dim 0 of the "
                           "input may be time rather than the batch; leakage cannot be told from attention over time.")
    model = run.eval_model()
    for param in model.parameters():
        param.requires_grad_(False)
    batch = run.batch()
    labelled = [(label, t) for label, t in _input_tensors(batch)
                if t.is_floating_point() and t.dim() > 0 and t.shape[0] == batch_size]
    leaf_of = {id(t): t.detach().clone().requires_grad_(True) for _, t in labelled}
    leaves: list[tuple[str, torch.Tensor]] = [(label, leaf_of[id(t)]) for label, t in labelled]
    batch = _map_inputs(batch, lambda t: leaf_of.get(id(t), t))
    handles = []
    captured: list = []
    if not leaves:
        handles = _first_embedding_output_hook(model, batch_size, captured)
    try:
        output = _require_output(_forward(model, batch))
    finally:
        for handle in handles:
            handle.remove()
    if captured:
        module, leaf = captured[0]
        leaves = [(f"the output of embedding '{_module_name(model, module)}'", leaf)]
    if not leaves:
        return CheckResult(name, "skip", "no float input with the batch on dim 0 and no nn.Embedding to "
                           "differentiate through.")
    if output.dim() == 0 or output.shape[0] != batch_size or not output.is_floating_point():
        return CheckResult(name, "skip", f"the output {tuple(output.shape)} {output.dtype} has no float batch dim 0.")
    generator = torch.Generator(device="cpu").manual_seed(run.seed)
    weights = torch.randn(output.shape[1:], generator=generator, dtype=output.dtype).to(output.device)
    rows = sorted({0, batch_size - 1})
    leak: Optional[tuple[int, int, float, str]] = None  # (output row, input row, relative gradient, through)
    judged = False
    for row in rows:
        gradients = torch.autograd.grad((output[row] * weights).sum(), [leaf for _, leaf in leaves],
                                        retain_graph=True, allow_unused=True)
        for (label, _), gradient in zip(leaves, gradients):
            if gradient is None:
                continue
            if not _is_finite(gradient):
                return CheckResult(name, "skip", "the gradient with respect to the input is non-finite, so leakage "
                                   "cannot be judged (see nan-localization).")
            per_row = gradient.detach().abs().reshape(batch_size, -1).amax(dim=1).double()
            own = float(per_row[row])
            others = per_row.clone()
            others[row] = 0
            other_row = int(others.argmax())
            other = float(others[other_row])
            judged = judged or own > 0 or other > 0
            if leak is None and other > 0 and other > LEAKAGE_RELATIVE_TOLERANCE * own:
                leak = (row, other_row, other / own if own > 0 else math.inf, label)
    details = {"rows_checked": rows, "inputs": [label for label, _ in leaves]}
    if leak is not None:
        row, other_row, ratio, label = leak
        details.update({"row": row, "leaks_from": other_row, "relative_gradient": ratio, "through": label})
        return CheckResult(name, "fail", f"output row {row} depends on input row {other_row} (through {label}): "
                           "information leaks across the batch (e.g. softmax/normalization over dim 0).", details)
    if not judged:
        return CheckResult(name, "skip", "the output's gradient with respect to the input is zero, so leakage "
                           "cannot be judged (see input-dependence).", details)
    return CheckResult(name, "pass", f"output rows {' and '.join(map(str, rows))} depend only on their own input "
                       "row in eval mode.", details)


def _sequence_first_layers(model: nn.Module) -> list[str]:
    """Recurrent and attention layers that take (time, batch, ...) inputs."""
    found = []
    for module_name, module in model.named_modules():
        if isinstance(module, nn.RNNBase) and not module.batch_first:
            found.append(f"{module_name} ({type(module).__name__})")
        elif isinstance(module, nn.MultiheadAttention) and not module.batch_first:
            found.append(f"{module_name} ({type(module).__name__})")
    return found


def _module_name(model: nn.Module, target: nn.Module) -> str:
    for module_name, module in model.named_modules():
        if module is target:
            return module_name or type(model).__name__
    return type(target).__name__


# A batch-size difference up to this many tolerances, where float64 cannot tell, is undecided rather than a failure:
# rounding through a deep float32 model reaches a few 1e-4 (InceptionV4 on CPU: 1.4e-4), while the batch dependence
# the check is for (statistics over the batch, padding to its longest item) moves outputs by far more.
ROUNDING_SUSPECT = 10
FLOAT64_MATCH_TOLERANCE = 1e-9  # relative, in float64: rounding leaves ~1e-13 through a deep net; a real difference stays


def _match_tolerance(output: torch.Tensor) -> float:
    """The relative difference two outputs of ``output``'s dtype may show from rounding alone."""
    eps = torch.finfo(output.dtype).eps if output.is_floating_point() else 0.0
    return max(OUTPUT_MATCH_TOLERANCE, 100 * eps)


def _in_float64(model: nn.Module, batch: Batch, function: Callable[[nn.Module, Batch], float]) -> Optional[float]:
    """``function(model, batch)`` with the model's floating parameters and buffers and the batch's floating inputs
    in float64 (the model's own tensors are put back as they were); None when the model cannot run so."""
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    saved = [t.data for t in tensors]
    try:
        for tensor in tensors:
            tensor.data = tensor.data.double()
        return function(model, _map_inputs(batch, lambda t: t.double() if t.is_floating_point() else t))
    except Exception:  # noqa: BLE001 - a tensor of its own in float32 (not a parameter or buffer), an op without float64
        return None
    finally:
        for tensor, data in zip(tensors, saved):
            tensor.data = data


_SAMPLING_FUNCTIONS = ("randn", "rand", "randint", "randn_like", "rand_like", "randint_like", "normal", "multinomial",
                       "bernoulli", "poisson", "randperm")
_SAMPLING_METHODS = ("normal_", "uniform_", "bernoulli_", "exponential_", "random_", "geometric_", "cauchy_",
                     "log_normal_", "multinomial", "bernoulli")
_DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


class _RandomnessRecorder(torch.overrides.TorchFunctionMode):
    """Records where the PR's code draws random numbers in a forward: ``samples`` (torch.randn_like, x.normal_,
    torch.multinomial...: sampling by design, a VAE's latent) and ``dropouts`` (a functional dropout called with
    training=True: the eval-mode bug), each as ``file:line in function: `code```."""

    def __init__(self) -> None:
        super().__init__()
        import torch.nn.functional as F

        self.samplers = {getattr(torch, n) for n in _SAMPLING_FUNCTIONS if hasattr(torch, n)} | \
            {getattr(torch.Tensor, n) for n in _SAMPLING_METHODS if hasattr(torch.Tensor, n)}
        self.dropout_functions = {getattr(F, n) for n in _DROPOUT_FUNCTIONS} | \
            {getattr(torch, n) for n in _DROPOUT_FUNCTIONS if hasattr(torch, n)}
        self.samples: list[str] = []
        self.dropouts: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = self.samples if func in self.samplers else self.dropouts if func in self.dropout_functions else None
        if found is not None:
            on = func in self.samplers or bool(kwargs.get("training", args[2] if len(args) > 2 else True))
            frame = sys._getframe(1)
            while frame is not None and not _is_user_file(frame.f_code.co_filename):
                frame = frame.f_back
            if on and frame is not None:
                found.append(_format_frame(traceback.extract_stack(frame, limit=1)[0]))
        return func(*args, **kwargs)


def _stochastic_by_design(model: nn.Module, batch: Batch, seed: int, device: str) -> tuple[list[str], list[str], float]:
    """(where the eval forward samples, where it runs dropout, the relative difference of two eval forwards that
    start from the same random seed): a forward that samples by design repeats itself under the same seed."""
    outputs = []
    recorder = _RandomnessRecorder()
    with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(device)):
        for _ in range(2):
            torch.manual_seed(seed)
            with recorder:
                outputs.append(_require_output(_forward(model, batch)))
    return list(dict.fromkeys(recorder.samples)), list(dict.fromkeys(recorder.dropouts)), \
        _relative_difference(outputs[0], outputs[1])


def check_eval_determinism(run: _Run) -> CheckResult:
    """In eval mode two forwards on the same batch agree, and the first k = B/2 rows of the batch give the same
    outputs as a batch made of just those k rows (relative tolerance 1e-4, or 100 eps of the output's dtype; a
    difference beyond it is rounding when the same forwards in float64 agree to 1e-9). A forward that samples in
    eval mode by design (torch.randn_like, not a dropout) and repeats itself under the same seed is skipped."""
    name, batch_size = "eval-determinism", run.batch_size
    model = run.eval_model()
    batch = run.batch()
    with torch.no_grad():
        first = _require_output(_forward(model, batch))
        second = _require_output(_forward(model, batch))
    tolerance = _match_tolerance(first)
    repeat_difference = _relative_difference(first, second)
    details: dict = {"repeat_difference": repeat_difference, "tolerance": tolerance}
    if repeat_difference > tolerance:
        samples, dropouts, seeded_difference = _stochastic_by_design(model, run.batch(), run.seed, run.subject.device)
        details.update(samples=samples, dropouts=dropouts, same_seed_difference=seeded_difference)
        if samples and not dropouts and seeded_difference <= tolerance:
            return CheckResult(name, "skip", f"stochastic by design: the eval-mode forward samples "
                               f"({_names(samples, 2)}) and repeats itself under the same seed, so determinism is "
                               "not checked.", {**details, "stochastic": True})
        in_float64 = None if dropouts or samples else _in_float64(
            model, batch, lambda m, b: _relative_difference(*(_require_output(_forward(m, b)) for _ in range(2))))
        details["float64_repeat_difference"] = in_float64
        if in_float64 is None or in_float64 > FLOAT64_MATCH_TOLERANCE:
            at = f" (a functional dropout in eval mode at {_names(dropouts, 2)})" if dropouts else ""
            return CheckResult(name, "fail", f"two eval-mode forwards on the same batch differ (relative "
                               f"{repeat_difference:.2g}): something random runs in eval mode{at} (F.dropout without "
                               "training=self.training, noise not gated on self.training).", details)
    if run.subject.graph:
        return CheckResult(name, "pass", "two eval-mode forwards agree (batch-size invariance does not apply: the "
                           "batch's rows are the nodes of one graph).", details)
    if batch_size < 2 or first.dim() == 0 or first.shape[0] != batch_size or not run.subject.inputs_batch_first:
        return CheckResult(name, "pass", "two eval-mode forwards agree (batch-size invariance not checked: the output "
                           "has no batch dim 0).", details)
    rows = batch_size // 2
    sliced = _map_inputs(batch, lambda t: t[:rows] if t.dim() > 0 and t.shape[0] == batch_size else t)
    try:
        with torch.no_grad():
            small = _require_output(_forward(model, sliced))
    except Exception as exc:  # noqa: BLE001
        if run.subject.inputs_guessed and _user_frame(exc.__traceback__):
            return _undecided(name, f"a batch of {rows} of the runner's guessed input fails where a batch of "
                              f"{batch_size} works ({type(exc).__name__}: {_one_line(exc, 160)}): the guess may be "
                              "wrong (configure smoke.targets' input to decide).", details)
        return CheckResult(name, "fail", f"a batch of {rows} fails where a batch of {batch_size} works "
                           f"({type(exc).__name__}: {_one_line(exc, 160)}): the batch size is hard-coded.", details)
    size_difference = _relative_difference(first[:rows], small)
    details["batch_size_difference"] = size_difference
    if size_difference > tolerance:
        def rows_alone_difference(model64: nn.Module, batch64: Batch) -> float:
            sliced64 = _map_inputs(batch64, lambda t: t[:rows] if t.dim() > 0 and t.shape[0] == batch_size else t)
            with torch.no_grad():
                return _relative_difference(_require_output(_forward(model64, batch64))[:rows],
                                            _require_output(_forward(model64, sliced64)))

        size_difference_64 = _in_float64(model, batch, rows_alone_difference)
        details["float64_batch_size_difference"] = size_difference_64
    sequence_first = _sequence_first_layers(model) if run.subject.inputs_guessed else []
    if size_difference > tolerance and (size_difference_64 is None or size_difference_64 > FLOAT64_MATCH_TOLERANCE) \
            and sequence_first:
        return _undecided(name, f"the first {rows} rows of a batch of {batch_size} give different outputs than the "
                          f"same {rows} rows alone (relative {size_difference:.2g}), but {sequence_first[0]} is "
                          "sequence-first "
                          "(batch_first=False) and the input is the runner's batch-first guess, so its dim 0 may be "
                          "time, which such a layer mixes by design (configure smoke.targets' input to decide).",
                          details)
    if size_difference > tolerance and size_difference_64 is None and size_difference <= ROUNDING_SUSPECT * tolerance:
        return _undecided(name, f"the first {rows} rows of a batch of {batch_size} give outputs {size_difference:.2g} "
                          f"(relative) apart from the same {rows} rows alone, within what rounding through a deep "
                          f"model can leave in {first.dtype}, and the model cannot run in float64 to tell rounding "
                          "from batch dependence.", details)
    if size_difference > tolerance and (size_difference_64 is None or size_difference_64 > FLOAT64_MATCH_TOLERANCE):
        return CheckResult(name, "fail", f"the first {rows} rows of a batch of {batch_size} give different outputs "
                           f"than the same {rows} rows alone (relative {size_difference:.2g}): outputs depend on "
                           "the batch they are in (padding to the batch's longest item, statistics over the batch).", details)
    rounding = (f" (up to rounding: {size_difference:.2g} in {first.dtype}, "
                f"{size_difference_64:.2g} in float64)") if size_difference > tolerance else ""
    return CheckResult(name, "pass", f"eval mode is deterministic and the first {rows} rows give the same outputs in "
                       f"a batch of {rows} and of {batch_size}{rounding}.", details)


_DROPOUT_TYPES = (nn.modules.dropout._DropoutNd,)
_NORM_TYPES = (nn.modules.batchnorm._BatchNorm,)


def check_train_eval_differ(run: _Run) -> CheckResult:
    """Only for models with Dropout (p > 0) or BatchNorm tracking running stats: train-mode and eval-mode
    outputs differ (otherwise model.train()/eval() does not reach those modules)."""
    name = "train-eval-differ"
    model = run.eval_model()
    mode_dependent = [f"{module_name} ({type(module).__name__})" for module_name, module in model.named_modules()
                      if (isinstance(module, _DROPOUT_TYPES) and module.p > 0)
                      or (isinstance(module, _NORM_TYPES) and module.track_running_stats)]
    if not mode_dependent:
        return CheckResult(name, "skip", "no Dropout or BatchNorm, so train and eval mode may match.")
    batch = run.batch()
    with torch.no_grad():
        evaluated = _require_output(_forward(model.eval(), batch))
        trained = _require_output(_forward(model.train(), batch))
    difference = _relative_difference(evaluated, trained)
    details = {"modules": mode_dependent, "difference": difference}
    if difference <= TRAIN_EVAL_MIN_DIFFERENCE and run.zero_gates():
        details["zero_gates"] = run.zero_gates()
        return CheckResult(name, "skip", f"train and eval outputs are identical, but {_names(run.zero_gates())} "
                           f"{_starts(run.zero_gates())} at exactly zero (a deliberate gate that may make the output constant at "
                           "initialization): not judged.", details)
    if difference <= TRAIN_EVAL_MIN_DIFFERENCE:
        return CheckResult(name, "fail", f"train-mode and eval-mode outputs are identical although the model has "
                           f"{_names(mode_dependent, 2)}: train()/eval() does not reach them (self.training "
                           "overridden, F.dropout(training=False), modules kept in a plain list).", details)
    return CheckResult(name, "pass", f"train and eval outputs differ (relative {difference:.2g}), as "
                       f"{_names(mode_dependent, 2)} should make them.", details)


# --- device placement -------------------------------------------------------------------------------------

# FakeTensorMode words it "found two different devices" up to torch 2.11 (seen on a GPU runner image), "same device"
# later; eager kernels say "same device" / "expected device".
_DEVICE_MISMATCH = re.compile(r"same device|expected device|found at least two devices|two different devices|"
                              r"device mismatch", re.I)
_HARD_CODED_CUDA = re.compile(r"not compiled with CUDA|not linked with support for cuda|no NVIDIA driver|"
                              r"CUDA driver|cuda is not available", re.I)
_FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "range",
              "linspace", "logspace", "eye", "tensor", "as_tensor", "tril_indices", "triu_indices", "bernoulli")


def _run_on_fake_meta(model: nn.Module, batch: Batch, recorder: "_FactoryRecorder") -> None:
    """Forward with every parameter, buffer and input replaced by a fake tensor on the 'meta' device.

    FakeTensorMode propagates devices for every op (matmul included, unlike plain meta tensors), so a tensor
    made in forward without ``device=`` — a fake *CPU* tensor — meets the model's meta tensors and raises
    "Expected all tensors to be on the same device", just as it would meet CUDA tensors on a GPU. CPU
    0-dim tensors (``torch.tensor(2.0)``) and CPU index tensors stay legal, as they are on CUDA.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call

    meta = torch.device("meta")
    with FakeTensorMode(allow_non_fake_inputs=True):
        state = {state_name: torch.empty(t.shape, dtype=t.dtype, device=meta)
                 for state_name, t in [*model.named_parameters(), *model.named_buffers()]}
        fake_batch = _map_inputs(batch, lambda t: torch.empty(t.shape, dtype=t.dtype, device=meta))
        with recorder:
            functional_call(model, state, fake_batch.args, fake_batch.kwargs, strict=False)


# ops that, unlike tensor[index], refuse an index tensor on another device than the tensor they index (on a GPU:
# F.embedding(cpu_ids, cuda_weight) raises). FakeTensorMode lets CPU index tensors through, so this checks them.
_INDEXING_OPS = {torch.embedding: (0, 1), torch.nn.functional.embedding: (1, 0), torch.index_select: (0, 2),
                 torch.Tensor.index_select: (0, 2), torch.gather: (0, 2), torch.Tensor.gather: (0, 2),
                 torch.nn.functional.embedding_bag: (1, 0)}


def _check_index_device(func, args: tuple, kwargs: dict) -> None:
    """Raises a device mismatch when an index tensor on the CPU indexes a tensor on another device (the fake
    'meta' model standing in for one on a GPU), as the same op would on a GPU."""
    indexed_at, index_at = _INDEXING_OPS[func]
    if len(args) <= max(indexed_at, index_at):
        return
    indexed, index = args[indexed_at], args[index_at]
    if isinstance(indexed, torch.Tensor) and isinstance(index, torch.Tensor) and index.dim() > 0 \
            and index.device.type == "cpu" and indexed.device.type not in ("cpu",):
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices: an index "
                           f"tensor on cpu indexes a tensor on the model's device in {getattr(func, '__name__', func)} "
                           "(made without device=, e.g. torch.arange position ids)")


class _FactoryRecorder(torch.overrides.TorchFunctionMode):
    """Records tensor factories (torch.zeros, torch.arange, torch.tensor, ...) called without ``device=``
    that return a tensor with at least one dim (0-dim CPU tensors mix with CUDA tensors, so they are fine)."""

    def __init__(self, on_meta: Optional[Callable[[str, int], bool]] = None):
        super().__init__()
        self.calls: list[str] = []
        self._factories = {getattr(torch, n) for n in _FACTORIES if hasattr(torch, n)}
        # (file, line) of such a call -> True: its tensor is made on 'meta' instead, as if it had device= (and it
        # is not recorded); gpu_runner.confirm places every factory but the flagged one's so
        self.on_meta = on_meta
        self.placed_by_code = 0  # tensors moved with .to(<a torch.device the code chose>), see _placed_by_the_code

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INDEXING_OPS:
            _check_index_device(func, args, kwargs)
        if func is torch.Tensor.to and _placed_by_the_code(args, kwargs):
            # ``torch.zeros(n).to(device)`` with ``device = torch.device("cuda" if torch.cuda.is_available() else
            # "cpu")``: a device object the code chose, the CPU only because this machine has no GPU; on one the
            # tensor would follow the model, so here it goes where the fake model is
            self.placed_by_code += 1
            return func(args[0], torch.device("meta"))
        result = func(*args, **kwargs)
        caller = sys._getframe(1)  # __torch_function__ is entered from C: this is the code that called func
        if func in self._factories and kwargs.get("device") is None and isinstance(result, torch.Tensor) \
                and result.dim() > 0 and _is_user_file(caller.f_code.co_filename) \
                and not (func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)):
            if self.on_meta is not None and self.on_meta(caller.f_code.co_filename, caller.f_lineno):
                return func(*args, **{**kwargs, "device": torch.device("meta")})
            self.calls.append(f"torch.{func.__name__} at {_format_frame(traceback.extract_stack(caller, limit=1)[0])}")
        return result


def _placed_by_the_code(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call moves a tensor to the CPU given as a ``torch.device`` object (not the string
    ``"cpu"``, nor a dtype) on a machine without a GPU: a device the code computes, ``torch.device("cuda" if
    torch.cuda.is_available() else "cpu")``, which on a GPU machine names the GPU the model is on."""
    if torch.cuda.is_available() or not args or not isinstance(args[0], torch.Tensor) or args[0].device.type != "cpu":
        return False
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, torch.device) and target.type == "cpu"


def _unregistered_tensor_attributes(model: nn.Module, told_where: bool = True) -> list[str]:
    """Tensors kept as plain attributes: model.to(device) does not move them (register_buffer does). Without
    ``told_where``, those of modules whose constructor takes a ``device`` are left out: they are made where the
    program tells the module to run, which the runner cannot see (it builds them on its own device)."""
    found = []
    for module_name, module in model.named_modules():
        if not told_where and _told_its_device(module):
            continue
        for attribute, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.dim() > 0:
                found.append(f"{module_name + '.' if module_name else ''}{attribute}")
    return found


def _told_its_device(module: nn.Module) -> bool:
    """Does the module's constructor take the device to build on (``def __init__(self, ..., device)``, torch's own
    factory-keyword convention)?"""
    try:
        return "device" in inspect.signature(type(module).__init__).parameters
    except (TypeError, ValueError):
        return False


def check_device_placement(run: _Run) -> CheckResult:
    """Forward (train and eval mode) on fake 'meta' tensors: any tensor the forward creates on the CPU (no
    ``device=``), or moves to a hard-coded device, and mixes with the model's tensors raises a device
    mismatch. When the model cannot run on fake tensors (data-dependent ops such as .item() or nonzero, or
    ops without a meta kernel), fall back to recording factory calls without ``device=`` during a real
    forward (a warning: the tensor might be moved later) and to listing unregistered tensor attributes."""
    name = "device-placement"
    model = run.model()
    fake_error: Optional[BaseException] = None
    for training in (True, False):
        recorder = _FactoryRecorder()
        try:
            _run_on_fake_meta(model.train(training), run.batch(), recorder)
        except Exception as exc:  # noqa: BLE001
            text = _one_line(exc, 200)
            where = _user_frame(exc.__traceback__)
            details = {"mode": "fake-meta", "training": training, "error": text, "where": where,
                       "factory_calls": recorder.calls}
            at = f" at {where}" if where else ""
            if _DEVICE_MISMATCH.search(str(exc)) and "cuda" in str(exc).lower():
                return CheckResult(name, "fail", f"forward moves a tensor to a hard-coded CUDA device{at}: {text}",
                                   details)
            if _DEVICE_MISMATCH.search(str(exc)):
                attributes = _unregistered_tensor_attributes(model)
                if attributes and not recorder.calls:
                    details["unregistered_tensors"] = attributes
                    if not _unregistered_tensor_attributes(model, told_where=False):
                        return CheckResult(name, "skip", f"{_names(attributes, 2)} is a plain tensor attribute of a "
                                           "module whose constructor takes the device to build on: it is made where "
                                           "the program tells it to run, which this run cannot see (undecided)",
                                           details)
                    return CheckResult(name, "fail", f"{_names(attributes, 2)} is a plain tensor attribute that "
                                       "model.to(device) does not move (use register_buffer), and forward mixes it "
                                       f"with the model's tensors{at}: {text}", details)
                made = f" ({_names(recorder.calls, 2)})" if recorder.calls else ""
                return CheckResult(name, "fail", f"forward creates a tensor on the CPU without device={made} and mixes "
                                   f"it with the model's tensors{at}: {text}", details)
            if _HARD_CODED_CUDA.search(str(exc)):
                return CheckResult(name, "fail", f"forward moves a tensor to a hard-coded CUDA device{at}: {text}",
                                   details)
            fake_error = exc
            break
    if fake_error is None:
        chosen = (f" ({recorder.placed_by_code} moved with .to() to a torch.device the code chooses, the CPU here "
                  "only because this machine has no GPU)") if recorder.placed_by_code else ""
        return CheckResult(name, "pass", "forward runs with every tensor on a non-CPU device (fake 'meta' tensors, "
                           f"train and eval mode): no tensor is created without device={chosen}.", {"mode": "fake-meta"})

    reason = f"{type(fake_error).__name__}: {_one_line(fake_error, 160)}"
    recorder = _FactoryRecorder()
    model = run.model().train()
    with torch.no_grad(), recorder:
        _forward(model, run.batch())
    attributes = _unregistered_tensor_attributes(model)
    details = {"mode": "recorded factory calls", "fake_tensor_error": reason, "factory_calls": recorder.calls,
               "unregistered_tensors": attributes}
    if recorder.calls or attributes:
        problem = (f"forward calls {recorder.calls[0]} without device=" if recorder.calls else
                   f"{attributes[0]} is a tensor attribute that model.to(device) does not move (use register_buffer)")
        return CheckResult(name, "warn", f"{problem}, which stays on the CPU when the model is on a GPU (could not run "
                           f"on fake tensors to confirm: {reason}).", details)
    return CheckResult(name, "pass", "no tensor factory without device= and no unregistered tensor attribute (checked "
                       f"by recording, since the model cannot run on fake tensors: {reason}).", details)


# --- NaN localisation -------------------------------------------------------------------------------------

def _tensors_in(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _has_nonfinite(value: Any) -> bool:
    return any(not _is_finite(t.detach()) for t in _tensors_in(value))


class _NonFiniteTracer:
    """Forward pre-hooks and hooks on every module: remembers the first module whose input or output holds a
    NaN/Inf. A non-finite *input* to a module whose producers were all finite points at the code between
    modules (the parent's forward), reported as such."""

    def __init__(self, model: nn.Module):
        self.first: Optional[tuple[str, str, str]] = None  # (kind, module name, module type)
        self._handles = []
        for module_name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(module_name, module)))
            self._handles.append(module.register_forward_hook(self._hook(module_name, module)))

    def _pre_hook(self, module_name, module):
        def hook(_module, inputs):
            if self.first is None and _has_nonfinite(inputs):
                self.first = ("input", module_name, type(module).__name__)
        return hook

    def _hook(self, module_name, module):
        def hook(_module, _inputs, output):
            if self.first is None and _has_nonfinite(output):
                self.first = ("output", module_name, type(module).__name__)
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _watch_backward(loss: torch.Tensor, culprit: list) -> list:
    """Hooks on every autograd node behind ``loss``: the first node whose incoming gradients are finite but whose
    outgoing ones are not is appended to ``culprit`` as (node name, forward line). Returns the hook handles."""
    def all_finite(gradients) -> bool:
        return all(g is None or _is_finite(g) for g in gradients)

    handles, seen, pending = [], set(), [loss.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)

        def hook(grad_inputs, grad_outputs, node=node):
            if not culprit and all_finite(grad_outputs) and not all_finite(grad_inputs):
                trace = "".join(node.metadata.get("traceback_", []) if hasattr(node, "metadata") else [])
                culprit.append((node.name(), _last_user_line(trace)))

        handles.append(node.register_hook(hook))
        pending.extend(next_node for next_node, _ in node.next_functions)
    return handles


_TRACE_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)\n\s*(?P<code>[^\n]*)')


def _last_user_line(forward_trace: str) -> str:
    """The innermost frame of the PR's code in a forward stack recorded by anomaly mode."""
    frames = [m for m in _TRACE_FRAME.finditer(forward_trace) if _is_user_file(m["file"])]
    if not frames:
        return ""
    last = frames[-1]
    return f"{os.path.basename(last['file'])}:{last['line']} in {last['name']}: `{last['code'].strip()}`"


def _describe_first_nonfinite(first: tuple[str, str, str]) -> str:
    kind, module_name, module_type = first
    if kind == "output":
        if module_name == "":
            return f"first non-finite value is made in the model's own forward ({module_type}), outside any submodule"
        return f"first non-finite output in module '{module_name}' ({module_type})"
    if module_name == "":
        return "the model's input already holds NaN/Inf (the batch, not the model)"
    return (f"first non-finite value is an input to module '{module_name}' ({module_type}): it is made by code in the "
            "enclosing forward, between submodules")


def check_nan_localization(run: _Run) -> CheckResult:
    """If an earlier check saw NaN/Inf, replay that computation (one step at init, or the training run up to
    the failing step) with hooks on every module and name the first module whose output is non-finite; when the
    forward stays finite, hooks on every autograd node (with anomaly mode recording forward stacks) name the
    first backward op that turns finite gradients into NaN/Inf and the line of code that made it. Pass when no
    earlier check saw a non-finite value."""
    name = "nan-localization"
    if not run.nonfinite_events:
        return CheckResult(name, "pass", "no NaN/Inf appeared in the outputs, losses or gradients of the checks above.")
    event = run.nonfinite_events[0]
    replay_steps = event.step if event.step is not None else 0
    lr = event.lr if event.lr is not None else PARAMS_CHANGE_LR
    run.seed_everything()
    model = run.model().train()
    batch = run.batch()
    optimizer = torch.optim.Adam([p for _, p in _trainable(model)], lr=lr)
    tracer = _NonFiniteTracer(model)
    backward_culprit: list[tuple[str, str]] = []
    step = 0
    try:
        # anomaly mode records each autograd node's forward stack, so a backward culprit maps to a line of code
        with torch.autograd.set_detect_anomaly(True, check_nan=False):
            for step in range(replay_steps + 1):
                optimizer.zero_grad(set_to_none=True)
                loss = _loss(run, _forward(model, batch), batch)
                if tracer.first is not None or not math.isfinite(float(loss.detach())):
                    break
                handles = _watch_backward(loss, backward_culprit)
                loss.backward()
                for handle in handles:
                    handle.remove()
                if backward_culprit:
                    break
                optimizer.step()
    finally:
        tracer.remove()
    when = f" at step {step} of training at lr {lr:g}" if event.step else " at init"
    details = {"event": asdict(event), "replayed_steps": step}
    if tracer.first is not None:
        details["first"] = list(tracer.first)
        return CheckResult(name, "fail", f"{_describe_first_nonfinite(tracer.first)}{when}.", details)
    if not math.isfinite(float(loss.detach())):
        return CheckResult(name, "fail", f"every module output is finite but the loss is {float(loss.detach())}"
                           f"{when}: the loss function produces it (log of 0, division by 0).", details)
    if backward_culprit:
        node, forward_line = backward_culprit[0]
        details.update({"backward_node": node, "forward_line": forward_line})
        made_at = f" (the op at {forward_line})" if forward_line else ""
        return CheckResult(name, "fail", f"the forward is finite but the backward is not{when}: {node} turns finite "
                           f"gradients into NaN/Inf{made_at}.", details)
    return CheckResult(name, "warn", f"{event.check} saw a non-finite {event.what}, but the replay{when} stayed finite "
                       "(non-deterministic ops?).", details)


def _unregistered_modules(model: nn.Module) -> list[tuple[str, int]]:
    """(attribute, number of parameters) for modules kept in a plain list, tuple or dict attribute: their
    parameters are not the model's (no optimizer sees them, .to(device) does not move them). A module of the
    list that is also registered another way (``add_module``, ``setattr`` under another name) is the model's:
    only parameters that ``model.parameters()`` lacks count."""
    registered = {id(p) for p in model.parameters()}
    found = []
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or not isinstance(value, (list, tuple, dict)):
                continue
            items = list(value.values()) if isinstance(value, dict) else list(value)
            held = [item for item in items if isinstance(item, nn.Module)]
            count = sum(p.numel() for item in held for p in item.parameters() if id(p) not in registered)
            if held and count:
                found.append((f"{module_name + '.' if module_name else ''}{attribute}", count))
    return found


def check_registration(run: _Run) -> CheckResult:
    """Every submodule with parameters is registered: none is held in a plain list, tuple or dict attribute
    (nn.ModuleList / nn.ModuleDict register theirs)."""
    return registration_result(run.model())


def registration_result(model: nn.Module) -> CheckResult:
    """module-registration on ``model`` as built (also before the builder would skip it for having no
    registered parameter: a model whose layers are all in a plain list has none)."""
    name = "module-registration"
    found = _unregistered_modules(model)
    if found:
        attribute, count = found[0]
        return CheckResult(name, "fail", f"parameters of `self.{attribute}` are not registered ({count:,} parameters "
                           "in a plain Python container): the optimizer never sees them and .to(device) does not "
                           "move them; use nn.ModuleList / nn.ModuleDict.", {"unregistered": found})
    return CheckResult(name, "pass", "every submodule with parameters is registered.")


# per-layer gradient health, warnings only (calibrated on the real models of bench/smoke_real.py)
VANISHING_RATIO = 1e-3  # first layer's gradient norm / last layer's ...
VANISHING_FIRST_NORM = 1e-4  # ... and the first layer's gradient norm itself
EXPLODING_RATIO = 70.0  # first / last above this
DEAD_FRACTION = 0.7  # exactly-zero gradient entries of one layer's weight
# ||delta w|| / ||w|| of one Adam step at PARAMS_CHANGE_LR. Adam moves every weight by about the learning rate
# whatever its gradient's scale, so the ratio measures the weights' scale against the step: 1e-2 to 1e-1 for
# the usual initializations (kaiming/xavier/normal 0.02). Far below, the layer's weights are so large that
# training barely moves them (initialized with std 10); far above, the first steps overwrite them (initialized at
# std 1e-5, next to zero).
UPDATE_RATIO_LOW = 1e-4
UPDATE_RATIO_HIGH = 1.0


def _update_ratios(model: nn.Module, layers: list[tuple[str, nn.Parameter]]) -> list[tuple[str, float]]:
    """(layer, ||delta w|| / ||w||) of one Adam step (lr PARAMS_CHANGE_LR) on the gradients the parameters hold;
    layers whose weights are exactly zero (zero-initialized on purpose: gates, output heads) or that get no gradient
    (a dead path, the gradients check's business) are left out."""
    before = {name: weight.detach().clone() for name, weight in layers}
    optimizer = torch.optim.Adam([p for _, p in _trainable(model) if p.grad is not None], lr=PARAMS_CHANGE_LR)
    optimizer.step()
    ratios = []
    for name, weight in layers:
        norm = float(before[name].double().norm())
        if weight.grad is not None and norm > 0 and bool(weight.grad.any()):  # no gradient: not a question of scale
            ratios.append((name, float((weight.detach() - before[name]).double().norm()) / norm))
    return ratios


def check_gradient_health(run: _Run) -> CheckResult:
    """One backward at init, over the weights of Linear and Conv layers in registration order: warns when the
    first layer's gradient is vanishingly small against the last's (ratio < 1e-3 and norm < 1e-4), exploding
    (ratio > 70), when a layer gets exactly-zero gradients on >= 70% of its weights (dead ReLUs), or when one
    Adam step moves a layer's weights by less than 1e-4 or more than 1x their norm (weights initialized at a
    scale training cannot move, or next to zero)."""
    name = "gradient-health"
    model = run.model()
    layers = [(module_name, module.weight) for module_name, module in model.named_modules()
              if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)) and isinstance(module.weight, nn.Parameter)
              and module.weight.requires_grad]
    if len(layers) < 2:
        return CheckResult(name, "skip", "fewer than two Linear/Conv layers to compare.")
    zero_layers = [n for n, weight in layers if not bool(weight.detach().any())]
    if zero_layers or run.zero_gates():  # a zero-initialized head or gate passes no gradient back at init: judge
        model, _ = run.opened_model()    # after it opened
    batch = run.batch()
    loss = _loss(run, _forward(model, batch), batch)
    if not loss.requires_grad:
        return CheckResult(name, "skip", "the loss does not require grad (see gradients).")
    loss.backward()
    norms = [(n, float(w.grad.detach().double().norm()), float((w.grad == 0).double().mean()))
             for n, w in layers if w.grad is not None]
    if len(norms) < 2 or not all(math.isfinite(norm) for _, norm, _ in norms):
        return CheckResult(name, "skip", "gradients are missing or non-finite (see gradients).")
    (first_name, first, _), (last_name, last, _) = norms[0], norms[-1]
    ratio = first / last if last > 0 else math.inf
    # a layer with no gradient at all is a dead path, the gradients check's business (and its diagnosis)
    if any(zero == 1.0 for _, _, zero in (norms[0], norms[-1])):
        return CheckResult(name, "skip", f"{norms[0][0] if norms[0][2] == 1.0 else norms[-1][0]} gets an exactly "
                           "zero gradient (see gradients).")
    dead = [(n, zero) for n, _, zero in norms if DEAD_FRACTION <= zero < 1.0]
    updates = _update_ratios(model, layers)
    details = {"first": [first_name, first], "last": [last_name, last], "ratio": ratio, "zero_at_init": zero_layers,
               "dead": [[n, z] for n, z in dead],
               "update_ratio": [min((r for _, r in updates), default=None), max((r for _, r in updates), default=None)]}
    if 0 < first < VANISHING_FIRST_NORM and last > 0 and ratio < VANISHING_RATIO:  # exactly 0: a dead path (gradients)
        return CheckResult(name, "warn", f"vanishing gradient: the first layer '{first_name}' gets a gradient norm of "
                           f"{first:.2g}, {ratio:.1g} of the last layer's ({last_name}).", details)
    if last > 0 and ratio > EXPLODING_RATIO:  # no gradient at all in the last layer is a dead layer, below
        return CheckResult(name, "warn", f"exploding gradient: the first layer '{first_name}' gets {ratio:.0f}× the "
                           f"gradient norm of the last layer ('{last_name}').", details)
    if dead:
        return CheckResult(name, "warn", f"{_names([n for n, _ in dead])}: {dead[0][1]:.0%} of the weights get an exactly "
                           "zero gradient at init (dead ReLUs, or units that never see the input).", details)
    stuck = [(n, r) for n, r in updates if r < UPDATE_RATIO_LOW]
    if stuck:
        return CheckResult(name, "warn", f"{_names([n for n, _ in stuck])}: one Adam step at lr {PARAMS_CHANGE_LR:g} "
                           f"changes the weights by {stuck[0][1]:.1g} of their norm (usually 1e-2 to 1e-1): they are "
                           "initialized so large that training will barely move them.", details)
    overwritten = [(n, r) for n, r in updates if r > UPDATE_RATIO_HIGH]
    if overwritten:
        return CheckResult(name, "warn", f"{_names([n for n, _ in overwritten])}: one Adam step at lr "
                           f"{PARAMS_CHANGE_LR:g} changes the weights by {overwritten[0][1]:.1f}x their norm: they are "
                           "initialized next to zero, so the first steps overwrite the initialization.", details)
    return CheckResult(name, "pass", f"first/last layer gradient norm ratio {ratio:.2g}; no dead layer; update/weight "
                       "ratio " + (f"{details['update_ratio'][0]:.1g} to {details['update_ratio'][1]:.1g}."
                                   if updates else "not measured."), details)


_CHECKS: tuple[tuple[str, Callable[[_Run], CheckResult]], ...] = (
    ("forward-contract", check_forward_contract),
    ("module-registration", check_registration),
    ("loss-at-init", check_loss_at_init),
    ("gradients", check_gradients),
    ("gradient-health", check_gradient_health),
    ("params-change", check_params_change),
    ("overfit-batch", check_overfit_batch),
    ("input-dependence", check_input_dependence),
    ("batch-leakage", check_batch_leakage),
    ("eval-determinism", check_eval_determinism),
    ("train-eval-differ", check_train_eval_differ),
    ("device-placement", check_device_placement),
    ("nan-localization", check_nan_localization),
)
CHECK_NAMES = tuple(check_name for check_name, _ in _CHECKS)


# --- measures ---------------------------------------------------------------------------------------------

def _step_tensor_bytes(run: _Run, model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors a training step holds at its peak, each storage once: parameters, buffers, inputs,
    the activations autograd saves for backward, the gradients and the optimizer's state. Counted, not read off
    the process (its RSS moves with the allocator's caching and whatever else ran), so no load changes it."""
    storages: dict = {}  # (address, device) -> (storage, bytes): held, so no address is reused while counting

    def count(tensor: Any) -> Any:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            try:
                storage = tensor.untyped_storage()
                storages[(storage.data_ptr(), str(tensor.device))] = (storage, storage.nbytes())
            except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage
                pass
        return tensor

    optimizer.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        loss = _loss(run, _forward(model, batch), batch)
    loss.backward()
    for tensor in [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters()),
                   *(value for state in optimizer.state.values() for value in state.values()),
                   *(tensor for _, tensor in _input_tensors(batch))]:
        count(tensor)
    optimizer.zero_grad(set_to_none=True)
    return sum(size for _, size in storages.values())


def _take_measures(run: _Run) -> tuple[dict, list[float], list[str]]:
    """params, step_time_ms (median of 10 Adam steps after 3 warm-up steps; 5 after 1 for a model scaled down to
    fit the time budget; the steps' times are returned too; on CPU, the thread's CPU time), peak_memory_bytes (CUDA's allocator; on CPU the
    tensor bytes of a step, ``_step_tensor_bytes``), loss_after_steps (from overfit-batch's lr 1e-3 run)."""
    subject = run.subject
    notes: list[str] = []
    measures: dict = {"params": sum(p.numel() for _, p in _trainable(subject.model)),
                      "loss_after_steps": run.loss_after_steps}
    on_cuda = str(subject.device).startswith("cuda") and torch.cuda.is_available()
    threads = torch.get_num_threads()
    timings: list[float] = []
    try:
        run.seed_everything()
        model = run.model().train()
        batch = run.batch()
        optimizer = torch.optim.Adam([p for _, p in _trainable(model)], lr=PARAMS_CHANGE_LR)
        if on_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            torch.set_num_threads(1)
        warmup, timed = (TIMING_WARMUP_STEPS, TIMING_STEPS) if not run.scaled else SCALED_TIMING_STEPS
        # on CPU the step's own CPU time (one thread): other processes' load moves wall time by 2x, not this
        clock = time.perf_counter if on_cuda else time.thread_time
        gc.disable()  # a collection lands in whichever step allocates past its threshold: time it in neither
        for step in range(warmup + timed):
            started = clock()
            optimizer.zero_grad(set_to_none=True)
            _loss(run, _forward(model, batch), batch).backward()
            optimizer.step()
            if on_cuda:
                torch.cuda.synchronize()
            if step >= warmup:
                timings.append(clock() - started)
        measures["step_time_ms"] = statistics.median(timings) * 1000
        if on_cuda:
            measures["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated())
        else:
            measures["peak_memory_bytes"] = _step_tensor_bytes(run, model, batch, optimizer)
            notes.append("step_time_ms is the CPU time of a single-threaded step on CPU; peak_memory_bytes counts the "
                         "tensors of a training step (parameters, activations saved for backward, gradients, "
                         "optimizer state)")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"could not time a training step: {type(exc).__name__}: {_one_line(exc, 160)}")
    finally:
        gc.enable()
        torch.set_num_threads(threads)
    return measures, [round(t * 1000, 4) for t in timings], notes
