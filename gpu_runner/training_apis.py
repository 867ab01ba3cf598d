"""The training-loop helpers a script wraps its own loop in, when their packages are not installed on the runner:
Hugging Face ``accelerate``'s ``Accelerator`` as it behaves in one process, and Weights & Biases (``wandb``) as it
behaves with ``mode="disabled"``, so that the script's own loop runs and is checked instead of being skipped for the
package (issue 27, item 4). Used only while a script's step runs (``script_steps._script_environment``), only when
the package is absent, and said in the step's notes.

Only what the packages document, for the single process the runner is:

- ``Accelerator(...)`` (any options): ``prepare(*objects)`` returns its arguments (one object alone, several as a
  tuple), a model moved to the accelerator's ``device`` (the runner's) and a data loader's batches moved there
  as they are loaded; ``backward(loss, **kwargs)`` is ``loss.backward(**kwargs)`` (accelerate divides the loss by
  ``gradient_accumulation_steps``, which is 1 unless given: a given value divides it the same way);
  ``clip_grad_norm_`` / ``clip_grad_value_`` are torch's; ``autocast()``, ``accumulate(...)``,
  ``no_sync(...)``, ``main_process_first()`` and ``local_main_process_first()`` are empty contexts (one process,
  full precision, gradients synchronised at every step); ``gather`` / ``gather_for_metrics`` / ``reduce`` /
  ``pad_across_processes`` return what they are given (one process); ``unwrap_model`` returns the model;
  ``save`` is ``torch.save`` (in the script's scratch folder); ``print`` prints; ``wait_for_everyone``,
  ``init_trackers``, ``log``, ``end_training`` do nothing;
  ``is_main_process`` / ``is_local_main_process`` / ``is_last_process`` are true, ``num_processes`` 1,
  ``process_index`` / ``local_process_index`` 0, ``sync_gradients`` true, ``use_distributed`` false,
  ``mixed_precision`` ``"no"``, ``distributed_type`` ``"NO"``. Anything else of accelerate (``save_state``,
  ``accelerate.utils``...) is still the missing package, and the step is skipped naming it.
- TensorBoard's ``SummaryWriter`` (``torch.utils.tensorboard``, ``tensorboardX``) without the ``tensorboard`` /
  ``tensorboardX`` package: a writer whose methods (``add_scalar``, ``add_histogram``, ``flush``, ``close``...)
  write nothing and return None, as theirs return None; bound where the script's own import of it failed and
  left the name unset (``unset_writers``), and, for tensorboardX, made wherever the step's code (a helper module
  of the repository) calls the stand-in ``tensorboardX.SummaryWriter``.
- ``wandb``: ``init`` gives a disabled run, and its ``log``, ``finish``, ``watch``, ``config.update``,
  ``define_metric``, ``save``, ``alert``, ``login`` and the media types it logs (``Image``, ``Histogram``,
  ``Table``...) do nothing, as wandb documents for ``mode="disabled"`` ("all calls to the wandb API are no-ops").
  A value the script reads back from wandb (``wandb.config.lr``) is still the missing package.
"""
from __future__ import annotations

import contextlib
import importlib.util
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from gpu_runner import absent


def _missing(name: str) -> absent.MissingPackageError:
    top = name.split(".")[0]
    return absent.MissingPackageError(f"{name} is used, but the package '{top}' is not installed on the smoke "
                                      "runner (its single-process stand-in does not cover it)", name=top)


def _to(value: Any, device: torch.device) -> Any:
    """``value`` with its tensors on ``device`` (tuples, lists and dicts of them too), as accelerate's prepared
    data loaders give batches."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _to(v, device)) for k, v in value.items())
    return value


class _PreparedLoader:
    """A data loader ``Accelerator.prepare`` returned: the same batches, moved to the accelerator's device."""

    def __init__(self, loader: Any, device: torch.device):
        self._loader, self._device = loader, device

    def __iter__(self):
        for batch in self._loader:
            yield _to(batch, self._device)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._loader, name)


class Accelerator:
    """accelerate's ``Accelerator`` in one process (see the module's docstring)."""

    is_main_process = is_local_main_process = is_last_process = True
    num_processes = 1
    process_index = local_process_index = 0
    sync_gradients = True
    use_distributed = False
    mixed_precision = "no"
    distributed_type = "NO"

    def __init__(self, *args, device: Any = "cpu", used: Optional[list] = None, gradient_accumulation_steps: int = 1,
                 **kwargs):
        self.device = torch.device(device)
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self._used = used if used is not None else []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _missing(f"accelerate.Accelerator.{name}")

    def prepare(self, *objects, **kwargs):
        _note(self._used, "prepare")
        prepared = tuple(self._prepared(o) for o in objects)
        return prepared[0] if len(prepared) == 1 else prepared

    def _prepared(self, value: Any) -> Any:
        if isinstance(value, nn.Module):
            return value.to(self.device)
        if isinstance(value, torch.utils.data.DataLoader):
            return _PreparedLoader(value, self.device)
        return value  # optimizers, schedulers: accelerate wraps them to step as they do

    prepare_model = prepare_optimizer = prepare_scheduler = prepare
    prepare_data_loader = prepare

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        _note(self._used, "backward")
        if self.gradient_accumulation_steps != 1:
            loss = loss / self.gradient_accumulation_steps
        loss.backward(**kwargs)

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters, clip_value):
        return torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def autocast(self, *args, **kwargs):
        return contextlib.nullcontext()

    def accumulate(self, *models):
        return contextlib.nullcontext()

    no_sync = accumulate

    def main_process_first(self):
        return contextlib.nullcontext()

    local_main_process_first = main_process_first

    def gather(self, value):
        return value

    gather_for_metrics = gather

    def reduce(self, value, reduction: str = "sum", scale: float = 1.0):
        return value

    def pad_across_processes(self, value, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        return value

    def unwrap_model(self, model, *args, **kwargs):
        return model

    def save(self, obj, f, *args, **kwargs) -> None:
        torch.save(obj, f)

    def print(self, *args, **kwargs) -> None:
        print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        return None

    def init_trackers(self, *args, **kwargs) -> None:
        return None

    def log(self, *args, **kwargs) -> None:
        return None

    def end_training(self) -> None:
        return None


class DisabledRun:
    """What ``wandb.init(mode="disabled")`` returns: every call is a no-op (attributes are further no-ops, and an
    attribute set is kept, as ``run.name = ...``)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs):
        return self


_WANDB_CALLS = ("init", "log", "finish", "watch", "unwatch", "define_metric", "save", "alert", "login",
                "config.update", "config.setdefaults", "summary.update", "run.log", "run.finish", "run.watch",
                "run.config.update", "Image", "Histogram", "Table", "Video", "Audio", "Html", "Object3D", "Plotly",
                "plot.line", "plot.scatter", "plot.bar", "plot.histogram", "plot.confusion_matrix")


def substitutes(device: Any, used: list) -> dict[str, Callable]:
    """What each documented name the step may call is on the runner (full dotted names)."""
    def accelerator(*args, **kwargs):
        _note(used, "accelerate.Accelerator")
        kwargs.pop("device", None)
        return Accelerator(*args, device=device, used=used, **kwargs)

    def disabled(name: str) -> Callable:
        def call(*args, **kwargs):
            _note(used, f"wandb.{name}")
            return DisabledRun()
        return call

    def writer(*args, **kwargs):
        _note(used, "tensorboardX.SummaryWriter")
        return DisabledWriter(*args, **kwargs)

    table: dict[str, Callable] = {"accelerate.Accelerator": accelerator,
                                  "accelerate.accelerator.Accelerator": accelerator,
                                  "tensorboardX.SummaryWriter": writer, "tensorboardX.writer.SummaryWriter": writer}
    table.update({f"wandb.{name}": disabled(name) for name in _WANDB_CALLS})
    return table


class DisabledWriter:
    """TensorBoard's ``SummaryWriter`` writing nothing: every method returns None, as the writer's own do."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None

    def __enter__(self) -> "DisabledWriter":
        return self

    def __exit__(self, *exc_info) -> bool:
        return False


_WRITERS = {"torch.utils.tensorboard": "tensorboard", "torch.utils.tensorboard.writer": "tensorboard",
            "tensorboardX": "tensorboardX"}  # where SummaryWriter is imported from -> the package it needs


def unset_writers(tree: Any, namespace: dict) -> list[str]:
    """The local names a failed ``from torch.utils.tensorboard import SummaryWriter`` (or tensorboardX's) of the
    file left unset because the package is not installed: each bound to ``DisabledWriter`` in ``namespace``;
    returns them (the caller unbinds them after the step)."""
    import ast

    bound = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module not in _WRITERS \
                or importlib.util.find_spec(_WRITERS[node.module]) is not None:
            continue
        for alias in node.names:
            local = alias.asname or alias.name
            if alias.name == "SummaryWriter" and local not in namespace:
                namespace[local] = DisabledWriter
                bound.append(local)
    return bound


def _note(used: list, name: str) -> None:
    if name not in used:
        used.append(name)


PACKAGES = ("accelerate", "wandb", "tensorboardX")


@contextlib.contextmanager
def single_process_apis(device: Any, notes: list) -> Iterator[None]:
    """While a step runs: accelerate's ``Accelerator`` and wandb's logging, for those of the two packages that are
    not installed, are the ones above; each use is noted."""
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if not missing:
        yield
        return
    used: list[str] = []
    table = {k: v for k, v in substitutes(device, used).items() if k.split(".")[0] in missing}

    def substitute(name: str) -> Optional[Callable]:
        return table.get(name)

    with absent.stand_ins(missing), absent.substituted(substitute):
        try:
            yield
        finally:
            if any(n.startswith("accelerate") for n in used):
                methods = [n for n in used if "." not in n]
                notes.append("accelerate is not installed: the script's Accelerator ran as accelerate documents it in "
                             "one process (gpu_runner.training_apis: prepare returns what it is given, on the "
                             "runner's device; backward is loss.backward())"
                             + (f"; used: {', '.join(methods)}" if methods else ""))
            if "tensorboardX.SummaryWriter" in used:
                notes.append("tensorboardX is not installed: its SummaryWriter, made where the step's code imports "
                             "it, wrote nothing (gpu_runner.training_apis)")
            if any(n.startswith("wandb") for n in used):
                notes.append("wandb is not installed: its calls were no-ops, as with mode=\"disabled\" "
                             f"(gpu_runner.training_apis): {', '.join(n[6:] for n in used if n.startswith('wandb'))}")
