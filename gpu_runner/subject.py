"""What the smoke checks run on: a built model, a way to make batches, and a loss.

``gpu_runner.build`` turns a target (a module class or factory in the PR's code) into a Subject;
``gpu_runner.checks`` runs the smoke checks on it. Both run inside the sandboxed child process.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

_OUT_OF_MEMORY = re.compile(r"can't allocate memory|out of memory|DefaultCPUAllocator|Cannot allocate memory", re.I)
# What a run stopped by the sandbox's memory limit says, wherever the allocation failed: the runner's limit, whoever
# asked for the memory, never a finding about the model nor a reason to configure it differently.
OUT_OF_MEMORY_REASON = "ran out of the runner's memory budget (smoke.memory; a runner limit, not a finding about the model)"


_PHASE_LISTENERS: list[Callable[[str], None]] = []


def phase(text: str) -> None:
    """Tells the harness what the current target is doing ("the overfit-batch check on batches of 2"), so that a
    target killed at the per-target timeout is reported with the phase that took the time."""
    for listener in _PHASE_LISTENERS:
        try:
            listener(text)
        except OSError:
            pass


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation the memory limit refused (host or device)."""
    import torch  # only the sandboxed child has torch; the App imports this module's types

    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and bool(_OUT_OF_MEMORY.search(str(exc))))


@dataclass
class Batch:
    """One batch: positional and keyword inputs for ``model(*args, **kwargs)`` and a target for the loss."""

    args: tuple
    kwargs: dict
    target: Any
    batch_size: int


@dataclass
class Subject:
    name: str  # "models/net.py:Net"
    model: Any  # torch.nn.Module, already on ``device``
    make_batch: Callable[[int, int], Batch]  # (batch_size, seed) -> Batch on ``device``
    loss_fn: Callable[[Any, Any], Any]  # (model output, target) -> scalar loss tensor
    task: str  # classification | language_model | regression | custom
    device: str
    num_classes: Optional[int] = None  # for the loss-at-init check (ln C)
    integer_inputs: bool = False  # token ids: leakage is checked through the first embedding
    graph: bool = False  # the batch's rows are the nodes of one graph (an adjacency input): rows mix by design
    notes: list[str] = field(default_factory=list)  # how it was built (guessed args, inferred input...)
    # configured layouts (smoke.targets' output / input batch_axis): the checks look at the selected output with
    # its batch axis moved first; per-row checks that cannot follow another input layout are skipped
    output_batch_axis: Optional[int] = 0  # None: the output has no batch axis
    output_select: Optional[Callable[[Any], Any]] = None
    inputs_batch_first: bool = True
    # the loss and its target are the runner's choice for the output it saw (no smoke task or loss configured): a
    # check that needs the objective to be learnable cannot judge a model whose output is not made to be trained on
    objective_guessed: bool = False
    # the inputs are the runner's guess (not configured, not the model's example_input_array): the model's code
    # raising on them says more about the guess than about the model, so it is undecided, never a FAIL
    inputs_guessed: bool = False
    # the same model on inputs of half the resolution / sequence length (its forward checked), or None at the floor:
    # what the time budget cuts after the batch and the steps (gpu_runner.checks)
    smaller: Optional[Callable[["Subject"], Optional["Subject"]]] = None


@dataclass
class CheckResult:
    name: str  # forward-contract, loss-at-init, gradients, params-change, overfit-batch, ...
    status: str  # pass | fail | skip | warn (a skip with details["undecided"]: the run could not tell)
    message: str  # one sentence a reviewer can act on
    details: dict = field(default_factory=dict)


@dataclass
class TargetReport:
    target: str
    status: str  # passed | failed | skipped | error
    checks: list[CheckResult] = field(default_factory=list)
    measures: dict = field(default_factory=dict)  # params, step_time_ms, peak_memory_bytes, loss_after_steps
    reason: str = ""  # for skipped/error: what happened and how to configure it
    notes: list[str] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)  # the timed steps behind measures["step_time_ms"]

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)
