"""Run a training step, not only the module: a few iterations of the PR's own training code on synthetic batches,
instrumented. Runs inside the sandboxed child (``gpu_runner.child``), in the same warm worker as the model targets.

Steps come from a Lightning-style class (``training_step`` + ``configure_optimizers``, driven the way Lightning's
``fast_dev_run`` drives it; Lightning need not be installed), a function named in ``smoke.steps``, or a detected
``train_one_epoch(model, loader, optimizer, ...)`` / ``Trainer.train_step(batch)`` (``targets.find_step_targets``).
Arguments are built by name: the model by the runner's builder, the loader from the model's inferred input (the
same batch every iteration, so that a working step must lower the loss), Adam over the model's parameters, the
builder's loss as the criterion.

What is checked, each a CheckResult with the line of the PR's code it is about (``details["line"]``):

- zero-grad: the gradients are reset between optimizer steps (a backward after a step finds ``.grad`` still
  holding what the step used: accumulated across steps, no ``zero_grad()``).
- optimizer-coverage: every trainable parameter that gets a gradient is in the optimizer that steps.
- params-updated: every parameter the model's loss reaches changes; one that gets no gradient from the step's
  loss is cut off (``.detach()``, ``.data``, ``torch.no_grad()``).
- loss: finite, connected to the model's parameters, and falling over the iterations (a loss that does not fall
  in a few steps is only a warning: the step's own optimizer and learning rate may be slow).
- train-mode: the model is in train mode when the step's forward runs (an epoch function is called with the model
  in eval mode, as it is after an evaluation, unless its caller sets ``model.train()`` itself).
- eval-mode: an evaluation helper of the same file (``evaluate(model, loader)``) runs the model in eval mode.

Never a false alarm: what cannot be built or called on the synthetic arguments is *skipped* with the reason; an
exception raised in the runner's own code (or in torch called by it) is an *error* of the runner.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import linecache
import math
import os
import re
import sys
import time
import traceback
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from gpu_runner import absent, sites, training_apis, vision_data
from gpu_runner.batch_keys import KeyedDataset, KeysUnknown, keyed_batch
from gpu_runner import build as build_module
from gpu_runner.build import (BuildError, Skip, _add_to_sys_path, _choose_model_in_file, build_subject,
                              guess_argument, import_with_stand_ins)
from gpu_runner.guess import CONFIG_NAMES
from gpu_runner.guess import config_attributes as guess_config_attributes
from gpu_runner.guess import config_candidates
from gpu_runner.subject import CheckResult, Subject, TargetReport
from gpu_runner.targets import (SCRIPT_STEP, _dotted, builds_its_own_model, find_targets, global_reads,
                               module_level_names, module_name_for_path, parse_target_spec)

STEP_ITERATIONS = 6  # optimizer steps per run: enough for a loss on one repeated batch to fall
STEP_BATCH = 8
STEP_LEARNING_RATE = 1e-3  # Adam, for the optimizer the runner builds
LOSS_FALL_FRACTION = 0.01  # the last losses' mean below the first ones' by at least this: falling
MODEL_OPTIONS = ("factory", "input", "output", "task", "loss", "loss_target", "num_classes")
_MODE_DEPENDENT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)

# Argument roles, by parameter name (lower case).
_ROLES: list[tuple[str, str]] = [
    ("model", r"model|net|network|module|classifier|model_without_ddp"),
    ("loader", r"(train_?|training_|data_?|test_?|val_?|valid_?|validation_|eval_?)?(loader|dataloader|data_loader|"
               r"iter|iterator)|train_data|train_dataset|dataset|train_ds|batches|data"),
    ("batch", r"batch|minibatch|mini_batch|batch_data|data_batch|sample"),
    ("index", r"batch_idx|batch_index|batch_nb|idx|i|step|it|iteration|global_step|step_idx"),
    ("optimizer", r"optimizer|optim|opt|optimiser"),
    ("criterion", r"criterion|loss_fn|loss_func|loss_function|lossfn|loss_fcn|loss_module|compute_loss|loss"),
    ("device", r"device|dev"),
    ("epoch", r"epoch|ep|epoch_idx|cur_epoch|current_epoch|epoch_num"),
    ("epochs", r"epochs|num_epochs|n_epochs|max_epochs|nepochs|total_epochs"),
    ("scheduler", r"scheduler|lr_scheduler|sched|schedule"),
    ("scaler", r"scaler|grad_scaler|amp_scaler|loss_scaler"),
    ("logger", r"writer|logger|tb_writer|summary_writer|tb_logger|wandb|tracker|metric_logger|log"),
    ("interval", r"log_interval|print_freq|log_every|print_every|log_freq|display_interval|log_steps"),
    ("clip", r"clip|max_norm|grad_clip|clip_grad|clip_grad_norm|max_grad_norm|clip_value|gradient_clip"),
    ("accumulation", r"accum_iter|accumulation_steps|grad_accum|gradient_accumulation_steps|accum_steps|"
                     r"update_freq|grad_accum_steps"),
    ("flag", r"dry_run|verbose|use_amp|amp|fp16|debug|distributed"),
]
_ROLE_PATTERNS = [(role, re.compile(pattern)) for role, pattern in _ROLES]
_EVALUATION_NAMES = re.compile(r"evaluate|validate|test|eval_one_epoch|evaluate_one_epoch|validation|val|eval|"
                               r"run_eval|test_epoch|valid|val_epoch|validate_one_epoch|eval_epoch")
_DETACHED_LOSS = re.compile(r"does not require grad and does not have a grad_fn")


def role_of(name: str) -> Optional[str]:
    """The role of a parameter (or global) by its name; a compound name takes its last word's role for the roles a
    qualifier does not change (``cifar_training_loader``, ``warmup_scheduler``), never for the model
    (``linear_classifier`` beside a ``model`` is another module)."""
    lowered = name.lower()
    role = next((role for role, pattern in _ROLE_PATTERNS if pattern.fullmatch(lowered)), None)
    if role is None and "_" in lowered.strip("_"):
        last = lowered.rstrip("_").rsplit("_", 1)[1]
        role = next((role for role, pattern in _ROLE_PATTERNS if role in _QUALIFIED_ROLES and pattern.fullmatch(last)),
                    None)
    return role


_QUALIFIED_ROLES = {"loader", "optimizer", "criterion", "scheduler", "logger"}


class StepSkip(Exception):
    """The step cannot be run on what the runner can build: a reason, never a finding."""


class _EnoughSteps(BaseException):
    """Raised by the instruments before an optimizer step past the bound: a loop that runs until a setting says
    stop (``while True: ... if it >= config.max_iters: break``) ends there. A BaseException, so that the step's own
    ``except Exception`` does not swallow it."""


STEP_BOUND_FACTOR = 4  # optimizer steps allowed per iteration (several optimizers, accumulation) before the stop


class _UserCodeFailed(Exception):
    """The PR's step raised on the synthetic arguments (the original is ``__cause__``)."""


@dataclass
class _Where:
    path: str
    line: int
    code: str

    def text(self) -> str:
        return f"{self.path}:{self.line}" + (f" (`{self.code}`)" if self.code else "")


# ---- the entry point -------------------------------------------------------------------------------------

def smoke_step(code_root: Path, target: str, config: Optional[dict], *, device: str, seed: int = 0,
               iterations: int = STEP_ITERATIONS) -> dict:
    """The report (``TargetReport.to_dict()`` shape) of running the training step ``target``
    (``"train.py:train_one_epoch"``, ``"lit.py:LitModel.training_step"``, ``"train.py:Trainer.train_step"``)."""
    code_root = Path(code_root).resolve()
    with _process_state_kept():
        return _smoke_step(code_root, target, config, device=device, seed=seed, iterations=iterations)


@contextlib.contextmanager
def _process_state_kept():
    """What a step's file sets for its whole process (``torch.set_default_dtype``, ``cudnn.benchmark = True``,
    ``os.environ``), at import or in a script's setup, must not outlive it in the warm worker: the next targets
    run there."""
    state = (torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled(),
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic, dict(os.environ))
    try:
        yield
    finally:
        dtype, default_device, grad, matmul_tf32, cudnn_tf32, benchmark, deterministic, environment = state
        torch.set_default_dtype(dtype)
        if torch.get_default_device() != default_device:  # setting it at all installs a mode on every call
            torch.set_default_device(None if default_device.type == "cpu" else default_device)
        torch.set_grad_enabled(grad)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, deterministic
        if dict(os.environ) != environment:
            os.environ.clear()
            os.environ.update(environment)


def _smoke_step(code_root: Path, target: str, config: Optional[dict], *, device: str, seed: int,
                iterations: int) -> dict:
    skipped: Optional[str] = None  # why the runner's own plan was skipped, when the step's script runs it instead
    try:
        plan = _plan(code_root, target, dict(config or {}), device, seed)
    except (StepSkip, BuildError) as exc:
        plan = _through_its_script(code_root, target, config, device)
        if plan is None:
            return _report(target, "skipped", str(exc))
        skipped = str(exc)
    except Exception as exc:  # noqa: BLE001 - building the PR's model or importing its file
        if _user_frames(exc.__traceback__, code_root):
            return _report(target, "skipped", f"could not set up {target}: {type(exc).__name__}: {_one_line(exc)}")
        return _report(target, "error", f"the runner failed to set up {target}: {type(exc).__name__}: "
                                        f"{_one_line(exc)}", traceback=traceback.format_exc(limit=-8))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            checks = plan.run(iterations)
        except StepSkip as exc:
            fallback = _through_its_script(code_root, target, config, device) if skipped is None else None
            if fallback is None:
                reason = str(exc) if skipped is None else f"{skipped} (run through its script: {exc})"
                return _report(target, "skipped", reason, notes=plan.notes)
            plan.close()
            plan, skipped = fallback, str(exc)
            torch.manual_seed(seed)
            try:
                checks = plan.run(iterations)
            except StepSkip as again:
                return _report(target, "skipped", f"{skipped} (run through its script: {again})", notes=plan.notes)
            except Exception as error:  # noqa: BLE001 - the harness itself, as below
                return _report(target, "error", f"the runner failed while running {target}: "
                                                f"{type(error).__name__}: {_one_line(error)}",
                               traceback=traceback.format_exc(limit=-8), notes=plan.notes)
        except Exception as exc:  # noqa: BLE001 - the harness itself: a runner error, never the step's failure
            return _report(target, "error", f"the runner failed while running {target}: {type(exc).__name__}: "
                                            f"{_one_line(exc)}", traceback=traceback.format_exc(limit=-8),
                           notes=plan.notes)
        finally:
            plan.close()
    if skipped is not None:
        plan.notes.insert(0, f"the runner's own plan for the step was skipped ({_one_line(StepSkip(skipped), 160)})")
    status = "failed" if any(c.status == "fail" for c in checks) else "passed"
    # not "step_time_ms": an instrumented iteration of the PR's loop is no steady timing to compare with the base
    measures = {"params": sum(p.numel() for p in plan.model.parameters()), "iteration_ms": plan.step_time_ms(),
                "loss_after_steps": plan.instruments.losses[-1] if plan.instruments.losses else None}
    report = TargetReport(target=target, status=status, checks=checks, notes=plan.notes,
                          measures={k: v for k, v in measures.items() if v is not None})
    return report.to_dict()


def _report(target: str, status: str, reason: str, **extra) -> dict:
    data = TargetReport(target=target, status=status, reason=reason).to_dict()
    data.update(extra)
    return data


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ---- where the PR's code is ----------------------------------------------------------------------------

def _user_frames(tb, code_root: Path) -> list[traceback.FrameSummary]:
    root = str(code_root) + "/"
    return [f for f in traceback.extract_tb(tb) if str(Path(f.filename).resolve()).startswith(root)] if tb else []


def _raised_at(exc: BaseException, code_root: Path) -> str:
    """`` at file.py:line`` of the innermost frame of the PR's code that ``exc`` passed through; empty if none."""
    frames = _user_frames(exc.__traceback__, code_root)
    return f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""


def _caller_in(code_root: Path) -> Optional[_Where]:
    """The innermost frame of the PR's code on the current stack: the line that called into torch."""
    root = str(code_root) + "/"
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(root) or str(Path(filename).resolve()).startswith(root):
            relative = str(Path(filename).resolve().relative_to(code_root))
            return _Where(relative, frame.f_lineno, linecache.getline(filename, frame.f_lineno).strip())
        frame = frame.f_back
    return None


# ---- instrumentation -------------------------------------------------------------------------------------

@dataclass
class _Instruments:
    """Hooks on the model, its parameters, every optimizer and ``backward``, recording what the step did."""

    model: nn.Module
    code_root: Path
    steps: int = 0
    step_lines: list = field(default_factory=list)
    stepped_parameters: set = field(default_factory=set)  # ids of the parameters of every optimizer that stepped
    optimizer_lines: dict = field(default_factory=dict)  # id(optimizer) -> where it was created, when seen
    stepped_optimizers: dict = field(default_factory=dict)  # id(optimizer) -> where it was created (or None)
    got_gradient: set = field(default_factory=set)  # ids of parameters that received a gradient
    stale: list = field(default_factory=list)  # (step, parameter name, where the backward was)
    zeroed_after_step: int = 0
    losses: list = field(default_factory=list)
    loss_lines: list = field(default_factory=list)
    disconnected: list = field(default_factory=list)  # (loss value, where): backward on a loss no parameter feeds
    # where a loss was backpropagated into parameters none of which is the model's: the loop trains
    # something the runner did not take for its model (a module built inside the loop), so no check applies
    elsewhere: list = field(default_factory=list)
    detached_error: Optional[tuple] = None  # (message, where): backward on a loss without a graph
    forwards: list = field(default_factory=list)  # [training, grad enabled, where, a backward followed it]
    step_seconds: list = field(default_factory=list)
    _after_step: dict = field(default_factory=dict)  # id -> .grad right after the last step
    _pending_check: set = field(default_factory=set)  # ids whose first gradient since the last step is awaited
    _handles: list = field(default_factory=list)
    _last_step_at: Optional[float] = None
    step_limit: Optional[int] = None  # optimizer steps after which the next one stops the step (_EnoughSteps)
    # backward() calls after which the next one stops a loop that never steps an optimizer (a manual update)
    backward_limit: Optional[int] = None
    backwards: int = 0
    # tensors an optimizer trains that are no module's (an optimized input): a loss reaching them is connected
    extra_parameter_ids: set = field(default_factory=set)
    stepped_with_gradient: set = field(default_factory=set)  # ids stepped while holding a non-zero gradient
    _suspect: dict = field(default_factory=dict)  # id -> (step, name, where): accumulated onto a step's gradient

    def __post_init__(self):
        self.names = {id(p): name for name, p in self.model.named_parameters()}
        self.parameter_ids = set(self.names) | set(self.extra_parameter_ids)
        for name, parameter in self.model.named_parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_hook(self._gradient_hook(parameter)))
        roots = getattr(self.model, "torchreview_roots", None)  # several modules one loop trains (a GAN)
        for root in roots() if callable(roots) else [self.model]:
            self._handles.append(root.register_forward_pre_hook(self._forward_hook))
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._before_step))
        self._handles.append(register_optimizer_step_post_hook(self._after_step_hook))
        self._original_backward = torch.Tensor.backward
        instruments = self

        def backward(tensor, *args, **kwargs):  # the step's own loss.backward()
            if instruments.backward_limit is not None and instruments.steps == 0 \
                    and instruments.backwards >= instruments.backward_limit:
                raise _EnoughSteps()
            instruments.backwards += 1
            instruments._record_backward(tensor)
            return instruments._original_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward
        self._original_optimizer_init = torch.optim.Optimizer.__init__

        def optimizer_init(optimizer, *args, **kwargs):  # where the step builds its own optimizer
            instruments.optimizer_lines[id(optimizer)] = _caller_in(instruments.code_root)
            return instruments._original_optimizer_init(optimizer, *args, **kwargs)

        torch.optim.Optimizer.__init__ = optimizer_init

    def id_of(self, parameter_name: str) -> Optional[int]:
        return next((key for key, name in self.names.items() if name == parameter_name), None)

    def close(self) -> None:
        torch.Tensor.backward = self._original_backward
        torch.optim.Optimizer.__init__ = self._original_optimizer_init
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _gradient_hook(self, parameter: nn.Parameter):
        key = id(parameter)

        def hook(gradient):
            # runs before the new gradient is accumulated into .grad: .grad is still what the last step used
            self.got_gradient.add(key)
            current = parameter.grad
            if current is None or not bool(current.abs().sum() > 0):
                self._suspect.pop(key, None)  # zeroed since: what accumulated before never reached a step
            if key in self._pending_check:
                self._pending_check.discard(key)
                previous = self._after_step.get(key)
                if previous is not None and current is not None and bool(previous.abs().sum() > 0) \
                        and current.shape == previous.shape and torch.equal(current, previous):
                    # stale only if it is stepped again before a zero_grad (a GAN's generator loss also reaches
                    # the discriminator, whose gradients are zeroed before its own next step)
                    self._suspect[key] = (self.steps, self.names[key], _caller_in(self.code_root))
                else:
                    self.zeroed_after_step += 1
            return None

        return hook

    def _forward_hook(self, module, args):
        self.forwards.append([module.training, torch.is_grad_enabled(), _caller_in(self.code_root), False])

    def _before_step(self, optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                key = id(parameter)
                if key in self._suspect and parameter.grad is not None:
                    self.stale.append(self._suspect.pop(key))
                if key not in self.stepped_with_gradient and parameter.grad is not None \
                        and bool(parameter.grad.abs().sum() > 0):
                    self.stepped_with_gradient.add(key)
        if self.step_limit is not None and self.steps >= self.step_limit:
            raise _EnoughSteps()
        self.stepped_optimizers.setdefault(id(optimizer), self.optimizer_lines.get(id(optimizer)))
        for group in optimizer.param_groups:
            self.stepped_parameters.update(id(p) for p in group["params"])
        self.step_lines.append(_caller_in(self.code_root))

    def _after_step_hook(self, optimizer, args, kwargs):
        self.steps += 1
        now = time.perf_counter()
        if self._last_step_at is not None:
            self.step_seconds.append(now - self._last_step_at)
        self._last_step_at = now
        self._after_step = {id(p): p.grad.detach().clone() for p in self.model.parameters() if p.grad is not None}
        self._pending_check = set(self._after_step)

    def _record_backward(self, tensor: torch.Tensor) -> None:
        # the forward this loss comes from: the last one with autograd on (not a validation pass before it)
        last = next((f for f in reversed(self.forwards) if f[1]), None)
        if last is not None:
            last[3] = True
        where = _caller_in(self.code_root)
        if tensor.numel() == 1:
            value = float(tensor.detach().float())
            self.losses.append(value)
            self.loss_lines.append(where)
            if tensor.grad_fn is None and not tensor.requires_grad:
                self.detached_error = (value, where)
            else:
                reached = _reaches(tensor.grad_fn, self.parameter_ids)
                if reached == "other":
                    self.elsewhere.append(where)
                elif reached == "none":
                    self.disconnected.append((value, where))


def _reaches(grad_fn, parameter_ids: set, limit: int = 20000) -> str:
    """What the autograd graph under ``grad_fn`` accumulates into: "model" (one of the parameters), "other"
    (only modules' parameters that are not among them) or "none" (no parameter: a tensor made trainable by hand,
    as a detached output's ``.requires_grad_()``, does not count)."""
    stack, seen, other = [grad_fn], set(), False
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            if id(variable) in parameter_ids:
                return "model"
            other = other or isinstance(variable, torch.nn.Parameter)
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    if len(seen) >= limit:
        return "model"  # too large to walk: assume connected rather than cry wolf
    return "other" if other else "none"


# ---- synthetic arguments ---------------------------------------------------------------------------------

class _NullLogger:
    """A writer / logger / tracker that accepts every call."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs):
        return self


def _step_batch(subject: Subject) -> tuple:
    """The subject's fixed batch as a training loop receives it: ``(x, y)`` (or ``(x1, x2, y)``)."""
    batch = subject.make_batch(STEP_BATCH, 0)
    if batch.kwargs:
        raise StepSkip(f"the model's forward takes keyword inputs ({', '.join(batch.kwargs)}): the layout of a "
                       "batch its training step unpacks cannot be guessed; configure smoke.steps with an input")
    if not subject.inputs_batch_first:
        raise StepSkip("the model's inputs are not batch-first: a data loader of them cannot be built")
    if batch.target is None:
        raise StepSkip("the model computes its own loss (task custom): there is no target to put in the batch")
    target = batch.target
    if not target.is_floating_point():
        target = target.masked_fill(target < 0, 0)  # ignore_index -100 is the builder's; a loop may use another
    return tuple(batch.args) + (target,)


class _Loader(torch.utils.data.DataLoader):
    """A DataLoader over ``iterations`` copies of one batch (the step must lower the loss on it). Its rows are on the
    CPU whatever the runner's device, as a real data set's are: the step moves them, and a loader it builds over
    them with ``pin_memory=True`` can pin them (CUDA tensors cannot be pinned)."""

    def __init__(self, batch: tuple, iterations: int):
        tensors = [torch.cat([t] * iterations).cpu() for t in batch]
        super().__init__(torch.utils.data.TensorDataset(*tensors), batch_size=len(batch[0]), shuffle=False)


class _KeyedLoader(torch.utils.data.DataLoader):
    """A DataLoader over ``iterations`` copies of one dict batch (``{key: tensor}``)."""

    def __init__(self, columns: dict, iterations: int):
        super().__init__(KeyedDataset(columns, iterations), batch_size=len(next(iter(columns.values()))),
                         shuffle=False)


class _Criterion(nn.Module):
    """The builder's loss as an ``nn.Module`` criterion: ``criterion(output, target)``."""

    def __init__(self, loss_fn: Callable):
        super().__init__()
        self.loss_fn = loss_fn

    def forward(self, output, target):
        return self.loss_fn(output, target)


def _constant_scheduler(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def _config_namespace(function: Callable, name: str, values: dict, given: Optional[dict] = None,
                      repository_defaults: Optional[dict] = None) -> types.SimpleNamespace:
    """``args`` / ``config``: the attributes the function reads from it, each as configured (``smoke.steps``
    ``args``), from the roles, from the repository's own defaults (the argparse defaults of the step's file), or
    from the name table."""
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        raise StepSkip(f"cannot read the source of {function.__qualname__} to build its '{name}'") from None
    attributes = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id == name and isinstance(n.ctx, ast.Load)]
    namespace = _Settings(values, {**(repository_defaults or {}), **_default_config_of_owner(function)},
                          **(given or {}))
    for attribute in dict.fromkeys(attributes):
        if not hasattr(namespace, attribute):
            raise StepSkip(f"cannot build {name}.{attribute}, which {function.__qualname__} reads; give it in "
                           f"smoke.steps ({{step = ..., args = {{{name} = {{{attribute} = ...}}}}}}) or a default")
    return namespace


def _default_config_of_owner(function: Callable) -> dict:
    """The fields of the config the repository makes for ``function``'s class when it is a method (the class's
    ``get_default_config()`` or a config class of its module, as models' configs are found), shrunk as a
    script's settings are."""
    from gpu_runner.script_steps import shrunk_setting

    module = inspect.getmodule(function)
    owner = getattr(module, function.__qualname__.split(".")[0], None) if "." in function.__qualname__ else None
    if not inspect.isclass(owner) or module is None:
        return {}
    for _, make in config_candidates(owner, module)[:1]:
        try:
            fields = guess_config_attributes(make())
        except Exception:  # noqa: BLE001 - the repository's own factory: without it, the fields are guessed
            return {}
        return {key: shrunk_setting(key, value, fields, "cpu", []) for key, value in fields.items()}
    return {}


class _Settings(types.SimpleNamespace):
    """A step's ``args`` / ``config``: an attribute not configured is made when first read (by the step or by a
    helper it passes the settings to), from its role, the repository's own defaults, or the name table; one that
    none of these gives stays missing (AttributeError)."""

    def __init__(self, values: dict, repository_defaults: dict, **given):
        super().__init__(**given)
        object.__setattr__(self, "_sources", (values, repository_defaults))

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        values, repository_defaults = object.__getattribute__(self, "_sources")
        role = role_of(attribute)
        if role in values:
            value = values[role]
        elif attribute in repository_defaults:
            value = repository_defaults[attribute]
        else:
            found, value = guess_argument(attribute)
            if not found:
                raise AttributeError(attribute)
        setattr(self, attribute, value)
        return value

    def __repr__(self) -> str:
        shown = {k: v for k, v in vars(self).items() if k != "_sources"}
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def _arguments(function: Callable, values: dict, *, skip_first: bool = False, given: Optional[dict] = None,
               repository_defaults: Optional[dict] = None, by_use: Optional[dict] = None,
               notes: Optional[list] = None) -> dict:
    """Keyword arguments for ``function``: as configured (``given``, by parameter name), by role, a config
    namespace, or its default. A loader parameter the function looks its loaders up in by key gets every key as
    the runner's loader (``_LoadersByKey``, said in ``notes``). Raises StepSkip for a required argument the runner
    cannot build."""
    given = given or {}
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as exc:
        raise StepSkip(f"cannot read the signature of {function!r}: {exc}") from None
    if skip_first and parameters:
        parameters = parameters[1:]
    arguments = {}
    optimizer_names = [p.name for p in parameters if role_of(p.name) == "optimizer"]
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        role = role_of(parameter.name)
        if role == "optimizer" and len(optimizer_names) > 1 and parameter.name.lower() in CONFIG_NAMES:
            role = None  # ``opt`` beside an ``optimizer``: the options
        configured = given.get(parameter.name, _NOT_GIVEN)
        if configured is not _NOT_GIVEN and not (isinstance(configured, dict) and parameter.name.lower()
                                                  in CONFIG_NAMES):
            arguments[parameter.name] = configured
        elif role == "loader" and "dataset" in values and _builds_its_own_loader(function, parameter.name):
            arguments[parameter.name] = values["dataset"]
        elif "loader" in values and "loader" in (role, role_of(parameter.name.rstrip("s"))) \
                and _looks_up_loaders_by_key(function, parameter.name):
            arguments[parameter.name] = _LoadersByKey(values["loader"])
            if notes is not None:
                notes.append(f"{function.__qualname__} looks its loaders up in '{parameter.name}' by key (a dict of "
                             "loaders): every key gave the runner's loader")
        elif role in values and (parameter.default is parameter.empty or role in _ALWAYS_GIVEN):
            arguments[parameter.name] = values[role]
        elif parameter.default is not parameter.empty:
            continue
        elif parameter.name.lower() in CONFIG_NAMES:
            arguments[parameter.name] = _config_namespace(function, parameter.name, values,
                                                          given.get(parameter.name), repository_defaults)
        elif by_use and parameter.name in by_use:
            arguments[parameter.name] = by_use[parameter.name]
        elif not _reads_name(function, parameter.name):
            arguments[parameter.name] = None  # taken but never used (a caller's epoch counter): any value runs it
        else:
            raise StepSkip(f"cannot build the argument '{parameter.name}' of {function.__qualname__}; give its value "
                           f"in smoke.steps ({{step = ..., args = {{{parameter.name} = ...}}}}), name a configured "
                           "model there, or give it a default")

    return arguments


_NOT_GIVEN = object()
_DATASET_NAMES = re.compile(r"(\w+_)?(dataset|ds)")


class _LoadersByKey(dict):
    """What a step (or a trainer's constructor) that looks its loaders up by key is given in place of a dict of
    loaders (``{"train": ..., "val": ...}``): any string key is the runner's loader."""

    def __init__(self, loader: Any):
        super().__init__()
        self.loader = loader

    def __missing__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.loader
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self.loader if isinstance(key, str) else default


def _looks_up_loaders_by_key(function: Callable, name: str) -> bool:
    """``function`` subscripts its parameter ``name`` with a string (a constant, or a loop variable over string
    constants: ``for phase in ("train", "val")``) and uses what it gets as a loader: iterates it (``for x, y in
    loaders[phase]``, ``enumerate(data["train"])``) or keeps it under a loader's name (``self.tr_loader =
    data["tr_loader"]``). A constructor that keeps the parameter (``self.data = data``) looks it up so where its
    class's other methods do (``for x, y in self.data["train"]``). A string subscript used otherwise (a batch read by
    key) is not a loader."""
    node = _function_node(inspect.unwrap(function))
    if node is None:
        return False
    kept = {t.attr for n in ast.walk(node) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
            and n.value.id == name for t in n.targets if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name) and t.value.id == "self"}
    if kept and function.__name__ == "__init__":
        owner = _class_node(function)
        if owner is not None and any(_subscripts_loaders(n, lambda e: isinstance(e, ast.Attribute)
                                                         and e.attr in kept and isinstance(e.value, ast.Name)
                                                         and e.value.id == "self")
                                     for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            return True
    return _subscripts_loaders(node, lambda e: isinstance(e, ast.Name) and e.id == name)


def _class_node(method: Callable) -> Optional[ast.ClassDef]:
    """The class statement a method is defined in, read from its module's source."""
    owner_name = method.__qualname__.rpartition(".")[0]
    owner = getattr(inspect.getmodule(method), owner_name, None) if owner_name and "<" not in owner_name else None
    return _class_statement(owner) if inspect.isclass(owner) else None


def _class_statement(cls: type) -> Optional[ast.ClassDef]:
    """The ``class`` statement of ``cls``, parsed from its source; None when the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)


def _subscripts_loaders(node: ast.AST, is_dict: Callable[[ast.AST], bool]) -> bool:
    """``node`` subscripts what ``is_dict`` names with a string and uses what it gets as a loader (see
    ``_looks_up_loaders_by_key``)."""
    string_names = {loop.target.id for loop in ast.walk(node) if isinstance(loop, (ast.For, ast.AsyncFor))
                    and isinstance(loop.target, ast.Name) and isinstance(loop.iter, (ast.List, ast.Tuple, ast.Set))
                    and loop.iter.elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                               for e in loop.iter.elts)}

    def keyed(expression: ast.AST) -> bool:
        if not (isinstance(expression, ast.Subscript) and is_dict(expression.value)):
            return False
        key = expression.slice
        return isinstance(key, ast.Constant) and isinstance(key.value, str) \
            or isinstance(key, ast.Name) and key.id in string_names

    def iterated(expression: ast.AST) -> bool:
        # the loop's iterable itself, or an argument of a call wrapping it (``enumerate``, a progress bar)
        return keyed(expression) or isinstance(expression, ast.Call) and any(iterated(a) for a in expression.args)

    for n in ast.walk(node):
        if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and iterated(n.iter):
            return True
        if isinstance(n, ast.Assign) and keyed(n.value):
            for target in n.targets:
                named = target.id if isinstance(target, ast.Name) else \
                    target.attr if isinstance(target, ast.Attribute) else None
                if named is not None and role_of(named) == "loader":
                    return True
    return False


def _builds_its_own_loader(function: Callable, name: str) -> bool:
    """A ``train_dataset`` that the function (or, for a method, its class: a trainer class) hands to a
    ``DataLoader`` it makes itself: it takes a data set, not a loader."""
    if not _DATASET_NAMES.fullmatch(name.lower()):
        return False
    module = inspect.getmodule(function)
    owner = getattr(module, function.__qualname__.split(".")[0], None) if "." in function.__qualname__ else None
    try:
        source = inspect.getsource(owner if inspect.isclass(owner) else function)
    except (OSError, TypeError):
        return False
    return "DataLoader(" in source
# Given even where the parameter has a default: what the step trains and measures with.
_ALWAYS_GIVEN = {"model", "loader", "batch", "optimizer", "criterion", "device"}


# ---- plans: how to run each kind of step -----------------------------------------------------------------

class _Plan:
    kind = ""

    # a parameter that got gradients but did not change fails; where the step's own optimizer and learning rate
    # update it (a script), it only warns: a small SGD update of a small gradient can round to nothing in float32
    unchanged_fails = True
    # a script that puts its model in eval mode before its loop trains so on purpose (BatchNorm statistics frozen)
    eval_before_the_loop: Optional[str] = None
    # said after the reason when the step raises on the runner's arguments: what the runner could not make
    skip_hint = ""

    def __init__(self, code_root: Path, target: str, subject: Optional[Subject], where: tuple[str, int, int],
                 device: Any = None):
        self.code_root, self.target, self.subject = code_root, target, subject
        self.model: Optional[nn.Module] = subject.model if subject is not None else None
        self.device = subject.device if subject is not None else device
        self.path, self.first_line, self.last_line = where
        self.notes: list[str] = list(subject.notes) if subject is not None else []
        self.instruments: Optional[_Instruments] = None
        self.reference: Optional[set] = None
        self.trainable: dict = {}
        self.before: dict = {}
        self.iterations = STEP_ITERATIONS
        self.start_in_eval = False
        self.caller_sets_train: Optional[_Where] = None
        self.evaluation: Optional[tuple[Callable, _Where]] = None

    def close(self) -> None:
        if self.instruments is not None:
            self.instruments.close()

    def _batch_by_keys(self, function: Callable, reader: str, self_is_model: bool = False,
                       batch: Optional[tuple] = None) -> None:
        """``self.batch`` (a tuple) and ``self.keyed``: the same batch as a dict when ``function`` reads its batch
        by keys (gpu_runner.batch_keys), else None. Where the keys cannot be matched the batches stay tuples: a step
        that makes its own loader still runs; one that reads the runner's batches by key raises on them, and its
        skip says why (``skip_hint``). ``batch``: the tuple batch, where the plan made it (else the subject's)."""
        self.batch = batch if batch is not None else _step_batch(self.subject)
        self.keyed: Optional[dict] = None
        node = _function_node(inspect.unwrap(function))
        try:
            self.keyed = keyed_batch(node, self.batch, role_of, self_is_model=self_is_model,
                                     outputs=self._outputs_on_batch) if node is not None else None
        except KeysUnknown as exc:
            self.skip_hint = str(exc)
        if self.keyed is not None:
            self.notes.append(f"{reader} reads its batch by keys ({', '.join(self.keyed)}): the runner's batches "
                              "are dicts, each key the model's input or the target the step uses it as "
                              "(gpu_runner.batch_keys)")

    def _outputs_on_batch(self) -> Any:
        """What the subject's model returns on the batch's inputs (in eval mode, without autograd; its state left
        as it was): the shapes of a model's several outputs, each compared with a key (gpu_runner.batch_keys)."""
        model = self.subject.model if self.subject is not None else None
        if model is None:
            return None
        mode = model.training
        model.eval()
        try:
            with torch.no_grad():
                return model(*self.batch[:-1])
        except Exception:  # noqa: BLE001 - the step's own run meets the same error and reports it
            return None
        finally:
            model.train(mode)

    def _loader(self, iterations: int) -> torch.utils.data.DataLoader:
        """A loader of ``iterations`` copies of the batch, as the step reads it (tuples, or dicts by keys)."""
        return _Loader(self.batch, iterations) if self.keyed is None else _KeyedLoader(self.keyed, iterations)

    def _one_batch(self) -> Any:
        """A fresh copy of the batch, as the step reads it (a tuple, or a dict by keys)."""
        return copy.deepcopy(self.batch if self.keyed is None else self.keyed)

    def step_time_ms(self) -> Optional[float]:
        seconds = self.instruments.step_seconds if self.instruments else []
        return round(1000 * sorted(seconds)[len(seconds) // 2], 3) if seconds else None

    def execute(self, iterations: int) -> None:
        raise NotImplementedError

    def begin(self, model: nn.Module, reference: Optional[set], *, step_limit: int, backward_limit: Optional[int] = None,
              extra_parameter_ids: frozenset = frozenset()) -> None:
        """Instrument ``model`` from here on: what it holds now is what the checks compare with."""
        self.model, self.reference = model, reference
        self.trainable = {id(p): name for name, p in model.named_parameters() if p.requires_grad}
        self.before = {id(p): p.detach().clone() for p in model.parameters()}
        self.instruments = _Instruments(model, self.code_root, step_limit=step_limit, backward_limit=backward_limit,
                                        extra_parameter_ids=set(extra_parameter_ids))

    def run(self, iterations: int) -> list[CheckResult]:
        self.iterations = iterations
        if self.model is not None:  # built by the runner; a script's is found when its loop starts (_ScriptPlan)
            reference = self._reference()
            self.model.train()
            if self.start_in_eval:
                self.model.eval()  # as it is after an evaluation helper ran: the step must set train mode itself
            self.begin(self.model, reference, step_limit=STEP_BOUND_FACTOR * iterations)
        try:
            with _cuda_calls_to(self.device, self.notes):
                self.execute(iterations)
        except _EnoughSteps:
            self.notes.append(f"the step's loop was stopped after {self.instruments.steps} optimizer steps")
        except _UserCodeFailed as failed:
            cause = failed.__cause__
            detached = _DETACHED_LOSS.search(str(cause)) or self.instruments.detached_error is not None
            if not detached:
                at = _raised_at(cause, self.code_root)
                missing = absent.missing_package(cause)
                if missing:
                    raise StepSkip(f"{self.target} uses '{missing}'{at}, which is not installed on the smoke runner "
                                   "(its file was imported with a stand-in for it); install it in the runner "
                                   "image") from None
                raise StepSkip(f"{self.target} raised {type(cause).__name__}{at} on the runner's synthetic "
                               f"arguments: {_one_line(cause, 200)}"
                               + (f" ({self.skip_hint})" if self.skip_hint else "")
                               + "; configure smoke.steps if they do not fit it") from None
        finally:
            if self.instruments is not None:
                self.instruments.close()
        if self.instruments is None:
            raise StepSkip(f"{self.target} ran its setup but never reached its training loop at line "
                           f"{self.first_line} (a condition on a setting, or an early return)")
        model, before, trainable = self.model, self.before, self.trainable
        changed = {key for key, p in ((id(p), p) for p in model.parameters())
                   if key in before and not torch.equal(before[key], p.detach())}
        instruments = self.instruments
        reference = self.reference if self.reference is not None else instruments.stepped_with_gradient
        if instruments.detached_error is None and not instruments.losses and instruments.steps == 0:
            raise StepSkip(f"{self.target} ran on the synthetic arguments but neither called backward() nor "
                           "stepped an optimizer (an empty loader? a condition on a setting?)")
        if instruments.elsewhere and not instruments.disconnected:
            where = instruments.elsewhere[0]
            raise StepSkip(f"the loss backpropagated at {where.text() if where else '?'} trains parameters "
                           f"outside the model the runner took for {self.target} (a module built elsewhere, as inside "
                           "the loop?): name the model in smoke.steps")
        checks = [self._loss_check(), self._zero_grad_check(), self._coverage_check(trainable),
                  self._updated_check(trainable, reference, changed), self._train_mode_check()]
        evaluation = self._evaluation_check()
        if evaluation is not None:
            checks.append(evaluation)
        return checks

    # -- the checks --

    def _reference(self) -> Optional[set]:
        """What a correct step must update: the parameters the builder's loss reaches (None: those that got a
        gradient and stepped)."""
        return _reference_gradients(self.subject)

    def _check(self, name: str, status: str, message: str, where: Optional[_Where] = None, **details) -> CheckResult:
        where = where or _Where(self.path, self.first_line, "")
        if where.path == self.path:
            details["line"] = where.line
        details["where"] = where.text()
        return CheckResult(name, status, message, details)

    def _loss_check(self) -> CheckResult:
        name, instruments = "loss", self.instruments
        if instruments.detached_error is not None:
            value, where = instruments.detached_error
            return self._check(name, "fail", f"the loss has no autograd graph at {where.text() if where else '?'}: "
                               "it was detached from the model (`.detach()`, `.item()`, `.data`, `torch.tensor(...)` "
                               "or `torch.no_grad()` before the loss), so backward() cannot train anything.", where)
        if instruments.disconnected:
            value, where = instruments.disconnected[0]
            return self._check(name, "fail", f"the loss backpropagated at {where.text() if where else '?'} does not "
                               "depend on any of the model's parameters: the graph is cut between the model and the "
                               "loss (a `.detach()` / `.data` / `.requires_grad_()` on the output), so the model never "
                               "learns.", where, losses=instruments.losses)
        losses = instruments.losses
        if not losses:
            return self._check(name, "skip", "no scalar loss went through backward() (the step's loss is not a "
                               "scalar tensor?).")
        where = instruments.loss_lines[-1]
        if not all(math.isfinite(v) for v in losses):
            bad = next(i for i, v in enumerate(losses) if not math.isfinite(v))
            return self._check(name, "fail", f"the loss is {losses[bad]} at iteration {bad + 1} of the step "
                               "(NaN/Inf).", where, losses=losses)
        if len(losses) < 2:
            return self._check(name, "pass", f"the loss is finite ({losses[0]:.4g}); one iteration is too few to see "
                               "it fall.", where, losses=losses)
        # two readings of the curve, each over a margin: its ends (the first loss against the last) and its means (the
        # first two against the last two). A verdict needs both to agree; where they disagree the curve went both
        # ways, and a run this short cannot tell a slow fall from noise: undecided, never described as a fall
        head, tail = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
        ends_fell = losses[-1] < losses[0] - LOSS_FALL_FRACTION * abs(losses[0])
        means_fell = tail < head - LOSS_FALL_FRACTION * abs(head)
        curve = (f"{losses[0]:.4g} → {losses[-1]:.4g}, the mean of the first two {head:.4g} → of the last two "
                 f"{tail:.4g}")
        if ends_fell and means_fell:
            return self._check(name, "pass", f"the loss fell from {losses[0]:.4g} to {losses[-1]:.4g} in "
                               f"{len(losses)} iterations on one repeated batch.", where, losses=losses)
        if ends_fell or means_fell:
            return self._check(name, "skip", f"undecided: the loss went both ways in {len(losses)} iterations on one "
                               f"repeated batch ({curve}): too noisy a curve to tell whether it falls.", where,
                               losses=losses, undecided=True)
        return self._check(name, "warn", f"the loss did not fall in {len(losses)} iterations on one repeated batch "
                           f"({curve}): a slow optimizer or learning rate, or the update does not reach what the loss "
                           "measures.", where, losses=losses)

    def _zero_grad_check(self) -> CheckResult:
        name, instruments = "zero-grad", self.instruments
        if self.kind == "lightning":
            return self._check(name, "skip", "the runner's loop zeroes the gradients, as Lightning's does.")
        # a parameter in no optimizer is never zeroed by optimizer.zero_grad(): optimizer-coverage reports it
        stale_entries = [entry for entry in instruments.stale
                         if instruments.id_of(entry[1]) in instruments.stepped_parameters]
        if stale_entries:
            step, parameter, where = stale_entries[0]
            stale = sorted({p for _, p, _ in stale_entries})
            step_where = instruments.step_lines[0] if instruments.step_lines else None
            return self._check(name, "fail", f"gradients are not zeroed between optimizer steps: after step {step} "
                               f"the next backward() accumulated into the gradient that step used "
                               f"({_names(stale)}), so every step applies the sum of all past gradients; call "
                               "`optimizer.zero_grad()` once per step"
                               + (f" (the step is at {step_where.text()})" if step_where else "") + ".",
                               step_where or where, parameters=stale[:20])
        if instruments.steps < 2:
            return self._check(name, "skip", f"{instruments.steps} optimizer step(s): accumulation across steps "
                               "needs two.")
        return self._check(name, "pass", f"gradients were reset between each of the {instruments.steps} optimizer "
                           "steps.", instruments.step_lines[0])

    def _coverage_check(self, trainable: dict) -> CheckResult:
        name, instruments = "optimizer-coverage", self.instruments
        if instruments.steps == 0:
            return self._check(name, "skip", "no optimizer stepped.")
        left_out = [trainable[key] for key in trainable
                    if key not in instruments.stepped_parameters and key in instruments.got_gradient]
        where = next((w for w in instruments.stepped_optimizers.values() if w is not None), None) \
            or self.optimizer_where()
        if left_out:
            groups = sorted({n.rsplit(".", 1)[0] for n in left_out})
            return self._check(name, "fail", f"{len(left_out)} trainable parameter(s) get gradients but are in no "
                               f"optimizer that steps ({_names(groups)}): they never train. Build the optimizer from "
                               "all of `model.parameters()` (or freeze them with requires_grad_(False))"
                               + (f"; the optimizer is made at {where.text()}" if where else "") + ".",
                               where, parameters=left_out[:20])
        return self._check(name, "pass", "every trainable parameter that gets a gradient is in the optimizer.", where)

    def optimizer_where(self) -> Optional[_Where]:
        return None

    def _updated_check(self, trainable: dict, reference: set, changed: set) -> CheckResult:
        name, instruments = "params-updated", self.instruments
        if instruments.steps == 0:
            return self._check(name, "skip", "no optimizer stepped.")
        expected = [key for key in trainable if key in reference and key in instruments.stepped_parameters]
        no_gradient = [trainable[key] for key in expected if key not in instruments.got_gradient]
        unchanged = [trainable[key] for key in expected if key in instruments.got_gradient and key not in changed]
        where = instruments.loss_lines[-1] if instruments.loss_lines else None
        if no_gradient:
            return self._check(name, "fail", f"{len(no_gradient)} parameter(s) the model's loss reaches get no "
                               f"gradient from the step's loss ({_names(no_gradient)}): the step cuts them off "
                               "(`.detach()`, `.data`, `torch.no_grad()` around part of the forward), so they never "
                               "train.", where, parameters=no_gradient[:20])
        if unchanged and not self.unchanged_fails:
            return self._check(name, "warn", f"{len(unchanged)} of {len(expected)} parameter(s) got gradients but "
                               f"did not change over {instruments.steps} optimizer steps ({_names(unchanged)}): their "
                               "update may be too small to show, or their learning rate is 0.",
                               instruments.step_lines[0], parameters=unchanged[:20])
        if unchanged:
            return self._check(name, "fail", f"{len(unchanged)} parameter(s) got gradients but did not change over "
                               f"{instruments.steps} optimizer steps ({_names(unchanged)}): a learning rate of 0, or "
                               "the update is undone.", instruments.step_lines[0], parameters=unchanged[:20])
        return self._check(name, "pass", f"all {len(expected)} parameters the loss reaches changed over "
                           f"{instruments.steps} optimizer steps.")

    def _train_mode_check(self) -> CheckResult:
        name = "train-mode"
        # the forwards a backward followed; in the Lightning plan the runner itself calls backward
        training_forwards = [f for f in self.instruments.forwards if f[1] and (f[3] or self.kind == "lightning")]
        in_eval = [f for f in training_forwards if not f[0]]
        mode_dependent = [n for n, m in self.model.named_modules() if isinstance(m, _MODE_DEPENDENT)]
        if not training_forwards:
            return self._check(name, "skip", "no forward ran with autograd enabled.")
        if not in_eval:
            start = " (it was called in eval mode, as after an evaluation, and set train mode itself)" \
                if self.start_in_eval else ""
            return self._check(name, "pass", f"the model was in train mode in every training forward{start}.",
                               training_forwards[0][2])
        where = in_eval[0][2]
        if not mode_dependent:
            return self._check(name, "pass", "the model ran in eval mode during the step, which changes nothing for "
                               "it (no Dropout or BatchNorm).", where)
        if self.caller_sets_train is not None:
            return self._check(name, "pass", f"{self.target} does not set train mode itself, but its caller does "
                               f"({self.caller_sets_train.text()}).", self.caller_sets_train)
        if self.eval_before_the_loop is not None:
            return self._check(name, "warn", f"the training forward at {where.text() if where else '?'} ran in eval "
                               f"mode, as the script set it before its loop ({self.eval_before_the_loop}): "
                               f"{_names(mode_dependent)} behave as in evaluation; fine if frozen BatchNorm "
                               "statistics are meant.", where, modules=mode_dependent[:20])
        cause = ("it was called with the model in eval mode, as it is after an evaluation, and never calls "
                 "`model.train()`" if self.start_in_eval else "the model is in eval mode when the step's forward runs")
        return self._check(name, "fail", f"the training forward at {where.text() if where else '?'} ran in eval mode: "
                           f"{cause}, so {_names(mode_dependent)} behave as in evaluation (no dropout, frozen "
                           "BatchNorm statistics); call `model.train()` at the start of the step.", where,
                           modules=mode_dependent[:20])

    def _evaluation_check(self) -> Optional[CheckResult]:
        if self.evaluation is None or getattr(self, "probe", None) is not None:
            return None  # a probe's evaluation takes the backbone and the head: not run
        function, where = self.evaluation
        name = "eval-mode"
        mode_dependent = [n for n, m in self.model.named_modules() if isinstance(m, _MODE_DEPENDENT)]
        values = self.values()
        try:
            arguments = _arguments(function, values, by_use=_data_by_use(function, self.batch))
        except StepSkip as exc:
            return self._check(name, "skip", f"{function.__name__}: {exc}", where)
        self.model.train()
        forwards: list = []
        handle = self.model.register_forward_pre_hook(
            lambda module, args: forwards.append((module.training, torch.is_grad_enabled(),
                                                  _caller_in(self.code_root))))
        try:
            function(**arguments)
        except Exception as exc:  # noqa: BLE001 - the PR's evaluation code on synthetic arguments
            if not _user_frames(exc.__traceback__, self.code_root):
                raise
            return self._check(name, "skip", f"{function.__name__} raised {type(exc).__name__} on the synthetic "
                               f"arguments: {_one_line(exc, 160)}", where)
        finally:
            handle.remove()
        if not forwards:
            return self._check(name, "skip", f"{function.__name__} did not run the model.", where)
        in_train = [f for f in forwards if f[0]]
        if in_train and mode_dependent:
            at = in_train[0][2]
            return self._check(name, "fail", f"the evaluation helper {function.__name__} runs the model in train mode "
                               f"(its forward at {at.text() if at else '?'}) when called after training: it never "
                               f"calls `model.eval()`, so {_names(mode_dependent)} still behave as in training "
                               "(dropout on, BatchNorm statistics updated by the evaluation data).", at or where)
        with_grad = [f for f in forwards if f[1]]
        if with_grad:
            return self._check(name, "warn", f"{function.__name__} runs the model with autograd on (no "
                               "`torch.no_grad()` / `torch.inference_mode()`): it keeps every activation for a "
                               "backward that never comes.", with_grad[0][2] or where)
        return self._check(name, "pass", f"{function.__name__} runs the model in eval mode without autograd.", where)

    def values(self) -> dict:
        return {}


@contextlib.contextmanager
def _cuda_calls_to(device: Any, notes: list[str]):
    """On a runner whose device is not CUDA, ``tensor.cuda()`` / ``module.cuda()`` in the step move to the runner's
    device and ``torch.cuda.synchronize()`` (timing a step) does nothing: a step written for a GPU (``images =
    images.cuda(non_blocking=True)``) runs its own code instead of being skipped for a placement the runner cannot
    give it, and a CPU run on a machine that has a GPU stays on the CPU like its model. On a CUDA device nothing
    changes."""
    if str(device).startswith("cuda"):
        yield
        return
    original_tensor, original_module = torch.Tensor.cuda, nn.Module.cuda
    used: list[bool] = []

    def tensor_cuda(tensor, *args, **kwargs):
        used.append(True)
        return tensor.to(device)

    def module_cuda(module, *args, **kwargs):
        used.append(True)
        return module.to(device)

    original_synchronize = torch.cuda.synchronize

    def synchronize(*args, **kwargs):  # waiting for a CUDA device's queue: nothing is queued on this runner
        used.append(True)

    torch.Tensor.cuda, nn.Module.cuda, torch.cuda.synchronize = tensor_cuda, module_cuda, synchronize
    try:
        yield
    finally:
        torch.Tensor.cuda, nn.Module.cuda = original_tensor, original_module
        torch.cuda.synchronize = original_synchronize
        if used:
            notes.append(f"the step calls .cuda() (or torch.cuda.synchronize()); on this runner's device, {device}, "
                         "those calls moved there (synchronize does nothing)")


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _reference_gradients(subject: Subject) -> set:
    """Ids of the parameters the builder's loss gives a non-zero gradient (what a correct step must update); the
    model is left as it was."""
    model = subject.model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mode = model.training
    model.train()
    try:
        batch = subject.make_batch(STEP_BATCH, 0)
        loss = subject.loss_fn(model(*batch.args, **batch.kwargs), batch.target)
        parameters = [p for p in model.parameters() if p.requires_grad]
        gradients = torch.autograd.grad(loss.reshape(()), parameters, allow_unused=True)
        return {id(p) for p, g in zip(parameters, gradients) if g is not None and bool(g.abs().sum() > 0)}
    finally:
        model.load_state_dict(state)
        model.train(mode)


class _LightningPlan(_Plan):
    """``training_step(batch, batch_idx)`` + ``configure_optimizers()``, driven like Lightning's automatic
    optimization: train mode, zero_grad, training_step, backward, step."""

    kind = "lightning"

    def __init__(self, *args):
        super().__init__(*args)
        self._batch_by_keys(type(self.model).training_step, "training_step", self_is_model=True)
        self._optimizer_where: Optional[_Where] = None

    def optimizer_where(self) -> Optional[_Where]:
        return self._optimizer_where

    def execute(self, iterations: int) -> None:
        model = self.model
        if getattr(model, "automatic_optimization", True) is False:
            raise StepSkip("the module uses manual optimization (automatic_optimization = False)")
        if not hasattr(model, "log"):  # Lightning's logging, for a class that only has the methods
            model.log = _NullLogger()
            model.log_dict = _NullLogger()
        try:
            configured = model.configure_optimizers()
        except Exception as exc:
            raise _UserCodeFailed() from exc
        optimizers = _optimizers_of(configured)
        if len(optimizers) != 1:
            raise StepSkip(f"configure_optimizers returned {len(optimizers)} optimizers: several optimizers need "
                           "manual optimization, which the runner does not drive")
        optimizer = optimizers[0]
        self._optimizer_where = _method_where(type(model), "configure_optimizers", self.code_root)
        for index in range(iterations):
            model.train()
            optimizer.zero_grad()
            try:
                output = model.training_step(self._one_batch(), index)
            except Exception as exc:
                raise _UserCodeFailed() from exc
            loss = output.get("loss") if isinstance(output, dict) else output
            if not isinstance(loss, torch.Tensor):
                raise StepSkip(f"training_step returned {type(output).__name__}, not a loss tensor")
            try:
                loss.backward()
            except RuntimeError as exc:
                raise _UserCodeFailed() from exc
            optimizer.step()


def _optimizers_of(configured: Any) -> list:
    """The optimizers in what ``configure_optimizers`` returns: one, a list, ``(optimizers, schedulers)``, or a
    dict (or list of dicts) with an ``optimizer``."""
    if isinstance(configured, torch.optim.Optimizer):
        return [configured]
    if isinstance(configured, dict):
        return _optimizers_of(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)):
        if len(configured) == 2 and isinstance(configured[0], (list, tuple)):
            return _optimizers_of(list(configured[0]))
        return [o for item in configured for o in _optimizers_of(item)]
    return []


def _method_where(cls: type, name: str, code_root: Path) -> Optional[_Where]:
    try:
        function = getattr(cls, name)
        filename = inspect.getsourcefile(function)
        line = inspect.getsourcelines(function)[1]
        relative = str(Path(filename).resolve().relative_to(code_root))
    except (TypeError, OSError, ValueError, AttributeError):
        return None
    return _Where(relative, line, linecache.getline(filename, line).strip())


class _FunctionPlan(_Plan):
    """A function (or a trainer's method) called with arguments built by name: ``train_one_epoch(model, loader,
    optimizer, criterion, device, epoch)`` once over a loader of ``iterations`` batches, or ``train_step(batch)``
    once per iteration."""

    kind = "function"

    def __init__(self, code_root, target, subject, where, function: Callable, owner: Optional[type],
                 given: Optional[dict] = None):
        super().__init__(code_root, target, subject, where)
        self.function, self.owner = function, owner
        self.given = dict(given or {})  # smoke.steps args: parameter values by name
        # the options of the step's file, and for a method those of the scripts that construct its class
        paths = [where[0], *(_files_constructing(code_root, owner.__name__, where[0]) if owner is not None else [])]
        self.repository_defaults = _repository_options(code_root, paths, where[0], self.notes)
        self.from_callers = _options_from_callers(code_root, where[0], function, self.repository_defaults)
        if self.from_callers:
            self.notes.append("its file calls the step with options: "
                              + ", ".join(f"{k}={v!r}" for k, v in sorted(self.from_callers.items()))
                              + " (the option's default, as the call passes it)")
        # a frozen backbone and a trained head, two module parameters (a linear probe): the runner's model is the
        # backbone; the head is sized on what the step feeds it (_probe_head)
        self.probe = _frozen_backbone_and_head(function) if owner is None else None
        self.backbone: Optional[nn.Module] = None
        self.head: Optional[nn.Module] = None
        if self.probe is not None:
            inputs = _step_batch(subject)[:-1]
            labels = torch.arange(STEP_BATCH, device=inputs[0].device) % PROBE_CLASSES
            self._batch_by_keys(function, "the step", batch=(*inputs, labels[:inputs[0].shape[0]]))
            self.criterion = _Criterion(nn.functional.cross_entropy)
        else:
            self._batch_by_keys(function, "the step")
            self.criterion = _Criterion(subject.loss_fn)
        self.optimizer = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad],
                                          lr=STEP_LEARNING_RATE)
        names = list(inspect.signature(function).parameters)
        roles = {role_of(n) for n in names}
        self.per_batch = "batch" in roles and "loader" not in roles
        # an epoch function runs after the evaluation of the epoch before: called in eval mode, it must set train
        # mode itself (a per-batch step is called inside a loop that set it)
        self.start_in_eval = not self.per_batch

    def values(self, iterations: int = STEP_ITERATIONS) -> dict:
        loader = self._loader(iterations)
        return {"model": self.model, "loader": loader, "dataset": loader.dataset, "batch": self._one_batch(),
                "index": 0, "optimizer": self.optimizer, "criterion": self.criterion, "device": self.subject.device,
                "epoch": 1, "epochs": 1, "scheduler": _constant_scheduler(self.optimizer),
                "scaler": torch.amp.GradScaler("cuda", enabled=str(self.subject.device).startswith("cuda")),
                "logger": _NullLogger(), "interval": 10, "clip": 1.0, "accumulation": 1, "flag": False}

    def _reference(self) -> Optional[set]:
        return None if self.probe is not None else super()._reference()

    def run(self, iterations: int) -> list[CheckResult]:
        if self.probe is not None:
            self._probe_head()
        return super().run(iterations)

    def _probe_head(self) -> None:
        """Runs the step up to its head's first call, with a head that records what it is given and stops it
        there; the runner's head is then a linear layer from those features to ``PROBE_CLASSES`` classes, and it is
        what the step trains (its optimizer, the checks): the backbone, called under ``torch.no_grad()``, stays
        as it was."""
        backbone_name, head_name = self.probe
        self.backbone, self.head = self.model, _HeadProbe()
        mark = len(self.notes)
        try:
            with _cuda_calls_to(self.device, []):  # as the run itself (its notes are the run's)
                self.execute(1)
        except _HeadReached as reached:
            features = reached.features
            del self.notes[mark:]  # what the step's setup noted is noted again when it runs
        except StepSkip as exc:
            raise StepSkip(f"{self.target} trains '{head_name}' on features of a frozen '{backbone_name}' (a linear "
                           f"probe): {exc}") from None
        except _UserCodeFailed as exc:
            cause = exc.__cause__
            raise StepSkip(f"{self.target} trains '{head_name}' on features of a frozen '{backbone_name}' (a linear "
                           f"probe); before its head was called it raised {type(cause).__name__}"
                           f"{_raised_at(cause, self.code_root)}: {_one_line(cause, 200)}; configure smoke.steps "
                           "with both modules") from None
        else:
            raise StepSkip(f"{self.target} takes a frozen '{backbone_name}' and a trained '{head_name}', but never "
                           "called the head on the runner's batch: nothing to train")
        if not isinstance(features, torch.Tensor) or features.dim() < 2 or not features.is_floating_point():
            raise StepSkip(f"the head '{head_name}' of {self.target} is called with "
                           f"{type(features).__name__ if not isinstance(features, torch.Tensor) else tuple(features.shape)}"
                           ", not a batch of float features: the runner cannot size a head for it; configure "
                           "smoke.steps")
        width = features[0].numel()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width, PROBE_CLASSES)).to(features.device)
        self.model = self.head
        self.optimizer = torch.optim.Adam(self.head.parameters(), lr=STEP_LEARNING_RATE)
        self.notes.append(f"the step trains '{head_name}' on features of a frozen '{backbone_name}' (it calls the "
                          f"backbone only under torch.no_grad()): '{backbone_name}' is the runner's model, "
                          f"'{head_name}' a linear layer from its {width} features to {PROBE_CLASSES} classes, and "
                          "the checks are about the head")

    def execute(self, iterations: int) -> None:
        from gpu_runner.script_steps import scratch_working_folder

        # where the step's file is, as a script or a trainer's method runs: a scratch mirror of its folder, so that
        # what the step or its class's constructor writes (an experiment folder) does not need the read-only code
        with scratch_working_folder((self.code_root / self.path).resolve().parent):
            self._execute(iterations)

    def _execute(self, iterations: int) -> None:
        values = self.values(iterations)
        call = self.function
        if self.probe is not None:
            values = {**values, "model": self.backbone}
        if self.owner is not None:
            try:
                instance = self.owner(**_arguments(self.owner.__init__, values, skip_first=True,
                                                   repository_defaults=self.repository_defaults, notes=self.notes))
            except StepSkip:
                raise
            except Exception as exc:
                raise StepSkip(f"constructing {self.owner.__name__} on the runner's arguments raised "
                               f"{type(exc).__name__}: {_one_line(exc, 200)}") from None
            # the trainer may wrap or copy what it was given: instrument what it trains
            model = next((v for v in vars(instance).values() if v is self.model), None)
            if model is None:
                raise StepSkip(f"{self.owner.__name__} does not keep the model it was given as an attribute")
            call = getattr(instance, self.function.__name__)
        by_use = _data_by_use(call, self.batch)
        given = {**self.from_callers, **self.given}
        if self.probe is not None:
            given.update({self.probe[0]: self.backbone, self.probe[1]: self.head})
        arguments = _arguments(call, values, given=given, repository_defaults=self.repository_defaults,
                               by_use=by_use, notes=self.notes)
        for key in arguments:
            if role_of(key) == "device" and isinstance(arguments[key], str) and _reads_attribute_of(call, key):
                arguments[key] = torch.device(arguments[key])  # ``device.type``: the step takes a torch.device
        restore = self._provide_globals(values, by_use)
        # the step takes the data itself (a graph's features and adjacency): one optimizer step per call
        self.full_batch = any(name in by_use for name in [*arguments, *self.provided])
        if self.full_batch:
            self.notes.append("the step takes its data directly, not from a loader: "
                              f"{', '.join(sorted(n for n in by_use if n in arguments or n in self.provided))} "
                              "made from the runner's batch by what the step does with them; called once per "
                              "iteration")
        from gpu_runner.script_steps import loaders_in_process

        datasets = _RepositoryDatasets(self.code_root, lambda: self._loader(iterations).dataset, self.notes)
        try:
            # the helpers a step wraps its loop in, where their packages are absent (wandb, accelerate; torchvision's
            # data sets), and its loaders without worker processes: as a script's step has them
            with datasets, loaders_in_process(self.notes), training_apis.single_process_apis(self.device, self.notes), \
                    vision_data.synthetic_vision_data(self.notes):
                self._call(call, arguments, iterations)
        finally:
            restore()

    def _provide_globals(self, values: dict, by_use: dict) -> Callable[[], None]:
        """The module globals the step reads in place of parameters (``def train(epoch)`` using the file's ``net``,
        ``optimizer``, ``trainloader``): what the runner trains and measures with (model, loader, optimizer,
        criterion, device) replaces what the file assigned; another role fills a global the file left unset (its
        script part did not run); settings (``args``) are made from what is read. Returns what restores them."""
        function = inspect.unwrap(self.function)
        namespace = getattr(function, "__globals__", None)
        node = _function_node(function)
        self.provided: set = set()
        if namespace is None or node is None:
            return lambda: None
        import builtins

        saved: dict = {}
        for name in sorted(global_reads(node)):
            role = role_of(name)
            current = namespace.get(name, getattr(builtins, name, None))
            if inspect.isclass(current) or inspect.isroutine(current) or inspect.ismodule(current):
                continue  # ``DataLoader``, ``iter``: what the step calls, not data it trains on
            if role in _ALWAYS_GIVEN and role in values:
                value = values[role]
            elif name in namespace or hasattr(builtins, name):
                continue
            elif role in values:
                value = values[role]
            elif name.lower() in CONFIG_NAMES:
                value = _config_namespace(function, name, values, (self.given or {}).get(name),
                                          self.repository_defaults)
            elif name in by_use:
                value = by_use[name]
            else:
                failed = failed_import(self.code_root, self.path, name, namespace)
                if failed and _only_called_for_effect(node, name):
                    # a progress bar or logger whose import failed: the training does not read what it returns
                    self.notes.append(f"'{name}' is only called for its effect (its result unused), and {failed}: "
                                      "the runner called a no-op in its place")
                    saved[name] = namespace.get(name, _NOT_GIVEN)
                    namespace[name] = _NullLogger()
                    continue
                for key, old in saved.items():
                    _restore(namespace, key, old)
                if failed:
                    raise StepSkip(f"{self.target} reads the global '{name}', which {failed}")
                raise StepSkip(f"{self.target} reads the global '{name}', which is unset once {self.path}'s "
                               "definitions ran (it is assigned in the script part, or its assignment failed) and "
                               "the runner cannot build; give the step its value as a parameter")
            saved[name] = namespace.get(name, _NOT_GIVEN)
            namespace[name] = value
        self.provided = set(saved)
        if saved:
            self.notes.append(f"the step reads module globals; the runner provided {', '.join(sorted(saved))}")

        def restore() -> None:
            for key, old in saved.items():
                _restore(namespace, key, old)

        return restore

    def _call(self, call: Callable, arguments: dict, iterations: int) -> None:
        rounds = iterations if self.per_batch or self.full_batch else 1
        for index in range(rounds):
            if self.per_batch:
                for key, parameter in inspect.signature(call).parameters.items():
                    if role_of(key) == "batch":
                        arguments[key] = self._one_batch()
                    elif role_of(key) == "index" and key in arguments:
                        arguments[key] = index
            try:
                call(**arguments)
            except Exception as exc:
                raise _UserCodeFailed() from exc


PROBE_CLASSES = 10  # the classes of a linear probe's head (its batch's labels cycle through them)
_MODULE_WORDS = {"head", "backbone", "encoder", "classifier", "model", "net", "network", "probe"}
_NO_GRAD_CALLS = {"no_grad", "inference_mode"}


class _HeadReached(BaseException):
    """Raised by the head's stand-in on its first call, with what it was given (``_FunctionPlan._probe_head``)."""

    def __init__(self, features: Any):
        super().__init__("the head was reached")
        self.features = features


class _HeadProbe(nn.Module):
    def forward(self, features, *args, **kwargs):
        raise _HeadReached(features)


def _is_module_name(name: str) -> bool:
    """A parameter that holds a module: the model's role, or a compound name ending in a module word
    (``linear_classifier``, ``proj_head``)."""
    lowered = name.lower().rstrip("_")
    return role_of(name) == "model" or lowered.rsplit("_", 1)[-1] in _MODULE_WORDS


def _frozen_backbone_and_head(function: Callable) -> Optional[tuple[str, str]]:
    """``(backbone, head)``: the names of two module parameters of ``function`` of which it calls one only inside
    ``torch.no_grad()`` / ``torch.inference_mode()`` (a frozen feature extractor: ``backbone(x)``,
    ``backbone.encoder(x)``) and the other outside them (the head it trains). None for any other step."""
    node = _function_node(inspect.unwrap(function))
    if node is None:
        return None
    try:
        names = [n for n in inspect.signature(function).parameters if _is_module_name(n)]
    except (TypeError, ValueError):
        return None
    if len(names) != 2:
        return None
    calls: dict = {name: [] for name in names}  # name -> [called under no_grad, ...]
    call_nodes: dict = {name: [] for name in names}

    def visit(statement: ast.AST, frozen: bool) -> None:
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            inner = frozen or any(isinstance(item.context_expr, ast.Call)
                                  and (_dotted(item.context_expr.func) or "").rsplit(".", 1)[-1] in _NO_GRAD_CALLS
                                  for item in statement.items)
            for item in statement.items:
                visit(item.context_expr, frozen)
            for child in statement.body:
                visit(child, inner)
            return
        if isinstance(statement, ast.Call):
            base = statement.func
            if isinstance(base, ast.Attribute) and base.attr not in ("eval", "train", "to", "cuda", "parameters",
                                                                      "named_parameters", "requires_grad_"):
                base = base.value
            if isinstance(base, ast.Name) and base.id in calls:
                calls[base.id].append(frozen)
                call_nodes[base.id].append(statement)
        for child in ast.iter_child_nodes(statement):
            visit(child, frozen)

    for statement in node.body:
        visit(statement, False)
    frozen = [n for n in names if calls[n] and all(calls[n])]
    trained = [n for n in names if calls[n] and not any(calls[n])]
    if len(frozen) == 1 and len(trained) == 1 and _fed_from(node, call_nodes[frozen[0]], call_nodes[trained[0]]):
        return frozen[0], trained[0]
    return None


def _fed_from(node: ast.AST, sources: list, calls: list) -> bool:
    """Whether one of ``calls`` takes an argument computed from one of ``sources`` (the backbone's calls): directly,
    or through names assigned from them (``features = backbone(x)``, ``pooled = torch.cat([f[:, 0] for f in
    features])``). A teacher and a student that both read the batch are not a probe: the student is no head."""
    source_ids = {id(n) for n in sources}
    derived: set = set()

    def reads(expression: ast.AST) -> bool:
        return any(id(n) in source_ids or isinstance(n, ast.Name) and n.id in derived for n in ast.walk(expression))

    assignments = [n for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                   and n.value is not None]
    for _ in range(4):
        for assignment in assignments:
            if reads(assignment.value):
                targets = assignment.targets if isinstance(assignment, ast.Assign) else [assignment.target]
                derived.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return any(reads(argument) for call in calls for argument in [*call.args, *(k.value for k in call.keywords)])


class _StandInDataset(torch.utils.data.Dataset):
    """What a repository's data set becomes when it cannot be built on the runner: the rows of the runner's data."""

    _torchreview_rows: torch.utils.data.Dataset

    def __len__(self) -> int:
        return len(self._torchreview_rows)

    def __getitem__(self, index: int) -> Any:
        return self._torchreview_rows[index]


_STAND_IN_CLASSES: dict = {}


def _stand_in_class(cls: type) -> type:
    """``_StandInDataset`` keeping what ``cls`` declares as plain class-level values (``NUM_CLASSES = 21``, a
    class list), which the code reads of a data set it built; none of its methods."""
    if cls not in _STAND_IN_CLASSES:
        kept = {}
        for base in reversed(cls.__mro__):
            if base in (object, torch.utils.data.Dataset) or not issubclass(base, torch.utils.data.Dataset):
                continue
            kept.update({k: v for k, v in vars(base).items() if not k.startswith("__")
                         and isinstance(v, (int, float, str, bytes, tuple, list, dict, frozenset, type(None)))})
        _STAND_IN_CLASSES[cls] = type(cls.__name__, (_StandInDataset,), {**kept, "__module__": __name__})
    return _STAND_IN_CLASSES[cls]


class _RepositoryDatasets:
    """While a step that is given its model runs: a data set class the repository defines (a ``Dataset`` subclass
    in a file under the code root) whose constructor raises, because its files are not on the runner (an image
    folder, a CSV file, a download), yields the runner's rows instead (``rows()``: the batch the step's model
    takes, as tuples or as dicts by key), so the step's own split, loader and loop run on them. A data set that
    builds is the step's own, untouched. Said in the step's notes."""

    def __init__(self, code_root: Path, rows: Callable[[], torch.utils.data.Dataset], notes: list):
        self.code_root, self.rows, self.notes = code_root.resolve(), rows, notes
        self.saved: list[tuple[type, Callable]] = []

    def classes(self) -> list[type]:
        found = []
        for module in list(sys.modules.values()):
            filename = getattr(module, "__file__", None)
            if not filename:
                continue
            try:
                Path(filename).resolve().relative_to(self.code_root)
            except (ValueError, OSError):
                continue
            for value in list(vars(module).values()):
                if inspect.isclass(value) and value.__module__ == module.__name__ and "__init__" in vars(value) \
                        and issubclass(value, torch.utils.data.Dataset) \
                        and not issubclass(value, torch.utils.data.IterableDataset) and value not in found:
                    found.append(value)
        return found

    def __enter__(self) -> "_RepositoryDatasets":
        for cls in self.classes():
            self.saved.append((cls, vars(cls)["__init__"]))
            cls.__init__ = self._guarded(cls, vars(cls)["__init__"])
        return self

    def __exit__(self, *exc_info) -> bool:
        for cls, init in reversed(self.saved):
            cls.__init__ = init
        self.saved.clear()
        return False

    def _guarded(self, cls: type, init: Callable) -> Callable:
        plan = self

        def init_or_stand_in(instance, *args, **kwargs):
            if isinstance(instance, _StandInDataset):
                return None  # a subclass's ``super().__init__()`` after its base stood in
            given = [v for v in [*args, *kwargs.values()] for v in (v if isinstance(v, (list, tuple)) else [v])]
            if any(isinstance(v, _StandInDataset) for v in given):
                # built over data sets that stood in (a concatenation, a subset of them): its rows would be theirs,
                # and what it reads of them (their file lists) the stand-ins do not have
                try:
                    instance.__class__ = _stand_in_class(cls)
                except TypeError:
                    return init(instance, *args, **kwargs)
                instance._torchreview_rows = plan.rows()
                note = (f"the repository's data set {cls.__name__} is built over data sets that stood in: it stood "
                        f"in too ({len(instance)} of the runner's rows)")
                if note not in plan.notes:
                    plan.notes.append(note)
                return None
            try:
                init(instance, *args, **kwargs)
            except StepSkip:
                raise  # the runner's own verdict on what the step reached, not the data set's failure
            except Exception as exc:
                try:
                    instance.__class__ = _stand_in_class(cls)
                except TypeError:  # a layout the stand-in cannot take (``__slots__``): the failure stands
                    raise exc from None
                instance._torchreview_rows = plan.rows()
                note = (f"the repository's data set {cls.__name__} could not be built on the runner "
                        f"({type(exc).__name__}{_raised_at(exc, plan.code_root)}: {_one_line(exc, 120)}): the step's "
                        f"own split, loader and loop ran on the runner's rows ({len(instance)} of them) instead")
                if note not in plan.notes:
                    plan.notes.append(note)

        init_or_stand_in.__wrapped__ = init
        return init_or_stand_in


class _PendingRows(torch.utils.data.Dataset):
    """The rows a data set of the repository stands in with while a trainer class is constructed, before the model
    it builds exists to make them for: ``length`` rows (as many as the runner's loader holds), readable once
    ``rows`` is set (the runner's data set for that model)."""

    def __init__(self, length: int):
        self.length, self.rows = length, None

    def __len__(self) -> int:
        return self.length if self.rows is None else len(self.rows)

    def __getitem__(self, index: int) -> Any:
        if self.rows is None:
            raise StepSkip("the trainer reads its data while it is constructed, before its model exists: the runner "
                           "cannot make batches for it; configure smoke.steps with an input")
        return self.rows[index]


class _PendingLoader:
    """What a trainer class is constructed with in place of its loaders and data sets, before the model it builds
    exists to make batches for; replaced by the runner's loader once it does."""

    def __len__(self) -> int:
        return STEP_ITERATIONS

    def __iter__(self):
        raise StepSkip("the trainer reads its data while it is constructed, before its model exists: the runner "
                       "cannot make batches for it; configure smoke.steps with an input")


class _TrainerPlan(_Plan):
    """A method of a class that builds what it trains itself (an experiment / solver / agent class: its
    constructor, or a method it calls, makes the model and an optimizer over its parameters): the class is
    constructed from its options (those the scripts that construct it hand over: ``_repository_options``; the
    class's config), the model is what its optimizers hold, a batch is made for that model as for any built model,
    and the method runs on the runner's loader, its loop bounded. A data set of the repository that the
    constructor cannot build (its files are not here) stands in with rows made once the model exists
    (``_PendingRows``); one built over stand-ins stands in too."""

    kind = "trainer"
    unchanged_fails = False  # the class's own optimizer and learning rate update the model, as a script's do

    def __init__(self, code_root, target, where, function: Callable, owner: type, given: Optional[dict], device):
        super().__init__(code_root, target, None, where, device=device)
        self.function, self.owner, self.given = function, owner, dict(given or {})
        paths = [where[0], *_files_constructing(code_root, owner.__name__, where[0])]
        self.repository_defaults = _repository_options(code_root, paths, where[0], self.notes)

    def execute(self, iterations: int) -> None:
        from gpu_runner.script_steps import _script_environment

        shrunk: list = []
        # run where the class's file is, as its script runs it: a scratch mirror of its folder for what it writes
        with _script_environment((self.code_root / self.path).resolve(), self.device, shrunk, self.notes):
            self._execute(iterations)

    def _execute(self, iterations: int) -> None:
        from gpu_runner.script_steps import _named_values_of, _outermost, shrunk_setting

        pending = _PendingLoader()
        # the epoch the method is given (1) lies within the epochs its class is built for (0 and 1: a schedule over
        # ``epochs * len(loader)`` iterations is not past its end while the method runs)
        values = {"loader": pending, "dataset": pending, "device": self.device, "epoch": 1, "epochs": 2,
                  "logger": _NullLogger(), "interval": 10, "clip": 1.0, "accumulation": 1, "flag": False}
        defaults = {k: shrunk_setting(k, v, self.repository_defaults, self.device, [])
                    for k, v in self.repository_defaults.items()}
        # an option named like data (``dataset = "CelebA"``) is the option's value, not the pending loader
        named_data = {k: v for k, v in defaults.items() if role_of(k) in ("loader", "dataset")}
        given = {p: dict(named_data) for p in list(inspect.signature(self.owner.__init__).parameters)[1:]
                 if p.lower() in CONFIG_NAMES}
        given.update(self._annotated_modules())
        given.update(self._guessed_sizes(given, values))
        # a data set of the repository the constructor builds from files that are not here (its loaders made
        # before its model): it stands in with rows made once the model exists, as during the method
        pending_rows = _PendingRows(iterations * STEP_BATCH)
        try:
            arguments = _arguments(self.owner.__init__, values, skip_first=True, given=given,
                                   repository_defaults=defaults, notes=self.notes)
            with _RepositoryDatasets(self.code_root, lambda: pending_rows, self.notes):
                instance = self.owner(**arguments)
        except StepSkip:
            raise
        except Exception as exc:
            at = _raised_at(exc, self.code_root)
            missing = absent.missing_package(exc)
            raise StepSkip(f"constructing {self.owner.__name__} from its options raised {type(exc).__name__}{at}: "
                           f"{_one_line(exc, 200)}" + (f" (it needs '{missing}')" if missing else "")) from None
        attributes = dict(vars(instance))
        optimizers = [v for _, v in _named_values_of(attributes, torch.optim.Optimizer)]
        for wrapper in attributes.values():  # an optimizer inside a wrapper the class keeps (a warm-up schedule)
            if not isinstance(wrapper, (nn.Module, torch.Tensor, torch.optim.Optimizer, type, types.ModuleType)) \
                    and isinstance(getattr(wrapper, "__dict__", None), dict):
                optimizers += [v for _, v in _named_values_of(vars(wrapper), torch.optim.Optimizer)
                               if all(v is not o for o in optimizers)]
        held = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
        modules = {name: m for name, m in _named_values_of(attributes, nn.Module)
                   if any(id(p) in held for p in m.parameters())}
        made_in_method = not optimizers and self._optimizer_made_in_method()
        if made_in_method:
            # the method makes its optimizer over ``self.<model>.parameters()``: the model is what the instance holds
            modules = {name: m for name, m in _named_values_of(attributes, nn.Module)
                       if any(p.requires_grad for p in m.parameters())}
        chosen = _outermost(modules)
        if len(chosen) != 1:
            raise StepSkip(f"{self.owner.__name__} holds {len(chosen)} models its optimizers train "
                           f"({', '.join(chosen) or 'none'}): the runner makes batches for one; name the model in "
                           "smoke.steps")
        (name, model), = chosen.items()
        notes: list = []
        subject = build_module.subject_of_model(model, f"{self.owner.__name__}.{name}", type(model).__name__, {},
                                                self.code_root, self.device, notes)
        if not isinstance(subject, Subject):
            raise StepSkip(f"the model {self.owner.__name__} builds ({name}: {type(model).__name__}) gets no batch: "
                           f"{getattr(subject, 'reason', subject)}")
        self.subject = subject
        batch = _step_batch(subject)
        if any(isinstance(v, nn.BCELoss) for v in attributes.values()) and batch[-1].is_floating_point():
            # the class's criterion takes probabilities against targets in [0, 1] (binary masks, labels)
            batch = batch[:-1] + ((batch[-1] > 0).to(batch[-1].dtype),)
            self.notes.append("the class's criterion is a BCELoss: the batch's targets are 0 / 1")
        elif batch[-1].is_floating_point() and any(_takes_class_indices(v) for v in attributes.values()):
            from gpu_runner.batch_keys import class_indices

            batch = batch[:-1] + (class_indices(batch[-1]),)
            self.notes.append("the class's criterion reads its target as class indices (a cross-entropy, or a "
                              "function casting its target to integers): the batch's targets are class indices")
        self._batch_by_keys(self.function, "the step", batch=batch)
        loader = self._loader(iterations)
        pending_rows.rows = loader.dataset
        for key, value in attributes.items():
            if value is pending:
                setattr(instance, key, loader)
            elif isinstance(value, _LoadersByKey) and value.loader is pending:
                value.loader = loader  # a dict of loaders the class keeps and looks up later
        self.notes.append(f"{self.owner.__name__} built its own model: {name} ({type(model).__name__}, "
                          f"{sum(p.numel() for p in model.parameters()):,} parameters), trained by its own optimizer"
                          + ("s" if len(optimizers) > 1 else "")
                          + (f" (made by {self.function.__name__} itself)" if made_in_method else ""))
        self.notes.extend(notes[:3])
        model.train()
        self.begin(model, None, step_limit=STEP_BOUND_FACTOR * iterations, backward_limit=3 * iterations,
                   extra_parameter_ids=frozenset(held - {id(p) for p in model.parameters()}))
        method = getattr(instance, self.function.__name__)
        values.update(loader=loader, dataset=loader.dataset, model=model, batch=self._one_batch())
        call_arguments = _arguments(method, values, given=self.given, repository_defaults=defaults, notes=self.notes)
        # the method may build its own data (``self._get_data(flag="train")``): a repository data set whose files are
        # not on the runner yields the runner's rows for the model, as for a step that is given its model
        datasets = _RepositoryDatasets(self.code_root, lambda: self._loader(iterations).dataset, self.notes)
        try:
            with datasets:
                method(**call_arguments)
        except (StepSkip, _EnoughSteps):
            raise
        except Exception as exc:
            after = self._after_the_loop(exc, iterations)
            if after is None:
                raise _UserCodeFailed() from exc
            # as a script's loop is run and what follows it is not: the training ran, the code after it is noted
            self.notes.append(f"{self.target}'s training loop ran to its end ({self.instruments.steps} optimizer "
                              f"steps); the code after it raised {type(exc).__name__} at line {after}: "
                              f"{_one_line(exc, 120)} (not a training step: not checked)")

    def _optimizer_made_in_method(self) -> bool:
        """The class makes its optimizer in a training method over a model it holds (see
        ``targets.trainer_optimizes_what_it_holds``), not in its constructor."""
        from gpu_runner.targets import trainer_optimizes_what_it_holds

        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(self.owner)))
        except (OSError, TypeError, SyntaxError):
            return False
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
        return node is not None and trainer_optimizes_what_it_holds(node)

    def _guessed_sizes(self, given: dict, values: dict) -> dict:
        """The constructor's required parameters with no role, no option and no value from above that the runner
        guesses for a model's constructor by name (``vocab_size``, ``hidden_dim``): the same guess as for the
        model the trainer builds from them, so sizes passed on to it agree."""
        from gpu_runner.build import guess_argument

        guessed = {}
        for parameter in list(inspect.signature(self.owner.__init__).parameters.values())[1:]:
            if parameter.default is not parameter.empty or parameter.name in given \
                    or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) \
                    or role_of(parameter.name) in values or parameter.name.lower() in CONFIG_NAMES:
                continue
            found, value = guess_argument(parameter.name, parameter.annotation)
            if found:
                guessed[parameter.name] = value
        if guessed:
            self.notes.append(f"{self.owner.__name__}'s constructor got sizes guessed by name, as a model's are: "
                              + ", ".join(f"{k}={v!r}" for k, v in guessed.items()))
        return guessed

    def _annotated_modules(self) -> dict:
        """The constructor's required parameters annotated with a module class of the repository (``bert: BERT``,
        a backbone the trainer wraps in its own model): each built as the runner builds that model."""
        built = {}
        try:
            parameters = list(inspect.signature(self.owner.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            return built
        for parameter in parameters:
            cls = parameter.annotation
            if parameter.default is not parameter.empty or not inspect.isclass(cls) or not issubclass(cls, nn.Module):
                continue
            try:
                relative = Path(inspect.getsourcefile(cls)).resolve().relative_to(self.code_root.resolve())
            except (TypeError, OSError, ValueError):
                continue  # torch's own classes, a package's: not the repository's to build
            notes: list = []
            made = build_module._construct(self.code_root, f"{relative.as_posix()}:{cls.__qualname__}", {}, notes)
            if isinstance(made, Skip):
                raise StepSkip(f"cannot build the argument '{parameter.name}' of {self.owner.__name__}.__init__ "
                               f"(a {cls.__name__}): {made.reason}")
            built[parameter.name] = made[0].to(self.device)
            self.notes.append(f"{self.owner.__name__} takes a {cls.__name__} ('{parameter.name}'): the runner built "
                              f"it as it builds that model ({relative.as_posix()}:{cls.__qualname__})")
        return built

    def _after_the_loop(self, exc: BaseException, iterations: int) -> Optional[int]:
        """The line of the method, past its training loop, that raised ``exc`` once the loop had made at least
        ``iterations`` optimizer steps; None otherwise (a failure of the step itself)."""
        from gpu_runner.targets import training_loop_chain

        if self.instruments is None or self.instruments.steps < iterations:
            return None
        try:
            lines, start = inspect.getsourcelines(self.function)
            node = ast.parse(textwrap.dedent("".join(lines))).body[0]
        except (OSError, TypeError, SyntaxError, IndexError):
            return None
        chain = training_loop_chain(node.body)
        if not chain:
            return None
        loop = chain[-1]
        last_loop_line = start + (loop.end_lineno or loop.lineno) - 1
        code = self.function.__code__
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == code.co_filename
                  and f.name == code.co_name]
        if not frames or frames[-1].lineno is None or frames[-1].lineno <= last_loop_line:
            return None
        return frames[-1].lineno


def _repository_options(code_root: Path, paths: list, reader: str, notes: list) -> dict:
    """The options a step's code gets from the scripts in ``paths`` (the step's file first, then the scripts that
    construct its class), as a run of them hands them over: their argparse defaults; an option the command line
    must give (``required=True``) valued as a script's run values it (``script_steps.required_options``: its first
    choice, the default it declares, a constant the code compares it with, in ``reader`` too); then what the
    scripts set on their options after ``parse_args()`` (``script_steps.options_set_after_parsing``). Said in
    ``notes``."""
    from gpu_runner.script_steps import options_set_after_parsing, required_options

    options: dict = {}
    for path in paths:
        for key, value in sites.argparse_defaults(code_root, path).items():
            options.setdefault(key, value)
    given = []
    for path in paths:
        for key, (value, source) in required_options(code_root / path, (code_root / reader,)).items():
            if key not in options:
                options[key] = value
                given.append(f"--{key} {value} ({source})")
    if given:
        notes.append("options the command line must give were given values the code declares: " + "; ".join(given))
    for path in paths:
        options = options_set_after_parsing(code_root / path, options, notes)
    return options


def _takes_class_indices(criterion: Any) -> bool:
    """A trainer's criterion that reads its target as class indices: a cross-entropy / NLL loss module, or a
    function (a bound method: ``SegmentationLosses(...).build_loss("ce")``) that casts its second parameter to
    integers (``target.long()``) before its loss."""
    from gpu_runner.batch_keys import _casts_to_integer

    if isinstance(criterion, (nn.CrossEntropyLoss, nn.NLLLoss)):
        return True
    if not (inspect.isfunction(criterion) or inspect.ismethod(criterion)):
        return False
    node = _function_node(criterion)
    if node is None:
        return False
    parameters = [a.arg for a in node.args.posonlyargs + node.args.args][1 if inspect.ismethod(criterion) else 0:]
    if len(parameters) < 2:
        return False
    return any(_casts_to_integer(n) and isinstance(n.func.value, ast.Name) and n.func.value.id == parameters[1]
               for n in ast.walk(node))


def _files_constructing(code_root: Path, name: str, defining: Optional[str] = None) -> list[str]:
    """The repository's files (relative paths) that call ``name(...)``, or take it under another name
    (``Exp = Exp_Informer`` before ``Exp(args)``): where a class is built from its options. With ``defining`` (the
    class's file), a file that imports a class of that name from another file (``from exp.exp_stat import
    Exp_Main`` beside ``exp/exp_main.py``; a sub-project's own ``exp/exp_main.py``) builds another class and is
    left out; one whose import cannot be read stays in."""
    pattern = re.compile(rf"\b{re.escape(name)}\(|=\s*{re.escape(name)}\s*$", re.M)
    found = []
    for path in sorted(code_root.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
            relative = path.relative_to(code_root).as_posix()
        except (OSError, ValueError):
            continue
        if pattern.search(text) and (defining is None or relative == defining
                                     or _imports_name_from(code_root, path, text, name) in (None, defining)):
            found.append(relative)
    return found[:8]


def _imports_name_from(code_root: Path, path: Path, text: str, name: str) -> Optional[str]:
    """The file (relative path) that ``path``'s ``from M import name`` takes ``name`` from, resolved as Python
    would with the script's folder and then the code root on the path (a relative import against its package);
    None when the file does not import ``name`` that way or the module is not a file of the repository."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not any(a.name == name for a in node.names):
            continue
        parts = (node.module or "").split(".") if node.module else []
        if node.level:
            bases = [path.parents[node.level - 1]] if len(path.parents) >= node.level else []
        else:
            bases = [path.parent, code_root]
        for base in bases:
            for candidate in (base.joinpath(*parts).with_suffix(".py") if parts else None,
                              base.joinpath(*parts, "__init__.py")):
                if candidate is not None and candidate.is_file():
                    try:
                        return candidate.resolve().relative_to(code_root.resolve()).as_posix()
                    except ValueError:
                        return None
        return None
    return None


def _data_by_use(function: Callable, batch: tuple, depth: int = 1) -> dict:
    """Values for the names a full-batch step feeds its model directly (``output = model(features, adj)``,
    ``model(*inputs)``), compares its output with (``nll_loss(output[idx_train], labels[idx_train])``: the target)
    or indexes the output or target with (``idx_train``, ``mask``: every row), from the runner's batch (inputs...,
    target), read from what the function does with them. A name passed on to a function of the same module
    (``test(model, criterion, input, target, mask_val)``) takes what that function does with it."""
    node = _function_node(inspect.unwrap(function))
    if node is None:
        return {}
    inputs, target = batch[:-1], batch[-1]
    rows = torch.arange(len(target))
    uses: dict = {}

    def base(expression: ast.AST) -> ast.AST:
        while isinstance(expression, (ast.Subscript, ast.Attribute)):
            expression = expression.value
        return expression

    def is_model_call(call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        func = call.func.value if isinstance(call.func, ast.Attribute) and call.func.attr == "forward" else call.func
        return isinstance(func, ast.Name) and role_of(func.id) == "model"

    outputs = set()
    for item in ast.walk(node):
        if is_model_call(item):
            if len(item.args) == 1 and isinstance(item.args[0], ast.Starred) and isinstance(item.args[0].value,
                                                                                           ast.Name):
                uses.setdefault(item.args[0].value.id, tuple(inputs))
            for position, argument in enumerate(item.args):
                if isinstance(argument, ast.Name) and position < len(inputs):
                    uses.setdefault(argument.id, inputs[position])
        if isinstance(item, ast.Assign) and is_model_call(base(item.value)):
            outputs.update(t.id for t in item.targets if isinstance(t, ast.Name))
    targets = set()
    for item in ast.walk(node):
        if isinstance(item, ast.Call) and not is_model_call(item) and len(item.args) >= 2:
            first, second = base(item.args[0]), base(item.args[1])
            if (is_model_call(first) or isinstance(first, ast.Name) and first.id in outputs) \
                    and isinstance(second, ast.Name) and second.id not in outputs:
                targets.add(second.id)
                uses.setdefault(second.id, target)
    for item in ast.walk(node):
        if isinstance(item, ast.Subscript) and isinstance(item.slice, ast.Name) \
                and isinstance(item.value, ast.Name) and item.value.id in outputs | targets:
            uses.setdefault(item.slice.id, rows)
    namespace = getattr(inspect.unwrap(function), "__globals__", {})
    for item in ast.walk(node):
        if depth <= 0 or not isinstance(item, ast.Call) or not isinstance(item.func, ast.Name):
            continue
        callee = namespace.get(item.func.id)
        if not inspect.isfunction(callee) or callee.__module__ != getattr(function, "__module__", None):
            continue
        try:
            parameters = list(inspect.signature(callee).parameters)
        except (TypeError, ValueError):
            continue
        passed = {parameters[i]: a.id for i, a in enumerate(item.args[:len(parameters)]) if isinstance(a, ast.Name)}
        for parameter, value in _data_by_use(callee, batch, depth - 1).items():
            if parameter in passed:
                uses.setdefault(passed[parameter], value)
    return uses


def failed_import(code_root: Path, path: str, name: str, namespace: dict) -> Optional[str]:
    """Why ``name`` is unset when the file binds it by an import (``import lib``, ``from utils import progress_bar``):
    that import, run again, says what it lacks. None when no import binds it or it now works."""
    file_path = (code_root / path).resolve()
    try:
        tree = ast.parse(file_path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and any((a.asname or a.name.split(".")[0]) == name for a in n.names)), None)
    if node is None:
        return None
    try:
        exec(compile(ast.Module(body=[node], type_ignores=[]), str(file_path), "exec"), dict(namespace))
    except Exception as exc:  # noqa: BLE001 - the repository's import, reported
        statement = ast.get_source_segment(file_path.read_text(errors="replace"), node) or ""
        missing = absent.missing_package(exc) or build_module._not_installed(exc, code_root)
        if missing:
            return (f"its import `{statement}` (line {node.lineno}) leaves unset: it needs '{missing}', which is not "
                    "installed on the smoke runner")
        return (f"its import `{statement}` (line {node.lineno}) leaves unset: it raised {type(exc).__name__}"
                f"{build_module._where_in(exc, code_root)}: {_one_line(exc, 160)}")
    return None


def _only_called_for_effect(function: ast.AST, name: str) -> bool:
    """Every read of ``name`` in ``function`` is a call statement whose result is dropped (``progress_bar(i, n,
    text)``, ``log(...)``): nothing the function computes depends on it."""
    reads = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    called = {id(n.value.func) for n in ast.walk(function) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
              and isinstance(n.value.func, ast.Name) and n.value.func.id == name}
    return bool(reads) and all(id(n) in called for n in reads)


def _reads_name(function: Callable, name: str) -> bool:
    """Whether ``function``'s body reads ``name`` (True when its source cannot be read)."""
    node = _function_node(inspect.unwrap(function))
    if node is None:
        return True
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(node))


def _reads_attribute_of(function: Callable, name: str) -> bool:
    """``function`` reads an attribute of its parameter ``name`` (``device.type``)."""
    node = _function_node(inspect.unwrap(function))
    return node is not None and any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                                    and n.value.id == name for n in ast.walk(node))


def _restore(namespace: dict, name: str, old: Any) -> None:
    if old is _NOT_GIVEN:
        namespace.pop(name, None)
    else:
        namespace[name] = old


def _function_node(function: Callable) -> Optional[ast.AST]:
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


# ---- resolving a target ----------------------------------------------------------------------------------

def _plan(code_root: Path, target: str, config: dict, device: str, seed: int) -> _Plan:
    _add_to_sys_path(code_root)
    spec = parse_target_spec(target)
    if spec is None or spec.name is None:
        raise StepSkip(f"'{target}' is not a step (path/to/file.py:function or :Class.method)")
    if not (code_root / spec.path).is_file():
        raise StepSkip(f"{spec.path} does not exist in the pull request's code")
    build_module._IMPORT_NOTES.clear()
    module = _import_step_file(code_root, spec.path)
    import_notes = list(build_module._IMPORT_NOTES)  # building the model starts its own notes
    if _is_script_step(code_root, spec.path, spec.name) and not config.get("model"):
        from gpu_runner.script_steps import script_plan

        if config.get("args"):
            raise BuildError(f"smoke.steps args: {target} builds its own model and settings (a script's training "
                             "loop); args are for step functions that take them")
        plan = script_plan(code_root, target, spec.path, spec.name, module, device)
        plan.notes[:0] = import_notes
        return plan
    parts = spec.name.split(".")
    owner: Any = module
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
    function = getattr(owner, parts[-1], None) if owner is not None else None
    if function is None or not callable(function):
        raise StepSkip(f"{spec.path} defines no function '{spec.name}'")
    where = _function_span(function, code_root, spec.path)
    _check_configured_arguments(function, config.get("args") or {}, target)
    model_options = {k: v for k, v in config.items() if k in MODEL_OPTIONS}
    if inspect.isclass(owner) and issubclass(owner, nn.Module) and hasattr(owner, "configure_optimizers") \
            and parts[-1] == "training_step":
        if config.get("args"):
            raise BuildError(f"smoke.steps args: {target} is a LightningModule's training_step, called with batches "
                             "the runner makes; args are for step functions")
        subject = _subject(code_root, f"{spec.path}:{'.'.join(parts[:-1])}", model_options, device, seed)
        plan = _LightningPlan(code_root, target, subject, _class_span(owner, code_root, spec.path))
        plan.notes[:0] = import_notes
        return plan
    if inspect.isclass(owner) and not issubclass(owner, nn.Module) and not config.get("model") \
            and _trainer_builds_its_own_model(owner):
        plan = _TrainerPlan(code_root, target, where, function, owner, config.get("args"), device)
        plan.notes[:0] = import_notes
        return plan
    model_target = config.get("model") or _model_for(code_root, spec.path, module)
    if not config.get("model") and not inspect.isclass(owner):
        model_target = _backbone_for_probe(code_root, function, model_target, import_notes)
    subject = _subject(code_root, model_target, model_options, device, seed)
    plan = _FunctionPlan(code_root, target, subject, where, function, owner if inspect.isclass(owner) else None,
                         config.get("args"))
    plan.notes[:0] = [f"the model: {model_target}" + (" (configured)" if config.get("model") else ""),
                      *import_notes]
    if plan.start_in_eval:
        plan.caller_sets_train = _caller_sets_train(code_root, spec.path, parts[-1])
    plan.evaluation = _evaluation_helper(module, code_root, spec.path)
    return plan


def _through_its_script(code_root: Path, target: str, config: Optional[dict], device: str) -> Optional[_Plan]:
    """When the runner's own plan for an unconfigured step function is skipped (the model its script assigns
    comes from a factory the runner cannot build, the script's data is not what the runner makes): the plan that
    runs the script's setup and its loop calling the step (``script_steps.calling_script_plan``); None when the
    step is configured, not a plain function of its file, or its file has no such loop."""
    spec = parse_target_spec(target)
    if config or spec is None or not spec.name or "." in spec.name or spec.name == SCRIPT_STEP:
        return None
    from gpu_runner.script_steps import calling_script_plan

    try:
        module = _import_step_file(code_root, spec.path)
        return calling_script_plan(code_root, target, spec.path, spec.name, module, device)
    except (StepSkip, BuildError):
        return None


def _trainer_builds_its_own_model(owner: type) -> bool:
    """``owner`` takes no model and makes one with an optimizer itself (``targets.trainer_builds_its_own_model``)."""
    from gpu_runner.targets import STEP_MODEL_ARGUMENTS, trainer_builds_its_own_model, trainer_optimizes_what_it_holds

    try:
        parameters = list(inspect.signature(owner.__init__).parameters)[1:]
    except (TypeError, ValueError):
        return False
    node = _class_statement(owner)
    return node is not None and not any(STEP_MODEL_ARGUMENTS.fullmatch(p.lower()) for p in parameters) \
        and (trainer_builds_its_own_model(node) or trainer_optimizes_what_it_holds(node))


def _is_script_step(code_root: Path, path: str, name: str) -> bool:
    """The module-level loop (``__main__``), or a function of the file that builds its own model and loops."""
    if name == SCRIPT_STEP:
        return True
    tree = ast.parse((code_root / path).read_text(errors="replace"))
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)
    return node is not None and builds_its_own_model(node, module_level_names(tree))


def _import_step_file(code_root: Path, path: str) -> types.ModuleType:
    """The step's file as a module, with stand-ins for packages used only inside functions. A script (a training
    loop or a ``main()`` call at module level), or a file whose import fails on its script part (data sets,
    ``parse_args()``), is imported as its definitions only: see ``_script_definitions``."""
    try:
        tree = ast.parse((code_root / path).read_text(errors="replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise StepSkip(f"{path} does not parse: {type(exc).__name__}: {_one_line(exc, 160)}") from None
    _script_folder_on_path(code_root, path)
    if not _runs_as_script(tree):
        try:
            module = import_with_stand_ins(code_root, path)  # torchvision, tqdm... used only inside functions
        except BuildError as exc:
            module = Skip(str(exc))
        if not isinstance(module, Skip):
            return module
        plain_failure = module.reason
    else:
        plain_failure = None
    _script_folder_on_path(code_root, path)  # again: the failed import may have left a sibling's namesake
    try:
        module = import_with_stand_ins(code_root, path, transform=_script_definitions)
    except BuildError as exc:
        module = Skip(str(exc))
    if isinstance(module, Skip):
        raise StepSkip(module.reason + (f" (imported whole, it failed too: {plain_failure})" if plain_failure else ""))
    build_module._IMPORT_NOTES.append(
        f"imported {path} as its definitions only (imports, functions, classes, assignments), without its script "
        "part" + (f", since importing it whole failed: {plain_failure}" if plain_failure else
                  " (a training loop or a main() call at module level)"))
    return module


def _script_folder_on_path(code_root: Path, path: str) -> None:
    """The step's folder first on ``sys.path``, as when its file runs as a script (``python sub/main.py``), so that
    ``from model import Net`` finds ``sub/model.py``; a same-named module imported earlier from another folder of
    the tree (another example's ``model.py``) is forgotten."""
    folder = (code_root / path).resolve().parent
    for earlier in _SCRIPT_FOLDERS:  # another step's folder would shadow this one's namespace packages
        while earlier in sys.path:
            sys.path.remove(earlier)
    _SCRIPT_FOLDERS.clear()
    if folder == code_root.resolve():
        return
    sys.path.insert(0, str(folder))
    _SCRIPT_FOLDERS.append(str(folder))
    for entry in folder.iterdir():
        name = entry.stem if entry.suffix == ".py" else entry.name if entry.is_dir() else None  # namespace packages too
        loaded = sys.modules.get(name) if name else None
        where = getattr(loaded, "__file__", None) if loaded is not None else None
        if where and str(Path(where).resolve()).startswith(str(code_root.resolve()) + "/") \
                and Path(where).resolve().parent not in (folder, entry.resolve()):
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                sys.modules.pop(key, None)


_SCRIPT_FOLDERS: list[str] = []  # the folder _script_folder_on_path put on sys.path


def _runs_as_script(tree: ast.Module) -> bool:
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in tree.body:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Name) and node.value.func.id in defined:
            return True
    return False


def _script_definitions(tree: ast.Module) -> ast.Module:
    """A file's definitions without its script: imports, functions, classes and assignments, each inside ``try``
    (one that raises leaves its names unset); what the step's runner provides itself (the model, the
    loader, the optimizer... by their names' roles) and ``parse_args()`` results are not assigned; loops,
    expressions, ``with`` blocks and the ``if __name__ == "__main__":`` block are left out."""

    def keep(statements: list) -> list:
        kept = []
        for node in statements:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                kept.append(node)  # must stay first, unguarded
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                kept.append(_guarded([node], reraise="ModuleNotFoundError"))  # a missing package: a stand-in
                # (a stand-in *used* by the module imported, MissingPackageError, leaves its names unset)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kept.append(_guarded([node]))  # a default or decorator may read what the script part set
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                kept.append(node)  # a docstring
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                parses_arguments = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                       and n.func.attr in ("parse_args", "parse_known_args")
                                       for n in ast.walk(node.value)) if node.value is not None else False
                if parses_arguments or any(role_of(n) in _PROVIDED_ROLES for n in names):
                    continue
                kept.append(_guarded([node]))
            elif isinstance(node, ast.Try):  # ``try: import apex`` / ``except ImportError: apex = None``
                body = keep(node.body)
                if body:
                    handlers = [ast.copy_location(ast.ExceptHandler(type=h.type, name=h.name,
                                                                    body=keep(h.body) or [ast.Pass()]), h)
                                for h in node.handlers]
                    finalbody = keep(node.finalbody)
                    if handlers or finalbody:
                        kept.append(ast.copy_location(ast.Try(body=body, handlers=handlers, orelse=keep(node.orelse),
                                                              finalbody=finalbody), node))
                    else:
                        kept.extend(body)
            elif isinstance(node, ast.If) and not _is_main_guard(node):
                body, orelse = keep(node.body), keep(node.orelse)
                if body or orelse:
                    kept.append(_guarded([ast.copy_location(ast.If(test=node.test, body=body or [ast.Pass()], orelse=orelse),
                                                            node)]))
        return kept

    return ast.Module(body=keep(tree.body), type_ignores=[])


_PROVIDED_ROLES = {"model", "loader", "optimizer", "criterion", "scheduler", "scaler", "logger"}


def _guarded(statements: list, reraise: Optional[str] = None) -> ast.Try:
    """``try: statements`` / ``except (Exception, SystemExit): pass``; ``reraise`` names an exception let through."""
    handlers = []
    if reraise:
        used_stand_in = ast.Compare(left=ast.Attribute(ast.Call(ast.Name("type", ast.Load()),
                                                                [ast.Name("__torchreview_error", ast.Load())], []),
                                                       "__name__", ast.Load()),
                                    ops=[ast.NotEq()], comparators=[ast.Constant(absent.MissingPackageError.__name__)])
        handlers.append(ast.ExceptHandler(type=ast.Name(reraise, ast.Load()), name="__torchreview_error",
                                          body=[ast.If(test=used_stand_in, body=[ast.Raise()], orelse=[])]))
    handlers.append(ast.ExceptHandler(type=ast.Tuple(elts=[ast.Name("Exception", ast.Load()),
                                                           ast.Name("SystemExit", ast.Load())], ctx=ast.Load()),
                                      name=None, body=[ast.Pass()]))
    node = ast.Try(body=statements, handlers=handlers, orelse=[], finalbody=[])
    return ast.copy_location(node, statements[0])


def _is_main_guard(node: ast.If) -> bool:
    test = node.test
    return isinstance(test, ast.Compare) and any(isinstance(n, ast.Name) and n.id == "__name__"
                                                 for n in ast.walk(test))


def _check_configured_arguments(function: Callable, given: dict, target: str) -> None:
    """``smoke.steps`` ``args`` must name parameters of the step: a typo is an error that says which exist."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return
    unknown = sorted(set(given) - {p.name for p in parameters})
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in parameters):
        raise BuildError(f"smoke.steps args of {target}: {function.__qualname__} has no parameter "
                         f"{', '.join(map(repr, unknown))} (its parameters: "
                         f"{', '.join(p.name for p in parameters)})")


def _subject(code_root: Path, model_target: str, options: dict, device: str, seed: int) -> Subject:
    subject = build_subject(code_root, model_target, device=device, config=options or None, seed=seed)
    if isinstance(subject, Skip):
        raise StepSkip(f"the model {model_target} cannot be built: {subject.reason}")
    return subject


def _function_span(function: Callable, code_root: Path, path: str) -> tuple[str, int, int]:
    try:
        lines, first = inspect.getsourcelines(function)
        return path, first, first + len(lines) - 1
    except (OSError, TypeError):
        return path, 1, 1


def _class_span(cls: type, code_root: Path, path: str) -> tuple[str, int, int]:
    return _function_span(cls, code_root, path)


def _model_for(code_root: Path, path: str, module: types.ModuleType) -> str:
    """The model a step function trains: the one its file defines, else the one it imports from the repository
    and constructs (or the only one it imports), else the one a file that uses the step defines or constructs."""
    source = (code_root / path).read_text(errors="replace")
    if find_targets({path: source}, {path: None}):
        chosen = _choose_model_in_file(code_root, path, [])
        if isinstance(chosen, Skip):
            raise StepSkip(f"{chosen.reason}; name the model in smoke.steps ({{step = ..., model = ...}})")
        return str(chosen)
    tree = ast.parse(source)
    found = _imported_model(code_root, path, tree) or _model_assigned_in(code_root, tree, module) \
        or _model_of_callers(code_root, path)
    if found is None:
        raise StepSkip(f"found no model for {path}: it neither defines an nn.Module nor constructs one it imports "
                       "from the repository, nor does a file that imports it; name it in smoke.steps "
                       "({step = ..., model = \"models/net.py:Net\"})")
    return found


def _imported_model(code_root: Path, path: str, tree: ast.Module) -> Optional[str]:
    """The model class ``path`` imports from the repository and constructs, else the only one it imports."""
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module is not None or node.level):
            base = Path(path).parent
            for _ in range(max(node.level - 1, 0)):
                base = base.parent
            # an absolute import: from the repository's root, or a script's sibling (its folder is on sys.path)
            bases = [base] if node.level else [Path(), base]
            candidates = [f"{relative}{suffix}" for folder in bases
                          for relative in [(folder / (node.module or "").replace(".", "/")).as_posix().lstrip("./")]
                          for suffix in (".py", "/__init__.py")]
            found = next((c for c in candidates if (code_root / c).is_file()), None)
            if found is not None:
                imported += [(alias.asname or alias.name, alias.name, found) for alias in node.names]
    models = []
    for local, name, file in imported:
        file_source = (code_root / file).read_text(errors="replace")
        if any(t.name == name for t in find_targets({file: file_source}, {file: None})):
            models.append((local in called, f"{file}:{name}"))
    constructed = [model for is_called, model in models if is_called]
    if constructed or len(models) == 1:  # the one it constructs, else the only one it imports
        return (constructed or [models[0][1]])[0]
    return None


MAX_CALLER_FILES = 400  # files read when looking for the users of a step's module


def _model_of_callers(code_root: Path, path: str) -> Optional[str]:
    """The model of a file that imports the step's module (``main.py`` defining ``Net`` and calling ``from train
    import train_epoch``; ``demo.py`` building ``Model(...)`` for ``from pkg.trainer import Trainer``): the model
    the step is given. Files beside the step's come first."""
    step_file = (code_root / path).resolve()
    dotted = module_name_for_path(path)
    names = {re.escape(step_file.stem), re.escape(dotted)}
    importing = re.compile(rf"^\s*(from\s+\.?({'|'.join(names)})\s+import|import\s+({'|'.join(names)})\b)", re.M)
    siblings = sorted(step_file.parent.glob("*.py"))
    others = sorted(p for p in code_root.rglob("*.py") if p.parent != step_file.parent
                    and not any(part.startswith(".") for part in p.relative_to(code_root).parts))
    for candidate in (siblings + others)[:MAX_CALLER_FILES]:
        if candidate == step_file:
            continue
        source = candidate.read_text(errors="replace")
        if not importing.search(source):
            continue
        relative = candidate.relative_to(code_root).as_posix()
        if find_targets({relative: source}, {relative: None}):
            chosen = _choose_model_in_file(code_root, relative, [])
            if not isinstance(chosen, Skip):
                return str(chosen)
            continue
        try:
            constructed = _imported_model(code_root, relative, ast.parse(source))
        except (SyntaxError, ValueError):
            continue
        if constructed is not None:
            return constructed
    return None


def _model_assigned_in(code_root: Path, tree: ast.Module, module: types.ModuleType) -> Optional[str]:
    """The model class (or factory) the file constructs into a model-named variable (``net = SimpleDLA()``,
    ``model = UNet(...).to(device)``, ``net = get_network(args)``), found through the imported module's namespace, so that star imports and a
    package's re-exports (``from unet import UNet``) lead to the file that defines it."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or not any(isinstance(t, ast.Name) and role_of(t.id) == "model"
                                                       for t in node.targets):
            continue
        call = node.value
        while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr in ("to", "cuda", "cpu", "float", "double", "half", "train"):
            call = call.func.value  # Net(...).to(device)
        if not isinstance(call, ast.Call):
            continue
        dotted = _dotted(call.func)
        value: Any = module
        for part in (dotted or "").split("."):
            value = getattr(value, part, None) if part else None
        if not (inspect.isclass(value) and issubclass(value, nn.Module) or inspect.isfunction(value)):
            continue  # a model class, or the repository's factory (``net = get_network(args)``)
        try:
            defined_in = Path(inspect.getsourcefile(value)).resolve().relative_to(code_root)
        except (TypeError, OSError, ValueError):
            continue  # a library's module: not the repository's model
        return f"{defined_in.as_posix()}:{value.__qualname__}"
    return None


def _caller_sets_train(code_root: Path, path: str, name: str) -> Optional[_Where]:
    """Where a caller of ``name`` in its file calls ``.train()`` just before it (in the same block): then the
    function need not set train mode itself."""
    try:
        tree = ast.parse((code_root / path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(body, list):
                continue
            for index, statement in enumerate(body):
                if not any(isinstance(n, ast.Call) and _called_name(n) == name for n in ast.walk(statement)):
                    continue
                for earlier in reversed(body[:index]):
                    if isinstance(earlier, ast.Expr) and isinstance(earlier.value, ast.Call) \
                            and _called_name(earlier.value) == "train" and not any(
                                isinstance(a, ast.Constant) and a.value is False for a in earlier.value.args):
                        line = earlier.lineno
                        return _Where(path, line, linecache.getline(str(code_root / path), line).strip())
                    if isinstance(earlier, ast.Expr) and isinstance(earlier.value, ast.Call) \
                            and _called_name(earlier.value) == "eval":
                        break
    return None


_MODULE_METHODS = {"eval", "train", "to", "cuda", "cpu", "parameters", "named_parameters", "requires_grad_",
                   "forward", "state_dict", "load_state_dict", "modules", "children", "zero_grad", "half", "float"}


def _backbone_for_probe(code_root: Path, function: Callable, model_target: str, notes: list) -> str:
    """For a linear probe (``_frozen_backbone_and_head``) whose step calls methods of its backbone that the model
    found for its file lacks (``backbone.get_features(x)``), the repository's model class that defines them all,
    where exactly one does; else ``model_target``."""
    probe = _frozen_backbone_and_head(function)
    node = _function_node(inspect.unwrap(function))
    if probe is None or node is None:
        return model_target
    methods = {n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and isinstance(n.func.value, ast.Name) and n.func.value.id == probe[0]} - _MODULE_METHODS
    if not methods:
        return model_target
    try:
        chosen = build_module.load_callable(code_root, model_target)
    except Exception:  # noqa: BLE001 - the model is built (and its failure reported) as before
        return model_target
    if all(hasattr(chosen, m) for m in methods):
        return model_target
    defining = []
    for path in sorted(code_root.rglob("*.py")):
        relative = path.relative_to(code_root).as_posix()
        if any(part.startswith(".") or part in ("tests", "test", "venv", ".venv", "site-packages")
               for part in relative.split("/")[:-1]) or len(defining) > 1:
            continue
        try:
            source = path.read_text(errors="replace")
            tree = ast.parse(source)
        except (OSError, SyntaxError, ValueError):
            continue
        classes = {c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                   and methods <= {f.name for f in c.body if isinstance(f, ast.FunctionDef)}}
        if classes:
            models = {t.name for t in find_targets({relative: source}, {relative: None})}
            defining += [f"{relative}:{name}" for name in sorted(classes & models)]
    if len(defining) != 1:
        return model_target
    notes.append(f"the step calls {', '.join(sorted(methods))} on its frozen '{probe[0]}', which {model_target} "
                 f"lacks: the backbone is {defining[0]}, the repository's model that defines "
                 + ("it" if len(methods) == 1 else "them"))
    return defining[0]


def _options_from_callers(code_root: Path, path: str, function: Callable, defaults: dict) -> dict:
    """``{parameter: value}`` for the parameters of ``function`` that have no role and no default and that a call
    in its file passes as a command-line option (``train(model, loader, args.n_last_blocks)``): the option's
    default, where it is a plain value (a number, a flag, a string) and every such call passes the same option."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
        tree = ast.parse((code_root / path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, TypeError):
        return {}
    wanted = {p.name: i for i, p in enumerate(parameters)
              if p.default is p.empty and role_of(p.name) is None and p.name.lower() not in CONFIG_NAMES
              and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not wanted:
        return {}
    seen: dict = {}
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function.__name__):
            continue
        passed = {parameters[i].name: a for i, a in enumerate(call.args[:len(parameters)])
                  if not isinstance(a, ast.Starred)}
        passed.update({k.arg: k.value for k in call.keywords if k.arg})
        for name in wanted:
            argument = passed.get(name)
            option = argument.attr if isinstance(argument, ast.Attribute) and isinstance(argument.value, ast.Name) \
                and argument.value.id.lower() in CONFIG_NAMES else None
            seen.setdefault(name, set()).add(option)
    values = {}
    for name, options in seen.items():
        option = next(iter(options)) if len(options) == 1 else None
        value = defaults.get(option) if option is not None else None
        if isinstance(value, (bool, int, float, str)):
            values[name] = value
    return values


def _called_name(call: ast.Call) -> Optional[str]:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _evaluation_helper(module: types.ModuleType, code_root: Path, path: str) -> Optional[tuple[Callable, _Where]]:
    """A function of the step's file named like an evaluation (``evaluate``, ``validate``, ``test``) that takes
    the model: the runner checks that it runs it in eval mode."""
    for name, value in vars(module).items():
        if not inspect.isfunction(value) or not _EVALUATION_NAMES.fullmatch(name):
            continue
        if getattr(value, "__module__", None) != module.__name__:
            continue
        names = list(inspect.signature(value).parameters)
        if any(role_of(n) == "model" for n in names):
            _, line, _ = _function_span(value, code_root, path)
            return value, _Where(path, line, linecache.getline(str(code_root / path), line).strip())
    return None
