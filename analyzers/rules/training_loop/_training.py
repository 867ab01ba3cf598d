"""What TR101, TR102, TR103, TR104, TR105, TR106, TR107, TR108 and TR115 share.

Every rule here collects small facts while the engine walks the file (which loop a call sits
in, which function, what a name was last assigned from) and decides at ``end_file``. Loops are
identified by their node; a fact's "loop stack" is the tuple of ``for``/``while`` loops of the
same function that enclose it, outermost first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    call_receiver,
    dotted_name,
    iter_names,
    method_name,
    positional_args)
from analyzers.program.names import last_segment
from analyzers.program.roles import LightningClasses
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import (is_model_call, is_optimizer, is_scaler)


DETACHING_METHODS = {"item", "detach", "tolist", "numpy", "detach_"}
DETACHING_FUNCS = {"float", "int", "round", "len", "str", "bool"}
# tensor -> tensor methods that keep the autograd graph of their receiver
GRAPH_KEEPING_METHODS = {"mean", "sum", "cpu", "cuda", "to", "float", "double", "half", "clone", "squeeze",
                          "unsqueeze", "view", "reshape", "mul", "div", "add", "sub", "sqrt", "abs", "exp", "log",
                          "pow", "contiguous", "flatten", "norm", "max", "min"}
LOG_SINKS = {"print", "log", "info", "debug", "warning", "warn", "set_postfix", "set_postfix_str",
              "set_description", "add_scalar", "add_scalars", "log_metrics", "log_metric", "log_dict", "write",
              "append"}
SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}
RANK_HINTS = ("rank", "main", "master", "process_zero", "is_zero")


def is_loop_variable(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    name = dotted_name(expr)
    binding = ctx.binding(name) if name else None
    return binding is not None and binding.kind == "for"


def optimizer_keys(expr: cst.BaseExpression, ctx: FileContext) -> frozenset:
    """Names an optimizer may be referred to by: its own last segment and its alias's origin."""
    name = dotted_name(expr)
    keys = {last_segment(name)} if name else set()
    origin = ctx.origin(expr)
    if origin is not expr and isinstance(origin, (cst.Name, cst.Attribute)):
        keys.add(last_segment(dotted_name(origin)))
    return frozenset(k for k in keys if k)


@dataclass
class Step:
    node: cst.Call
    optimizer: cst.BaseExpression
    display: str
    keys: frozenset
    vague: bool  # a loop variable / subscript: cannot tell which optimizer
    has_args: bool  # ``opt.step(closure)``
    via_scaler: bool


def optimizer_step(call: cst.Call, ctx: FileContext) -> Optional[Step]:
    """``opt.step()`` or ``scaler.step(opt)`` (callers check the method name is "step" first)."""
    receiver = call_receiver(call)
    if receiver is None:
        return None
    if is_scaler(receiver, ctx):
        args = positional_args(call)
        target = args[0].value if args else argument(call, 0, "optimizer")
        if target is None:
            return None
        name = dotted_name(target)
        return Step(call, target, name or "optimizer", optimizer_keys(target, ctx) if name else frozenset(),
                     name is None or is_loop_variable(target, ctx), False, True)
    if not is_optimizer(receiver, ctx):
        return None
    name = dotted_name(receiver) or "optimizer"
    return Step(call, receiver, name, optimizer_keys(receiver, ctx), is_loop_variable(receiver, ctx), bool(call.args), False)


def is_criterion_call(call: cst.Call, ctx: FileContext) -> bool:
    """A loss computation: ``criterion(out, y)``, ``F.cross_entropy(...)``, ``nn.MSELoss()(...)``."""
    name = dotted_name(call.func)
    if name is not None:
        last = last_segment(name).lower()
        if "loss" in last or "criterion" in last:
            return True
        qualified = ctx.qualified_name(call.func) or ""
        if qualified.startswith("torch.nn.functional.") and (
                "loss" in qualified or "entropy" in qualified or qualified.endswith(("kl_div", "margin_ranking"))):
            return True
    origin = ctx.origin(call.func)
    if isinstance(origin, cst.Call):
        qualified = ctx.call_name(origin) or ""
        if qualified.startswith("torch.nn.") and qualified.endswith("Loss"):
            return True
    return False


def value_kind(value: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> Optional[str]:
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
            inner = expr_kind(receiver, ctx, depth + 1)
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
            return expr_kind(args[0].value, ctx, depth + 1) if args else None
        return None
    if isinstance(value, cst.BinaryOperation):
        return expr_kind(value.left, ctx, depth + 1) or expr_kind(value.right, ctx, depth + 1)
    if isinstance(value, cst.UnaryOperation):
        return expr_kind(value.expression, ctx, depth + 1)
    if isinstance(value, (cst.Name, cst.Attribute)):
        return expr_kind(value, ctx, depth + 1)
    if isinstance(value, cst.Subscript):
        return value_kind(value.value, ctx, depth + 1)
    return None


def expr_kind(expr: cst.BaseExpression, ctx: FileContext, depth: int = 0) -> Optional[str]:
    """Like :func:`_value_kind` for an expression read now (names resolved through bindings)."""
    if depth > 4:
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return value_kind(expr, ctx, depth)
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("data", "grad"):
        return None
    name = dotted_name(expr)
    if name is None:
        # ``model(x).loss``
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            return "loss" if value_kind(expr.value, ctx, depth + 1) else None
        return None
    binding = ctx.binding(name)
    if binding is None:
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            # ``outputs.loss`` with ``outputs = model(**batch)``
            return "loss" if expr_kind(expr.value, ctx, depth + 1) else None
        return None
    if in_no_grad_block(ctx, binding.node):
        return None
    if binding.kind in ("assign", "annassign", "walrus"):
        if binding.value is None:
            # ``logits, loss = model(x, y)``: tuple unpacking of a model/criterion call
            node = binding.node
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and "loss" in last_segment(name).lower():
                return "loss" if value_kind(node.value, ctx, depth + 1) else None
            return None
        if binding.value is expr:
            return None
        return value_kind(binding.value, ctx, depth + 1)
    if binding.kind == "augassign" and isinstance(binding.node, cst.AugAssign):
        kind = value_kind(binding.node.value, ctx, depth + 1)
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


def is_rank_test(test: cst.BaseExpression) -> bool:
    return any(any(h in n.lower() for h in RANK_HINTS) for n in iter_names(test))


def guard_between(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext, *, except_handlers: bool = False) -> bool:
    """An ``if`` (other than a rank check) or, optionally, an ``except`` between ``node`` and ``loop``."""
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.If) and not is_rank_test(ancestor.test):
            return True
        if isinstance(ancestor, cst.IfExp):
            return True
        if except_handlers and isinstance(ancestor, (cst.ExceptHandler, cst.ExceptStarHandler)):
            return True
    return False


def lightning_classes(ctx: FileContext) -> set:
    return ctx.facts(LightningClasses).names


def in_lightning(ctx: FileContext) -> bool:
    if not ctx.classes:
        return False
    lightning = lightning_classes(ctx)
    for cls in ctx.classes:
        if cls.name.value in lightning:
            return True
        for base in ctx.class_bases(cls):
            if last_segment(base) == "LightningModule":
                return True
    return False


def enclosing_function_name(ctx: FileContext) -> Optional[str]:
    fn = ctx.function_def
    return fn.name.value if fn is not None else None


def closure(direct: set, calls: dict) -> set:
    """Functions (by name) that do something directly or call one that does, transitively."""
    result = set(direct)
    changed = True
    while changed:
        changed = False
        for fn, called in calls.items():
            if fn not in result and called & result:
                result.add(fn)
                changed = True
    return result
