"""Which values carry an autograd graph: a loss or a model's output still attached to the parameters it was
computed from (kept alive by whoever holds it), and which expressions cut it off (``.item()``, ``.detach()``,
``float(...)``)."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, call_receiver, dotted_name, method_name, positional_args
from analyzers.program.names import last_segment
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import called_object, is_model_call

DETACHING_METHODS = {"item", "detach", "tolist", "numpy", "detach_"}
DETACHING_FUNCS = {"float", "int", "round", "len", "str", "bool"}
# tensor -> tensor methods that keep the autograd graph of their receiver
GRAPH_KEEPING_METHODS = {"mean", "sum", "cpu", "cuda", "to", "float", "double", "half", "clone", "squeeze",
                          "unsqueeze", "view", "reshape", "mul", "div", "add", "sub", "sqrt", "abs", "exp", "log",
                          "pow", "contiguous", "flatten", "norm", "max", "min"}


def is_criterion_call(call: cst.Call, ctx: FileContext) -> bool:
    """A loss computation: ``criterion(out, y)``, ``F.cross_entropy(...)``, ``nn.MSELoss()(...)``, also called
    through an explicit ``criterion.forward(out, y)``."""
    func = called_object(call.func)
    name = dotted_name(func)
    if name is not None:
        last = last_segment(name).lower()
        if "loss" in last or "criterion" in last:
            return True
        qualified = ctx.qualified_name(func) or ""
        if qualified.startswith("torch.nn.functional.") and (
                "loss" in qualified or "entropy" in qualified or qualified.endswith(("kl_div", "margin_ranking"))):
            return True
    origin = ctx.origin(func)
    if isinstance(origin, cst.Call):
        qualified = ctx.call_name(origin) or ""
        if qualified.startswith("torch.nn.") and qualified.endswith("Loss"):
            return True
    return False


def graph_kind(value: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> Optional[str]:
    """"loss" / "model" when ``value`` evaluates to a tensor that carries an autograd graph."""
    if value is None or depth > 4:
        return None
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Name) and func.value in DETACHING_FUNCS:
            return None
        method = method_name(value)
        receiver = call_receiver(value)
        if receiver is not None and method in DETACHING_METHODS:
            return None
        if receiver is not None and method in GRAPH_KEEPING_METHODS:
            inner = graph_kind_read(receiver, ctx, depth + 1)
            if inner is not None:
                return inner
            if ctx.qualified_name(receiver) != "torch":
                return None
        if is_criterion_call(value, ctx):
            return "loss"
        if is_model_call(func, ctx):
            return "model"
        qualified = ctx.qualified_name(func) or ""
        if qualified in ("torch.mean", "torch.sum", "torch.stack", "torch.cat"):
            args = positional_args(value)
            return graph_kind_read(args[0].value, ctx, depth + 1) if args else None
        return None
    if isinstance(value, cst.BinaryOperation):
        return graph_kind_read(value.left, ctx, depth + 1) or graph_kind_read(value.right, ctx, depth + 1)
    if isinstance(value, cst.UnaryOperation):
        return graph_kind_read(value.expression, ctx, depth + 1)
    if isinstance(value, (cst.Name, cst.Attribute)):
        return graph_kind_read(value, ctx, depth + 1)
    if isinstance(value, cst.Subscript):
        return graph_kind(value.value, ctx, depth + 1)
    return None


def graph_kind_read(expr: cst.BaseExpression, ctx: FileContext, depth: int = 0) -> Optional[str]:
    """Like :func:`graph_kind` for an expression read now (names resolved through bindings)."""
    if depth > 4:
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return graph_kind(expr, ctx, depth)
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("data", "grad"):
        return None
    name = dotted_name(expr)
    if name is None:
        # ``model(x).loss``
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            return "loss" if graph_kind(expr.value, ctx, depth + 1) else None
        return None
    binding = ctx.binding(name)
    if binding is None:
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            # ``outputs.loss`` with ``outputs = model(**batch)``
            return "loss" if graph_kind_read(expr.value, ctx, depth + 1) else None
        return None
    if in_no_grad_block(ctx, binding.node):
        return None
    if binding.kind in ("assign", "annassign", "walrus"):
        if binding.value is None:
            # ``logits, loss = model(x, y)``: tuple unpacking of a model/criterion call
            node = binding.node
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and "loss" in last_segment(name).lower():
                return "loss" if graph_kind(node.value, ctx, depth + 1) else None
            return None
        if binding.value is expr:
            return None
        return graph_kind(binding.value, ctx, depth + 1)
    if binding.kind == "augassign" and isinstance(binding.node, cst.AugAssign):
        kind = graph_kind(binding.node.value, ctx, depth + 1)
        if kind is not None:
            return kind
        return "loss" if "loss" in last_segment(name).lower() and not detached_value(binding.node.value) else None
    return None


def detached_value(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Name) and value.func.value in DETACHING_FUNCS:
            return True
        return method_name(value) in DETACHING_METHODS and call_receiver(value) is not None
    return isinstance(value, (cst.Integer, cst.Float))


