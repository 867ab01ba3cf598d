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
    positional_args)
from analyzers.program.names import last_segment
from analyzers.program.ranks import is_rank_test
from analyzers.program.values import (is_optimizer, is_scaler)


LOG_SINKS = {"print", "log", "info", "debug", "warning", "warn", "set_postfix", "set_postfix_str",
              "set_description", "add_scalar", "add_scalars", "log_metrics", "log_metric", "log_dict", "write",
              "append"}
SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}


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


def guard_between(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext, *, except_handlers: bool = False) -> bool:
    """An ``if`` (other than a rank check) or, optionally, an ``except`` between ``node`` and ``loop``."""
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.If) and not is_rank_test(ancestor.test, ctx):
            return True
        if isinstance(ancestor, cst.IfExp):
            return True
        if except_handlers and isinstance(ancestor, (cst.ExceptHandler, cst.ExceptStarHandler)):
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
