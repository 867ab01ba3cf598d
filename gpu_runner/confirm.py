"""Targeted experiments that confirm or refute a static finding on a built target.

The worker (``bot/smoke.py``, ``torchreview smoke``) runs the static engine on the files it smoke-trains and
passes the findings a run can decide, as plain dicts ("claims"), with each target of the same file. This
module runs inside the sandboxed child, after the smoke checks, on the same built model: one experiment per
claim whose subject is part of the model (its class is one of the model's modules, or the model's own forward
is the one the finding names). Each verdict is ``confirmed``, ``refuted`` (the run did not show it: said as
such, never a reason to drop the static finding) or ``undecided``, with one sentence of evidence naming the
objects and the numbers. A claim about something this model does not contain gets no verdict.

It imports nothing of ``analyzers``: the sandbox binds only this package, and the claims arrive as data.

A claim: ``{"rule", "path", "line", "end_line", "class"}`` (``class``: the class the finding's line is in), plus,
by rule, ``forward_of`` (TR401, TR403: the class whose forward returns the activation) and ``attribute`` (TR302:
the ``self.<attribute>`` holding the modules).
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from gpu_runner.runner import DECIDABLE_RULES
from gpu_runner.subject import Subject
from gpu_runner.targets import SCRIPT_STEP

FLOOR_STEPS = 30  # Adam steps on one batch that show how close to its floor the loss gets
FLOOR_LR = 1e-2
_FUNCTIONAL_DROPOUT = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout)
_TORCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) + os.sep


def _verdict(claim: dict, verdict: str, evidence: str, **details) -> dict:
    return {"rule": claim["rule"], "path": claim["path"], "line": claim["line"], "verdict": verdict,
            "evidence": evidence, "details": details}


def confirm_findings(subject: Subject, path: str, claims: list[dict], seed: int = 0,
                     deadline: Optional[float] = None, code_root: Optional[str] = None) -> list[dict]:
    """A verdict for each claim this target (defined in ``path``) can decide; the model leaves as it came
    (parameters, buffers, each module's mode) and the caller's random state is untouched. A claim without a
    ``path`` is of the target's file; a malformed claim is skipped. ``deadline`` (a time.perf_counter() value):
    past it, the remaining claims are undecided (no time was left) rather than the target running into its
    timeout, which would cost it the checks' report. ``code_root``: the tree the paths are relative to (the files
    are then told apart exactly; without it, by their path's tail)."""
    from gpu_runner.checks import _restore, _snapshot

    results = []
    model = subject.model
    snapshot = _snapshot(model)
    modes = [(module, module.training) for module in model.modules()]
    devices = [torch.device(subject.device).index or 0] if str(subject.device).startswith("cuda") else []
    for claim in claims:
        claim = _well_formed(claim)
        experiment = _EXPERIMENTS.get(claim["rule"]) if claim is not None else None
        if experiment is None:
            continue
        claim = {**claim, "path": str(claim.get("path") or path), "target_path": _located(path, code_root)}
        if deadline is not None and time.perf_counter() >= deadline:
            if _about_this_model(subject, claim):
                results.append(_verdict(claim, "undecided", "no time was left for this experiment within the "
                                                            "target's share of smoke.timeout."))
            continue
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                result = experiment(subject, _located(claim["path"], code_root), claim, deadline)
        except Exception as exc:  # noqa: BLE001 - the PR's code can raise anything
            result = _failed(claim, exc)
        finally:
            _restore(model, snapshot)
            for module, training in modes:  # Module.train would run the PR's overrides: set the flags as found
                module.training = training
        if result is not None:
            results.append(result)
    return results


def _failed(claim: dict, exc: Exception) -> dict:
    """The verdict of an experiment that raised: undecided, saying whose code raised (the model's, at its frame, or
    the runner's: never a finding about the model)."""
    from gpu_runner.checks import _one_line, _user_frame

    where = _user_frame(exc.__traceback__)
    if where:
        return _verdict(claim, "undecided", f"the experiment could not run: the model's code raised "
                                            f"{type(exc).__name__} at {where}: {_one_line(exc, 200)}", error="model")
    return _verdict(claim, "undecided", f"the experiment could not run (a runner error, not a finding about the "
                                        f"model): {type(exc).__name__}: {_one_line(exc, 200)}", error="runner")


_CLAIM_TYPES = {"rule": str, "path": str, "line": int, "end_line": int, "class": str, "forward_of": str,
                "attribute": str}


def _well_formed(claim: Any) -> Optional[dict]:
    """The claim with the fields an experiment reads, each of its type (``end_line`` defaults to ``line``), or
    None: claims are data from the worker, or from an executor request's body."""
    if not isinstance(claim, dict) or not isinstance(claim.get("rule"), str) or type(claim.get("line")) is not int:
        return None
    clean = {key: claim[key] for key, kind in _CLAIM_TYPES.items()
             if type(claim.get(key)) is kind and (kind is not str or len(claim[key]) <= 500)}
    clean.setdefault("end_line", clean["line"])
    return clean if clean["end_line"] >= clean["line"] else None


def _about_this_model(subject: Subject, claim: dict) -> bool:
    """The claim's subject is part of this model (the experiments answer nothing for the others)."""
    if claim["rule"] in ("TR401", "TR403"):
        return _names_forward(subject, claim)
    return bool(_instances(subject.model, claim.get("class"), claim["path"]))


def _instances(model: nn.Module, class_name: Optional[str], path: str) -> list[tuple[str, nn.Module]]:
    """The model's modules (name, module) that are instances of ``class_name`` defined in ``path`` (a subclass's
    too: it runs the class's code)."""
    if not class_name:
        return []
    return [(name, module) for name, module in model.named_modules()
            if any(cls.__name__ == class_name and _defined_in(cls, path) for cls in type(module).__mro__)]


def _defined_in(cls: type, path: str) -> bool:
    return _same_file(getattr(sys.modules.get(cls.__module__), "__file__", None) or "", path)


def _located(path: str, code_root: Optional[str]) -> str:
    """``path`` (relative to the code's tree) as the absolute real path of the file, given that tree."""
    return os.path.realpath(os.path.join(code_root, path)) if code_root else path


def _same_file(filename: str, path: str) -> bool:
    """``filename`` (a module's or a frame's) is the file ``path``: exactly for an absolute ``path``
    (``_located``), else by its tail."""
    if os.path.isabs(path):
        return os.path.realpath(filename) == path
    filename = os.path.realpath(filename).replace(os.sep, "/")
    return filename == path or filename.endswith("/" + path.lstrip("./"))


# --- TR513: functional dropout without training= -----------------------------------------------------------

class _DropoutRecorder(torch.overrides.TorchFunctionMode):
    """Records every functional dropout call: (file, line of the nearest frame outside torch, p, training). With
    ``force_p``, a call from ``lines`` (file, first, last) made with p = 0 runs with p = ``force_p`` instead."""

    def __init__(self, force_p: Optional[float] = None, lines: Optional[tuple[str, int, int]] = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, float, bool]] = []
        self.force_p, self.lines = force_p, lines

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FUNCTIONAL_DROPOUT:
            frame = sys._getframe(1)
            while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                         or frame.f_code.co_filename == __file__):
                frame = frame.f_back
            if frame is not None:
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                self.calls.append((frame.f_code.co_filename, frame.f_lineno, float(p), bool(training)))
                if self.force_p is not None and self.lines is not None and float(p) == 0 and \
                        _same_file(frame.f_code.co_filename, self.lines[0]) and \
                        self.lines[1] <= frame.f_lineno <= self.lines[2]:
                    args, kwargs = args[:1], {**kwargs, "p": self.force_p, "training": training}
        return func(*args, **kwargs)


FORCED_P = 0.5  # the rate a flagged dropout built with p = 0 is run at, to show what it does once p > 0


def _two_eval_forwards(subject: Subject, recorder: _DropoutRecorder) -> float:
    """Relative difference of two eval-mode forwards of one batch, both under ``recorder``."""
    from gpu_runner.checks import _first_tensor, _forward, _relative_difference

    model = subject.model.eval()
    batch = subject.make_batch(2, 0)
    with torch.no_grad(), recorder:
        first = _first_tensor(_forward(model, batch))
        second = _first_tensor(_forward(model, batch))
    return _relative_difference(first, second) if first is not None and second is not None else math.nan


def _dropout_always_on(subject: Subject, path: str, claim: dict,
                       deadline: Optional[float] = None) -> Optional[dict]:
    """In eval mode, the flagged call runs with training=True (confirmed: two eval-mode forwards of one batch
    differ; when this build's p is 0, they are compared with p = 0.5 at that call), or with training=False
    (refuted); undecided when the eval forward does not reach it."""
    owners = _instances(subject.model, claim.get("class"), path)
    if not owners:
        return None
    line, end_line = claim["line"], claim.get("end_line") or claim["line"]
    where = f"{claim['path']}:{line}"
    recorder = _DropoutRecorder()
    difference = _two_eval_forwards(subject, recorder)
    here = [call for call in recorder.calls if _same_file(call[0], path) and line <= call[1] <= end_line]
    if not here:
        return _verdict(claim, "undecided", f"the eval-mode forward of `{type(subject.model).__name__}` never reached "
                                            f"the dropout call at {where}.")
    on = [call for call in here if call[3]]
    if not on:
        agree = ("two eval-mode forwards of the same batch agree" if difference == 0 else
                 f"two eval-mode forwards of the same batch differ by {difference:.2g}, from something else")
        return _verdict(claim, "refuted", f"after `model.eval()`, the dropout at {where} ran with training=False "
                                          f"(it is passed some other way); {agree}.", difference=difference)
    p = max(call[2] for call in on)
    if p > 0:
        differ = (f"two eval-mode forwards of the same batch differ (relative {difference:.2g})" if difference > 0
                  else "(the two eval-mode forwards happened to agree)")
        return _verdict(claim, "confirmed", f"after `model.eval()`, the dropout at {where} still ran with "
                                            f"training=True and p={p:g}; {differ}.", p=p, difference=difference)
    forced = _two_eval_forwards(subject, _DropoutRecorder(FORCED_P, (path, line, end_line)))
    differ = (f"two eval-mode forwards of the same batch differ (relative {forced:.2g})" if forced > 0
              else "the two eval-mode forwards happened to agree")
    return _verdict(claim, "confirmed", f"after `model.eval()`, the dropout at {where} still ran with training=True; "
                                        f"this build's p is 0, so it dropped nothing, but with p={FORCED_P:g} at that "
                                        f"call {differ}.", p=0.0, difference=forced)


# --- TR302: submodules in a plain container ----------------------------------------------------------------

def _plain_container(subject: Subject, path: str, claim: dict,
                     deadline: Optional[float] = None) -> Optional[dict]:
    """The flagged ``self.<attribute>`` of each instance of the class holds modules whose parameters are not in
    ``model.parameters()`` (confirmed), or everything it holds is registered (refuted)."""
    attribute = claim.get("attribute")
    owners = _instances(subject.model, claim.get("class"), path)
    if not owners or not attribute:
        return None
    registered = {id(p) for p in subject.model.parameters()}
    holders = [(name, vars(module).get(attribute, getattr(module, attribute, None))) for name, module in owners]
    holders = [(name, value) for name, value in holders if value is not None]
    if not holders:
        return _verdict(claim, "undecided", f"no `{claim['class']}` of the built model has `self.{attribute}`.")
    missing = total = 0
    for name, value in holders:
        items = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, (list, tuple)) \
            else list(value.children()) if isinstance(value, nn.Module) else []
        for item in items:
            if isinstance(item, nn.Parameter):
                total += item.numel()
                missing += item.numel() * (id(item) not in registered)
            elif isinstance(item, nn.Module):
                for parameter in item.parameters():
                    total += parameter.numel()
                    missing += parameter.numel() * (id(parameter) not in registered)
    name = holders[0][0]
    owner = f"`{name}.{attribute}`" if name else f"`self.{attribute}`"
    if missing:
        return _verdict(claim, "confirmed", f"{missing:,} of the {total:,} parameters in {owner} (in "
                                            f"{len(holders)} `{claim['class']}` module(s)) are not in "
                                            "`model.parameters()`: no optimizer built from it updates them.",
                        missing=missing, total=total)
    if total:
        return _verdict(claim, "refuted", f"all {total:,} parameters in {owner} are in `model.parameters()`.",
                        missing=0, total=total)
    return _verdict(claim, "undecided", f"{owner} holds no parameters in this build, so nothing is missing from "
                                        "`model.parameters()` (its modules still miss `.train()`/`.eval()` and "
                                        "`.to()`).", missing=0, total=0)


# --- TR401 / TR403: an activation fed to a loss that applies it again ---------------------------------------

def _output(subject: Subject) -> Optional[torch.Tensor]:
    from gpu_runner.checks import _first_tensor, _forward

    with torch.no_grad():
        output = _first_tensor(_forward(subject.model.train(), subject.make_batch(8, 0)))
    return output.detach().float() if isinstance(output, torch.Tensor) and output.is_floating_point() else None


def _probability_dim(output: torch.Tensor) -> Optional[int]:
    """The dimension over which the output's entries are non-negative and sum to 1 (the class dimension of a
    softmax), preferring dim 1 (CrossEntropyLoss's) then the last."""
    if output.dim() < 2 or not bool(torch.isfinite(output).all()) or bool((output < 0).any()):
        return None
    for dim in dict.fromkeys((1, output.dim() - 1)):
        sums = output.sum(dim=dim)
        if output.shape[dim] > 1 and bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3)):
            return dim
    return None


def cross_entropy_floor(classes: int) -> float:
    """The lowest CrossEntropyLoss over ``classes`` classes when its input is a probability vector p (p_j >= 0,
    sum p = 1) instead of logits: loss(p, y) = -p_y + log(sum_j e^{p_j}). For a fixed p_y = a, log-sum-exp is
    Schur-convex, so the rest is best spread evenly, (1 - a)/(C - 1) each; along that line the derivative in a is
    -1 + (e^a - e^b)/(e^a + (C-1) e^b) < 0, so the minimum is at a = 1, the one-hot vector:
    -1 + log(e + C - 1) = log(1 + (C - 1)/e). It is also the floor over any input in [0, 1]^C (a softmax over
    another dimension): the loss falls as p_y grows (d/dp_y = -1 + softmax(p)_y < 0) and rises with every other
    p_j, so the one-hot vector is again the minimum."""
    return math.log(1 + (classes - 1) / math.e)


def _train_floor(subject: Subject, loss: Callable[[torch.Tensor], torch.Tensor],
                 deadline: Optional[float] = None) -> tuple[Optional[float], int]:
    """The lowest ``loss(output)`` in ``FLOOR_STEPS`` Adam steps on one batch (dropout modules off), fewer when
    ``deadline`` comes first; (that loss, the steps taken)."""
    from gpu_runner.checks import _dropout_off, _first_tensor, _forward, _trainable

    model = subject.model.train()
    _dropout_off(model)
    parameters = [p for _, p in _trainable(model)]
    if not parameters:
        return None, 0
    optimizer = torch.optim.Adam(parameters, lr=FLOOR_LR)
    batch = subject.make_batch(8, 0)
    best, steps = math.inf, 0
    for _ in range(FLOOR_STEPS):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        optimizer.zero_grad(set_to_none=True)
        value = loss(_first_tensor(_forward(model, batch)).float())
        if not torch.isfinite(value):
            break
        best = min(best, float(value.detach()))
        value.backward()
        optimizer.step()
        steps += 1
    model.zero_grad(set_to_none=True)
    return (best if math.isfinite(best) else None), steps


def _names_forward(subject: Subject, claim: dict) -> bool:
    """The finding (maybe in a training script) names the forward of this target's class."""
    cls = type(subject.model)
    return claim.get("forward_of") == cls.__name__ and _defined_in(cls, claim["target_path"])


def _softmax_into_cross_entropy(subject: Subject, path: str, claim: dict,
                                deadline: Optional[float] = None) -> Optional[dict]:
    """The model's output is a probability vector over C classes (confirmed: CrossEntropyLoss on it cannot fall
    below log(1 + (C-1)/e), shown by training on one batch), or it is not (refuted)."""
    if not _names_forward(subject, claim):
        return None
    name = type(subject.model).__name__
    output = _output(subject)
    if output is None or output.dim() < 2:
        return _verdict(claim, "undecided", f"`{name}`'s output is not a floating-point tensor with a class "
                                            "dimension.")
    dim = _probability_dim(output)
    # a softmax over another dimension (the batch: F.softmax(x, dim=0), or a 3-d output's implicit dim) still
    # leaves every entry in [0, 1], where the same floor holds
    bounded = dim is None and bool(torch.isfinite(output).all()) and \
        0 <= float(output.min()) <= float(output.max()) <= 1
    if bounded:
        dim = 1 if output.dim() == 2 else output.dim() - 1
        if output.shape[dim] < 2:
            return _verdict(claim, "undecided", f"`{name}`'s output (shape {tuple(output.shape)}) lies in [0, 1] "
                                                "but has a single class: CrossEntropyLoss over one class is 0 "
                                                "whatever the model does, so there is no floor to show.")
    if dim is None:
        sums = output.sum(dim=-1)
        return _verdict(claim, "refuted", f"`{name}`'s output (shape {tuple(output.shape)}) is not a probability "
                                          f"vector in train mode: its rows sum to {float(sums.min()):.3g} … "
                                          f"{float(sums.max()):.3g} and its entries range over "
                                          f"{float(output.min()):.3g} … {float(output.max()):.3g}, so "
                                          "CrossEntropyLoss gets logits here.")
    classes = output.shape[dim]
    floor = cross_entropy_floor(classes)
    target = torch.randint(0, classes, output.movedim(dim, -1).shape[:-1], generator=torch.Generator().manual_seed(0))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.movedim(dim, -1).reshape(-1, classes), target.to(out.device).reshape(-1))

    reached, steps = _train_floor(subject, loss, deadline)
    shown = f"; {steps} Adam steps on one batch got it to {reached:.3g}" if reached is not None else ""
    shape = (f"lies in [0, 1] without summing to 1 over its {classes} classes (dim {dim}; a softmax over another "
             "dimension)" if bounded else f"sums to 1 over its {classes} classes (dim {dim})")
    return _verdict(claim, "confirmed", f"`{name}`'s output {shape}, so "
                                        f"CrossEntropyLoss on it cannot fall below log(1 + {classes - 1}/e) = "
                                        f"{floor:.3g} however well the model learns{shown}.",
                    classes=classes, floor=floor, reached=reached)


def _sigmoid_into_bce_with_logits(subject: Subject, path: str, claim: dict,
                                  deadline: Optional[float] = None) -> Optional[dict]:
    """The model's output lies in [0, 1] (confirmed: BCEWithLogitsLoss sees sigmoid(p) in [0.5, 0.731], so the
    loss cannot fall below log(1 + 1/e) for a positive target nor log 2 for a negative one), or it does not
    (refuted)."""
    if not _names_forward(subject, claim):
        return None
    name = type(subject.model).__name__
    output = _output(subject)
    if output is None:
        return _verdict(claim, "undecided", f"`{name}`'s output is not a floating-point tensor.")
    low, high = float(output.min()), float(output.max())
    if not (math.isfinite(low) and math.isfinite(high)) or low < 0 or high > 1:
        return _verdict(claim, "refuted", f"`{name}`'s output ranges over {low:.3g} … {high:.3g} in train mode: "
                                          "not a sigmoid's, so BCEWithLogitsLoss gets logits here.")
    target = (torch.rand(output.shape, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    positive, negative = math.log(1 + math.exp(-1)), math.log(2)
    floor = float(target.mean()) * positive + (1 - float(target.mean())) * negative

    def loss(out: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out, target.to(out.device))

    reached, steps = _train_floor(subject, loss, deadline)
    shown = f"; {steps} Adam steps on one batch got it to {reached:.3g}" if reached is not None else ""
    return _verdict(claim, "confirmed", f"`{name}`'s output lies in [0, 1] ({low:.3g} … {high:.3g}), so "
                                        "BCEWithLogitsLoss sees sigmoid(p) in [0.5, 0.731]: the loss cannot fall "
                                        f"below log(1 + 1/e) = {positive:.3g} for a positive target nor log 2 = "
                                        f"{negative:.3g} for a negative one ({floor:.3g} on this batch's random "
                                        "targets)"
                                        f"{shown}.", floor=floor, reached=reached)


# --- TR701: a tensor made in forward without device= -------------------------------------------------------

def _tensor_without_device(subject: Subject, path: str, claim: dict,
                           deadline: Optional[float] = None) -> Optional[dict]:
    """The forward on a stand-in for a GPU (fake 'meta' tensors, as the device-placement check runs it), with every
    other factory called without ``device=`` making its tensor on 'meta', so that only the flagged line's tensors
    are on the CPU: the forward fails with a device mismatch that goes away once they too are on 'meta'
    (confirmed), or it goes through (refuted: they are moved, or only used on the CPU). A mismatch that stays
    when they are placed comes from something else: undecided."""
    from gpu_runner.checks import _DEVICE_MISMATCH, _FactoryRecorder, _one_line, _run_on_fake_meta, _user_frame

    if not _instances(subject.model, claim.get("class"), path):
        return None
    line, end_line = claim["line"], claim.get("end_line") or claim["line"]

    def flagged(filename: str, number: int) -> bool:
        return _same_file(filename, path) and line <= number <= end_line

    def forward(on_meta: Callable[[str, int], bool]) -> tuple[_FactoryRecorder, Optional[BaseException]]:
        recorder = _FactoryRecorder(on_meta)
        try:
            _run_on_fake_meta(subject.model.train(), subject.make_batch(2, 0), recorder)
        except Exception as exc:  # noqa: BLE001 - the PR's code can raise anything
            return recorder, exc
        return recorder, None

    recorder, error = forward(lambda filename, number: not flagged(filename, number))
    name = os.path.basename(path)
    made = [call for call in recorder.calls if any(f" at {name}:{n} in " in call for n in range(line, end_line + 1))]
    where = f"{claim['path']}:{line}"
    stand_in = "on a stand-in for a GPU (the model's tensors fake tensors on the 'meta' device)"
    if made and error is not None and _DEVICE_MISMATCH.search(str(error)):
        factory = made[0].split(" at ", 1)[0]
        _, placed = forward(lambda filename, number: True)
        if placed is not None and (type(placed), str(placed), _user_frame(placed.__traceback__)) == \
                (type(error), str(error), _user_frame(error.__traceback__)):
            return _verdict(claim, "undecided", f"{stand_in}, the forward failed with a device mismatch whether or "
                                                f"not `{factory}` at {where} made its tensor on the CPU: "
                                                f"{_one_line(error, 200)}")
        return _verdict(claim, "confirmed", f"{stand_in}, `{factory}` at {where} made a CPU tensor and the forward "
                                            f"failed: {_one_line(error, 200)}")
    if made and error is None:
        factory = made[0].split(" at ", 1)[0]
        return _verdict(claim, "refuted", f"{stand_in}, `{factory}` at {where} made a CPU tensor, but the forward "
                                          "went through: it is moved or only used on the CPU.")
    if error is not None:
        return _verdict(claim, "undecided", f"the forward could not run {stand_in} up to {where}: "
                                            f"{_one_line(error, 200)}")
    return _verdict(claim, "undecided", f"the forward made no tensor without device= at {where} (the line was not "
                                        "reached, or it made a 0-dim tensor).")


_EXPERIMENTS: dict[str, Callable[[Subject, str, dict, Optional[float]], Optional[dict]]] = {
    "TR302": _plain_container,
    "TR401": _softmax_into_cross_entropy,
    "TR403": _sigmoid_into_bce_with_logits,
    "TR513": _dropout_always_on,
    "TR701": _tensor_without_device,
}


# --- claims about a training step, decided by running it (gpu_runner.steps) ----------------------------------
#
# A step target runs the PR's own training function a few iterations (gpu_runner.steps). Its checks already
# decide two claims: TR101 (no zero_grad: a backward after a step finds the gradient that step used) and TR201
# (an evaluation helper that never calls model.eval()). Two more are watched while it runs, through a profile
# hook on the step's own frames: TR104 (a loss accumulated with its graph: what the accumulator holds when the
# function returns) and TR713 (gradients clipped while still scaled: the GradScaler's state at the clip call).

@dataclass(frozen=True)
class _Function:
    name: str
    first: int  # its first decorator's line, or the def's
    last: int

    def holds(self, line: int) -> bool:
        return self.first <= line <= self.last


def _functions(source: str) -> list[_Function]:
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [_Function(node.name, min([node.lineno] + [d.lineno for d in node.decorator_list]),
                      node.end_lineno or node.lineno)
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _script_loop(source: str) -> Optional[_Function]:
    import ast

    from gpu_runner.targets import training_loop_chain

    try:
        chain = training_loop_chain(ast.parse(source).body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return _Function(SCRIPT_STEP, chain[-1].lineno, chain[-1].end_lineno or chain[-1].lineno) if chain else None


def _innermost(functions: list[_Function], line: int) -> Optional[_Function]:
    around = [f for f in functions if f.holds(line)]
    return max(around, key=lambda f: f.first) if around else None


def _accumulator(source_line: str) -> Optional[str]:
    """The name a flagged accumulation adds to: ``total += loss``, ``total = total + loss``, ``losses.append(loss)``
    (``self.total`` as ``self.total``)."""
    import ast

    try:
        statement = ast.parse(source_line.strip()).body[0]
    except (SyntaxError, ValueError, IndexError):
        return None
    if isinstance(statement, ast.AugAssign):
        target = statement.target
    elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
    elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) and \
            isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr in ("append", "extend"):
        target = statement.value.func.value
    else:
        return None
    try:
        return ast.unparse(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
    except (ValueError, RecursionError):
        return None


def _graph_size(tensor: torch.Tensor, limit: int = 200_000) -> int:
    """How many autograd nodes ``tensor``'s history keeps alive (at most ``limit``)."""
    seen, stack = set(), [tensor.grad_fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return len(seen)


def _with_history(value: Any) -> list[torch.Tensor]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [item for item in items if isinstance(item, torch.Tensor) and item.grad_fn is not None]


class _StepWatch:
    """While the step runs: what each watched function's locals hold when it returns (TR104's accumulators), and
    the GradScaler state at each clip of gradients called from a flagged line (TR713). A profile hook (chained
    to any already set): it sees only Python frames' calls and returns, and looks closer only at the step file's
    functions and torch's clip functions."""

    _CLIPS = ("clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_")

    def __init__(self, path: str, functions: list[_Function], accumulators: dict[_Function, set[str]],
                 clip_lines: list[tuple[int, int]]) -> None:
        self.path, self.functions = path, functions
        self.accumulators, self.clip_lines = accumulators, clip_lines
        self.returned: dict[tuple[_Function, str], tuple[Any, int]] = {}  # (function, name) -> (value, returns)
        self.scalers: dict[int, Any] = {}
        self.clips: list[dict] = []
        self._roles: dict[Any, Optional[_Function]] = {}
        self._previous = None
        self.failures = 0  # observations that raised (a property of the PR's object, a scaler in a bad state)

    def __enter__(self) -> "_StepWatch":
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc_info) -> None:
        sys.setprofile(self._previous)

    def _role(self, code) -> Optional[_Function]:
        if code not in self._roles:
            self._roles[code] = next((f for f in self.accumulators if f.name == code.co_name and
                                      f.holds(code.co_firstlineno)), None) \
                if _same_file(code.co_filename, self.path) else None
        return self._roles[code]

    def _profile(self, frame, event, arg) -> None:
        if self._previous is not None:
            self._previous(frame, event, arg)
        try:
            self._observe(frame, event, arg)
        except Exception:  # noqa: BLE001 - a raising hook would raise inside the PR's step: what it missed is undecided
            self.failures += 1

    def _observe(self, frame, event, arg) -> None:
        if event == "return":
            function = self._role(frame.f_code)
            if function is not None:
                for name in self.accumulators[function]:
                    value = _local(frame, name)
                    if value is not _MISSING:
                        returns = self.returned.get((function, name), (None, 0))[1]
                        self.returned[(function, name)] = (value, returns + 1)
        elif event == "call" and frame.f_code.co_filename.startswith(_TORCH_DIR):
            name = frame.f_code.co_name
            if name in ("scale", "unscale_"):
                owner = frame.f_locals.get("self")
                if isinstance(owner, torch.amp.GradScaler):
                    self.scalers[id(owner)] = owner
            elif name in self._CLIPS and self.clip_lines:
                self._clip_called(frame)

    def _clip_called(self, frame) -> None:
        caller = frame.f_back
        while caller is not None and caller.f_code.co_filename.startswith(_TORCH_DIR):
            caller = caller.f_back
        if caller is None or not _same_file(caller.f_code.co_filename, self.path):
            return
        line = caller.f_lineno
        if not any(first <= line <= last for first, last in self.clip_lines):
            return
        from torch.amp.grad_scaler import OptState

        states = []
        for scaler in self.scalers.values():
            if not scaler.is_enabled():
                continue
            stages = [state.get("stage") for state in getattr(scaler, "_per_optimizer_states", {}).values()]
            states.append({"scale": float(scaler.get_scale()),
                           "unscaled": any(stage is OptState.UNSCALED for stage in stages)})
        self.clips.append({"line": line, "function": frame.f_code.co_name, "max_norm": frame.f_locals.get("max_norm"),
                           "scalers": states, "disabled": sum(not s.is_enabled() for s in self.scalers.values())})


_MISSING = object()


def _local(frame, name: str) -> Any:
    head, _, attribute = name.partition(".")
    value = frame.f_locals.get(head, _MISSING)
    for part in attribute.split(".") if attribute else ():
        value = getattr(value, part, _MISSING) if value is not _MISSING else _MISSING
    return value


def confirm_step(run_step: Callable[[], dict], code_root: str, target: str, claims: list) -> dict:
    """Runs the training step (``run_step``: gpu_runner.steps.smoke_step bound to its arguments) and returns its
    report with a verdict, under ``findings``, for each claim about this step: TR101, TR104 and TR713 when the
    flagged line is in the step's function, TR201 when it is in the evaluation helper the step's eval-mode check
    ran. Claims about other code get none."""
    claims = [c for c in (_well_formed(c) for c in claims) if c is not None and c["rule"] in _STEP_EXPERIMENTS]
    path, _, qualified = target.partition(":")
    located = _located(path, code_root)
    try:
        with open(located, encoding="utf-8", errors="replace") as handle:
            source = handle.read()
    except OSError:
        return run_step()
    claims = [c for c in claims if _same_file(_located(c.get("path") or path, code_root), located)]
    if not claims:
        return run_step()
    functions, lines = _functions(source), source.splitlines()
    step = next((f for f in functions if f.name == qualified.rsplit(".", 1)[-1]), None)
    if qualified == SCRIPT_STEP:  # a script's module-level loop: its lines are the step's
        step = _script_loop(source)
    accumulators: dict[_Function, set[str]] = {}
    for claim in claims:
        function = _innermost(functions, claim["line"])
        if claim["rule"] == "TR104" and function is not None and 0 < claim["line"] <= len(lines):
            name = _accumulator(lines[claim["line"] - 1])
            if name:
                accumulators.setdefault(function, set()).add(name)
    clip_lines = [(c["line"], c["end_line"]) for c in claims if c["rule"] == "TR713"]
    watch = _StepWatch(located, functions, accumulators, clip_lines)
    with watch:
        report = run_step()
    verdicts = []
    for claim in claims:
        experiment = _STEP_EXPERIMENTS[claim["rule"]]
        verdict = experiment(report, claim, step, functions, watch, lines)
        if verdict is not None:
            verdicts.append(verdict)
    if verdicts:
        report["findings"] = verdicts
    return report


def _check_of(report: dict, name: str) -> Optional[dict]:
    return next((c for c in report.get("checks") or [] if isinstance(c, dict) and c.get("name") == name), None)


def _did_not_run(report: dict, claim: dict) -> Optional[dict]:
    if report.get("status") in ("passed", "failed"):
        return None
    return _verdict(claim, "undecided", f"the step could not run on the runner's synthetic arguments: "
                                        f"{report.get('reason') or report.get('status')}")


def _in_step(claim: dict, step: Optional[_Function]) -> bool:
    return step is not None and step.holds(claim["line"])


def _zero_grad_from_step(report: dict, claim: dict, step: Optional[_Function], functions, watch, lines):
    """TR101: the step's zero-grad check (a backward after an optimizer step found the gradient that step used)."""
    if not _in_step(claim, step):
        return None
    undecided = _did_not_run(report, claim)
    if undecided is not None:
        return undecided
    check = _check_of(report, "zero-grad")
    if check is None or check.get("status") == "skip":
        return _verdict(claim, "undecided", (check or {}).get("message") or "the step's gradients were not watched.")
    if check.get("status") == "fail":
        return _verdict(claim, "confirmed", check["message"], check="zero-grad")
    return _verdict(claim, "refuted", f"running `{step.name}`: {check['message']}", check="zero-grad")


def _eval_mode_from_step(report: dict, claim: dict, step: Optional[_Function], functions, watch, lines):
    """TR201: the step's eval-mode check, which calls the file's evaluation helper after training."""
    check = _check_of(report, "eval-mode")
    line = (check or {}).get("details", {}).get("line")
    helper = _innermost(functions, line) if isinstance(line, int) else None
    if check is None or helper is None or not helper.holds(claim["line"]):
        return None
    if check.get("status") == "skip":
        return _verdict(claim, "undecided", check.get("message") or "the evaluation helper did not run.")
    if check.get("status") == "fail":
        return _verdict(claim, "confirmed", check["message"], check="eval-mode")
    return _verdict(claim, "refuted", f"called after training, `{helper.name}` ran the model in eval mode: "
                                      f"{check['message']}", check="eval-mode")


def _accumulated_graph(report: dict, claim: dict, step: Optional[_Function], functions, watch: _StepWatch, lines):
    """TR104: what the accumulator holds when its function returns: autograd history (confirmed, with how many
    graph nodes it keeps alive), or plain numbers / tensors without history (refuted)."""
    function = _innermost(functions, claim["line"])
    name = _accumulator(lines[claim["line"] - 1]) if 0 < claim["line"] <= len(lines) else None
    value, returns = watch.returned.get((function, name), (_MISSING, 0)) if function is not None else (_MISSING, 0)
    if function is None or not (_in_step(claim, step) or returns):
        return None  # a function of the file the step never called
    undecided = _did_not_run(report, claim)
    if undecided is not None:
        return undecided
    where = f"{claim['path']}:{claim['line']}"
    if name is None:
        return _verdict(claim, "undecided", f"the accumulation at {where} is not a form the runner follows.")
    if value is _MISSING:
        return _verdict(claim, "undecided", f"`{function.name}` did not return with `{name}` set while the step ran.")
    kept = _with_history(value)
    if kept:
        nodes = sum(_graph_size(t) for t in kept)
        what = f"`{type(kept[0].grad_fn).__name__}`" if len(kept) == 1 else f"{len(kept)} tensors with history"
        return _verdict(claim, "confirmed", f"when `{function.name}` returned, `{name}` still held autograd history "
                                            f"({what}): {nodes:,} graph nodes, every accumulated iteration's forward "
                                            "with the activations it saved, kept alive as long as it is; "
                                            "accumulate `.item()` (or `.detach()`).", nodes=nodes)
    shown = type(value).__name__ if not isinstance(value, torch.Tensor) else "a tensor without autograd history"
    return _verdict(claim, "refuted", f"when `{function.name}` returned, `{name}` held {shown}: no graph is kept.")


def _clipped_while_scaled(report: dict, claim: dict, step: Optional[_Function], functions, watch: _StepWatch, lines):
    """TR713: at the flagged clip call, an enabled GradScaler had scaled the loss and not unscaled the gradients
    (confirmed: the clip bounds gradients multiplied by the scale), or they had been unscaled (refuted)."""
    if not _in_step(claim, step) and _innermost(functions, claim["line"]) is None:
        return None
    undecided = _did_not_run(report, claim)
    if undecided is not None:
        return undecided
    where = f"{claim['path']}:{claim['line']}"
    clips = [c for c in watch.clips if claim["line"] <= c["line"] <= claim["end_line"]]
    if not clips:
        return None if not _in_step(claim, step) else \
            _verdict(claim, "undecided", f"the step never clipped gradients at {where}.")
    scaled = [(clip, state) for clip in clips for state in clip["scalers"] if not state["unscaled"] and
              state["scale"] != 1]
    if scaled:
        clip, state = scaled[0]
        bound = f" max_norm={clip['max_norm']:g}" if isinstance(clip["max_norm"], (int, float)) else " its threshold"
        return _verdict(claim, "confirmed", f"at `{clip['function']}` ({where}) the gradients were still multiplied "
                                            f"by the GradScaler's scale {state['scale']:g} (no `scaler.unscale_` "
                                            f"since `scaler.scale(loss)`):{bound} applied to them bounds the true "
                                            f"gradients at 1/{state['scale']:g} of it.", scale=state["scale"])
    if any(clip["scalers"] for clip in clips):
        return _verdict(claim, "refuted", f"at {where} the GradScaler had already unscaled the gradients.")
    disabled = any(clip["disabled"] for clip in clips)
    return _verdict(claim, "undecided", f"no enabled GradScaler had scaled the loss when {where} clipped"
                                        + (" (the scaler is disabled on this device)" if disabled else "") + ".")


_STEP_EXPERIMENTS: dict[str, Callable[..., Optional[dict]]] = {
    "TR101": _zero_grad_from_step,
    "TR104": _accumulated_graph,
    "TR201": _eval_mode_from_step,
    "TR713": _clipped_while_scaled,
}
assert set(_EXPERIMENTS) | set(_STEP_EXPERIMENTS) == set(DECIDABLE_RULES)
