"""TR411 log-one-plus-exp: torch.log(1 + torch.exp(x)) overflows; use F.softplus(x)."""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.names import render_name
from analyzers.rules.numerics._numerics_exact import (
    is_one as _is_one,
    single_argument as _single_argument,
    unwrap as _unwrap,
)


class LogOnePlusExp(Rule):
    id = "TR411"
    slug = "log-one-plus-exp"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "torch.log(1 + torch.exp(x)) overflows; use F.softplus(x)"
    what = """
        Flags `torch.log(1 + torch.exp(x))` and `torch.log1p(torch.exp(x))`, the hand-written
        softplus.
    """
    why = """
        `exp(x)` overflows to `inf` for `x > 88` in float32 (about 11 in float16), so the
        result is `inf` and its gradient NaN, although softplus(x) is just about `x` there.
        `F.softplus` switches to the linear form above a threshold and is exact below it.
        (Plain `log(1 + x)` for small `x` is left alone: whether `x` is small enough for
        `log1p` to matter cannot be seen from the code.)
    """
    example = """
        loss = torch.log(1 + torch.exp(-margin)).mean()
    """
    fix_example = """
        loss = F.softplus(-margin).mean()
    """
    VALID = [
        """
        import torch
        import torch.nn.functional as F
        loss = F.softplus(-margin).mean()
        y = torch.log(1.0 + coords.abs())
        """,
        """
        import torch
        import numpy as np
        y = np.log(1 + np.exp(x))
        z = torch.log(2 + torch.exp(x))
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = torch.log(1 + torch.exp(-margin)).mean()
            """,
            line=4, message="overflows",
            fixed="""
            import torch
            import torch.nn.functional as F
            loss = F.softplus(-margin).mean()
            """,
        ),
        Invalid(
            """
            import torch
            y = torch.log1p(torch.exp(scores))
            """,
            line=3, message="torch.nn.functional.softplus(scores)",
            fixed="""
            import torch
            y = torch.nn.functional.softplus(scores)
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("log", "log1p"):
            return
        qualified = ctx.qualified_name(func)
        inner = _single_argument(node)
        if inner is None or qualified not in ("torch.log", "torch.log1p"):
            return
        inner = _unwrap(inner)
        if qualified == "torch.log":
            if not isinstance(inner, cst.BinaryOperation) or not isinstance(inner.operator, cst.Add):
                return
            if _is_one(inner.left):
                inner = _unwrap(inner.right)
            elif _is_one(inner.right):
                inner = _unwrap(inner.left)
            else:
                return
        if not isinstance(inner, cst.Call) or ctx.qualified_name(inner.func) != "torch.exp":
            return
        x = _single_argument(inner)
        if x is None:
            return
        callee = render_name(ctx, "torch.nn.functional.softplus")
        replacement = node.with_changes(func=callee, args=[cst.Arg(_unwrap(x))]) if callee is not None else None
        instead = code_span(short(ctx, replacement)) if replacement is not None else "`F.softplus(x)`"
        self.report(node, f"{code_span(short(ctx, node))} overflows to inf once the exponent passes ~88 (float32), "
                          f"and its gradient turns NaN; use {instead}", replacement=replacement)
