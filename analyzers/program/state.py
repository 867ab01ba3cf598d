"""State at a point of the program: is autograd recording where a statement runs."""
from __future__ import annotations

import libcst as cst

from analyzers.context import NO_GRAD_CONTEXTS, FileContext, argument, is_false, is_true


def turns_grad_off(call_or_name: cst.BaseExpression, ctx: FileContext) -> bool:
    """``torch.no_grad()``, ``torch.inference_mode()``, ``torch.set_grad_enabled(False)`` (as a ``with`` item);
    not ``set_grad_enabled(True)`` nor ``inference_mode(False)``."""
    call = call_or_name if isinstance(call_or_name, cst.Call) else None
    name = ctx.qualified_name(call.func if call is not None else call_or_name)
    if name not in NO_GRAD_CONTEXTS:
        return False
    if call is None:
        return True
    mode = argument(call, 0, "mode")
    if name == "torch.set_grad_enabled":
        return not is_true(mode)
    return not (name.endswith("inference_mode") and is_false(mode))


def enters_grad_off(call: cst.Call, ctx: FileContext) -> bool:
    """A statement that turns autograd off for the code after it, without a ``with`` block: a no-grad context
    entered by hand (``torch.no_grad().__enter__()``, ``torch.inference_mode().__enter__()``)."""
    func = call.func
    return (isinstance(func, cst.Attribute) and func.attr.value == "__enter__" and isinstance(func.value, cst.Call)
            and isinstance(ctx.parent(call), cst.Expr) and turns_grad_off(func.value, ctx))


def in_no_grad_block(ctx: FileContext, node: cst.CSTNode) -> bool:
    """``node`` runs inside a ``with`` block that turns autograd off, in its own function (a ``with`` around a
    ``def`` does not hold when the function is called later)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(ancestor, cst.With) and any(turns_grad_off(item.item, ctx) for item in ancestor.items):
            return True
    return False
