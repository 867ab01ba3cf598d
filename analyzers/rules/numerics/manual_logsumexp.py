"""TR412 manual-logsumexp: log(sum(exp(x))) overflows; use torch.logsumexp."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, keyword_arg, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.values import is_maximum_of
from analyzers.program.names import render_name
from analyzers.rules.numerics._numerics_exact import single_argument as _single_argument, unwrap as _unwrap


_SUM = "torch.sum"


class ManualLogSumExp(Rule):
    id = "TR412"
    slug = "manual-logsumexp"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "log(sum(exp(x))) overflows; use torch.logsumexp"
    what = """
        Flags `torch.log(torch.sum(torch.exp(x), dim))`, `torch.log(torch.exp(x).sum(dim))` and
        `x.exp().sum(dim).log()`, and `torch.log(torch.exp(a) + torch.exp(b))`.
    """
    why = """
        `exp` overflows to `inf` for inputs above ~88 in float32 (~11 in float16), which logits
        and scores reach easily; the log then returns `inf` and the gradients NaN.
        `torch.logsumexp` / `torch.logaddexp` subtract the maximum first and give the same value
        without overflowing.
    """
    example = """
        log_z = torch.log(torch.sum(torch.exp(scores), dim=1))
    """
    fix_example = """
        log_z = torch.logsumexp(scores, dim=1)
    """
    VALID = [
        """
        import torch
        log_z = torch.logsumexp(scores, dim=1)
        both = torch.logaddexp(a, b)
        """,
        """
        import torch
        total = torch.sum(torch.exp(scores), dim=1)
        p = torch.exp(scores) / total
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            log_z = torch.log(torch.sum(torch.exp(scores), dim=1))
            """,
            line=3, message="torch.logsumexp(scores, dim=1)",
            fixed="""
            import torch
            log_z = torch.logsumexp(scores, dim=1)
            """,
        ),
        Invalid(
            """
            import torch
            lse = logits.exp().sum(-1).log()
            """,
            line=3,
            fixed="""
            import torch
            lse = logits.logsumexp(-1)
            """,
        ),
        Invalid(
            """
            import torch
            z = torch.log(torch.exp(a) + torch.exp(b))
            """,
            line=3, message="torch.logaddexp",
            fixed="""
            import torch
            z = torch.logaddexp(a, b)
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "log":
            return
        if ctx.qualified_name(func) == "torch.log":
            inner = _single_argument(node)
            if inner is None:
                return
            inner = _unwrap(inner)
            if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Add):
                a, b = self._exp_argument(inner.left, ctx), self._exp_argument(inner.right, ctx)
                if a is not None and b is not None:
                    callee = render_name(ctx, "torch.logaddexp")
                    replacement = node.with_changes(func=callee, args=[cst.Arg(a, comma=cst.Comma(
                        whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(b)]) if callee is not None else None
                    self._report(node, replacement, "torch.logaddexp(a, b)", ctx)
                return
            summed = self._summed_exp(inner, ctx)
            if summed is None:
                return
            x, dims = summed
            if self._shifted_by_its_maximum(x, ctx):
                return  # ``exp(x - x.max())``: the largest exponent is 0
            callee = render_name(ctx, "torch.logsumexp")
            replacement = None
            if callee is not None and dims:
                replacement = node.with_changes(func=callee, args=[cst.Arg(x, comma=cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))), *dims])
            self._report(node, replacement, "torch.logsumexp(x, dim)", ctx)
        elif ctx.qualified_name(func) is None and not node.args:
            summed = self._summed_exp(func.value, ctx, methods_only=True)
            if summed is None:
                return
            x, dims = summed
            if self._shifted_by_its_maximum(x, ctx):
                return
            replacement = cst.Call(func=cst.Attribute(x, cst.Name("logsumexp")), args=dims) if dims else None
            self._report(node, replacement, "x.logsumexp(dim)", ctx)

    @staticmethod
    def _shifted_by_its_maximum(x: cst.BaseExpression, ctx: FileContext) -> bool:
        x = _unwrap(x)
        return isinstance(x, cst.BinaryOperation) and isinstance(x.operator, cst.Subtract) and \
            is_maximum_of(x.right, x.left, ctx)

    def _report(self, node: cst.Call, replacement: Optional[cst.BaseExpression], generic: str,
                ctx: FileContext) -> None:
        instead = code_span(short(ctx, replacement)) if replacement is not None else code_span(generic)
        self.report(node, f"{code_span(short(ctx, node))} overflows to inf once an exponent passes ~88 (float32), "
                          f"making the result inf and the gradients NaN; use {instead}, which subtracts the maximum "
                          f"first", replacement=replacement)

    @staticmethod
    def _exp_argument(expr: cst.BaseExpression, ctx: FileContext,
                      methods_only: bool = False) -> Optional[cst.BaseExpression]:
        if not isinstance(expr, cst.Call) or not isinstance(expr.func, cst.Attribute) or \
                expr.func.attr.value != "exp":
            return None
        if ctx.qualified_name(expr.func) == "torch.exp" and not methods_only:
            return _single_argument(expr)
        if ctx.qualified_name(expr.func) is None and not expr.args:
            receiver = expr.func.value
            return receiver if dotted_name(receiver) is not None or isinstance(receiver, (cst.Call, cst.Subscript)) \
                else None
        return None

    def _summed_exp(self, expr: cst.BaseExpression, ctx: FileContext,
                    methods_only: bool = False) -> Optional[tuple[cst.BaseExpression, list[cst.Arg]]]:
        """``(x, dim args)`` for ``torch.sum(torch.exp(x), dims)`` / ``torch.exp(x).sum(dims)``."""
        if not isinstance(expr, cst.Call) or not isinstance(expr.func, cst.Attribute) or \
                expr.func.attr.value != "sum" or any(a.star for a in expr.args):
            return None
        if keyword_arg(expr, "dtype") is not None:
            return None
        qualified = ctx.qualified_name(expr.func)
        if qualified == _SUM and not methods_only:
            if not expr.args or expr.args[0].keyword is not None:
                return None
            x = self._exp_argument(expr.args[0].value, ctx)
            dims = list(expr.args[1:])
        elif qualified is None:
            x = self._exp_argument(expr.func.value, ctx, methods_only)
            dims = list(expr.args)
        else:
            return None
        if x is None:
            return None
        if dims:
            dims[-1] = dims[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return x, dims
