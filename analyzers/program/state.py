"""State at a point of the program: is autograd recording where a statement runs; what a value is outside
training."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import NO_GRAD_CONTEXTS, FileContext, argument, is_false, is_true
from analyzers.program.flow import assignment_before, call_site_values, parameter_index, runs_when_true, subtree


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


def _training_flag(test: cst.BaseExpression) -> Optional[bool]:
    """``self.training`` -> True, ``not self.training`` -> False; None for any other test."""
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    inner = test.expression if negated else test
    if isinstance(inner, cst.Attribute) and inner.attr.value == "training":
        return not negated
    return None


def _zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float)) and float(expr.value) == 0.0


def zero_unless_training(ctx: FileContext, expr: cst.BaseExpression, fn: Optional[cst.FunctionDef],
                         depth: int = 0) -> bool:
    """``expr`` (a dropout probability) is 0 whenever the module is not training: a zero literal,
    ``p if self.training else 0.0``, a local assigned zero under ``if not self.training`` (and anything in the
    training branch), or a parameter every call in this file passes such a value (``dropout_p`` of an attention
    helper whose caller zeroes it in eval)."""
    if _zero(expr):
        return True
    if isinstance(expr, cst.IfExp):
        flag = _training_flag(expr.test)
        return flag is not None and _zero(expr.orelse if flag else expr.body)
    if not isinstance(expr, cst.Name) or fn is None or depth > 2:
        return False
    if parameter_index(fn, expr.value) is not None:
        values = call_site_values(ctx, fn, expr.value)
        return bool(values) and all(zero_unless_training(
            ctx, value, next((a for a in ctx.ancestors(value) if isinstance(a, cst.FunctionDef)), None), depth + 1)
            for value in values)
    assigned = [node for node in subtree(fn.body) if isinstance(node, cst.Assign) and any(
        isinstance(t.target, cst.Name) and t.target.value == expr.value for t in node.targets)]
    for node in assigned:
        branch = next((a for a in ctx.ancestors(node) if isinstance(a, (cst.If, cst.FunctionDef))), None)
        flag = _training_flag(branch.test) if isinstance(branch, cst.If) else None
        if flag is not None and runs_when_true(branch, node, ctx):
            continue  # assigned where the module trains: any probability is fine there
        if not zero_unless_training(ctx, node.value, fn, depth + 1):
            return False
    return bool(assigned)


def _tests_cuda(ctx: FileContext, test: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``x.is_cuda``, or a name assigned from it (``on_gpu = x.is_cuda``)."""
    if isinstance(test, cst.Name):
        test = assignment_before(ctx, at, test.value) or test
    return isinstance(test, cst.Attribute) and test.attr.value == "is_cuda"


def runs_only_off_cuda(ctx: FileContext, node: cst.CSTNode) -> bool:
    """``node`` runs only when a tensor the code tested is not on CUDA: the ``else`` of ``if x.is_cuda:`` (or the
    body of ``if not x.is_cuda:``), in its own function. A CPU tensor made there meets CPU tensors."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(ancestor, cst.If):
            test = ancestor.test
            inner = test.expression if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) \
                else test
            if _tests_cuda(ctx, inner, ancestor) and not runs_when_true(ancestor, node, ctx):
                return True
    return False
