"""What a file does with mixed-precision loss scaling: the scaled backwards, the scaler's steps and updates, unscaling
and gradient clipping, each with its function, collected once per file (``ctx.facts(AmpFacts)``)."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, method_name
from analyzers.program.library import Does, training_libraries_that
from analyzers.program.values import is_optimizer, is_plain_backward, is_scaler


CLIP = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value"}


def scaled_backward(call: cst.Call) -> Optional[str]:
    """``scaler`` for ``scaler.scale(loss).backward()``."""
    if not is_plain_backward(call):
        return None
    inner = call.func.value
    if isinstance(inner, cst.Call) and method_name(inner) == "scale" and isinstance(inner.func, cst.Attribute):
        return dotted_name(inner.func.value)
    return None


class AmpFacts:
    """What a file does with GradScaler: collected by the AMP rules' shared visitor, once per file
    (any of them enabled feeds it the file's calls in order)."""

    def __init__(self, ctx: FileContext) -> None:
        self.scaled_backwards: list[tuple[cst.Call, str, object]] = []  # call, scaler, function
        self.scaler_steps: list[tuple[cst.Call, str, object]] = []
        self.scaler_updates: set[str] = set()
        self.unscales: set[object] = set()  # functions calling ``unscale_`` (None: module level)
        self.any_unscale = False
        self.any_scaler = False  # GradScaler built or a ``scale(...)`` used anywhere
        self.plain_steps: list[tuple[cst.Call, str, object]] = []
        self.clips: list[tuple[cst.Call, object]] = []
        self.backwards: list[tuple[cst.Call, object]] = []
        self.order: dict[int, int] = {}  # id(call) -> visit order, for "the backward before this clip"
        self._seen: set[int] = set()

    def note(self, node: cst.Call, ctx: FileContext) -> None:
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        self.order[id(node)] = len(self.order)
        fn = ctx.function
        name = method_name(node)
        qualified = ctx.call_name(node) or ""
        if qualified.endswith("GradScaler") or (dotted_name(node.func) or "").endswith("GradScaler"):
            self.any_scaler = True
        if is_plain_backward(node):
            self.backwards.append((node, fn))
            scaler = scaled_backward(node)
            if scaler is not None:
                self.any_scaler = True
                self.scaled_backwards.append((node, scaler, fn))
        elif name == "scale" and isinstance(node.func, cst.Attribute):
            self.any_scaler = True
        elif name == "step" and isinstance(node.func, cst.Attribute):
            receiver = dotted_name(node.func.value)
            if is_scaler(node.func.value, ctx):
                self.scaler_steps.append((node, receiver, fn))
            elif receiver is not None and is_optimizer(node.func.value, ctx) and not node.args:
                self.plain_steps.append((node, receiver, fn))
        elif name == "update" and isinstance(node.func, cst.Attribute):
            receiver = dotted_name(node.func.value)
            if receiver is not None and is_scaler(node.func.value, ctx):
                self.scaler_updates.add(receiver.rsplit(".", 1)[-1])
        elif name == "unscale_":
            self.unscales.add(fn)
            self.any_unscale = True
        elif name in CLIP and ("clip_grad" in qualified or "utils" in (dotted_name(node.func) or "")
                                or isinstance(node.func, cst.Name)):
            self.clips.append((node, fn))


def library_scales_loss(ctx: FileContext) -> bool:
    """The file imports a training library whose mixed precision scales the loss itself (Lightning, Accelerate)."""
    return any(ctx.imports.imports_root(lib) for lib in training_libraries_that(Does.SCALES_LOSS))
