"""What TR116 and TR117 share.

Both rules collect small facts during the one walk (which parameters are frozen where, which modules are put in
train or eval mode, in what order) and decide in ``end_file``.
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext
from analyzers.program.library import method_returns_same_module
from analyzers.program.values import wrapped_module


def strip_chain(expr: cst.BaseExpression, ctx: FileContext) -> cst.BaseExpression:
    """``resnet50(...).to(device)`` / ``nn.DataParallel(net)``: the module under the moves and wrappers."""
    for _ in range(6):
        inner = wrapped_module(expr, ctx)
        if inner is None:
            break
        chained = isinstance(expr.func, cst.Attribute) and method_returns_same_module(expr.func.attr.value)
        # through a wrapper (DDP, compile), the name it wraps is followed to what built it
        expr = ctx.origin(inner) or inner if not chained and isinstance(inner, (cst.Name, cst.Attribute)) else inner
    return expr


def within(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or one of its submodules."""
    return path == prefix or path.startswith(prefix + ".")
