"""TR414 hand-written-log1p-expm1: torch.log(1 + x) / torch.exp(x) - 1 in half-precision code lose small x; use
torch.log1p / torch.expm1.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.devices import computes_in_half_precision
from analyzers.program.flow import subtree
from analyzers.rules.base import Invalid, Rule, Valid
from analyzers.program.names import parenthesized
from analyzers.program.roles import is_test_code
from analyzers.program.values import tensor_operation_operand
from analyzers.rules.numerics._numerics_exact import (
    is_one as _is_one,
    single_argument as _single_argument,
    unwrap as _unwrap,
)


# What half-precision code is written with, as a cheap gate before the program is asked
# (devices.computes_in_half_precision): where `1 + x` rounds away anything below 5e-4 (float16) / 4e-3 (bfloat16).
_HALF_PRECISION = re.compile(r"bfloat16|float16|\bhalf\b|autocast|torch_dtype|precision|\bfp16|\bbf16")
# ``x`` that is a magnitude or a count: log(1 + |x|) compresses a range, and small values cannot be lost there.
_MAGNITUDES = {"abs", "arange", "numel", "long", "int", "count_nonzero", "bincount", "len", "size"}


def _other_than_one(expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """``x`` of ``1 + x`` / ``x + 1`` (one literal 1 and one other operand), else None."""
    expr = _unwrap(expr)
    if not isinstance(expr, cst.BinaryOperation) or not isinstance(expr.operator, cst.Add):
        return None
    if _is_one(expr.left) and not _is_one(expr.right):
        return _unwrap(expr.right)
    if _is_one(expr.right) and not _is_one(expr.left):
        return _unwrap(expr.left)
    return None


def _never_small(expr: cst.BaseExpression) -> bool:
    """A literal, or a magnitude / count (``x.abs()``, ``torch.arange(n)``, ``len(xs)``): no tiny values to lose."""
    if isinstance(expr, cst.UnaryOperation):
        return _never_small(expr.expression)
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary)):
        return True
    for node in subtree(expr):
        if isinstance(node, cst.Call):
            name = node.func.attr.value if isinstance(node.func, cst.Attribute) else \
                node.func.value if isinstance(node.func, cst.Name) else None
            if name in _MAGNITUDES:
                return True
    return False


class HandWrittenLog1pExpm1(Rule):
    id = "TR414"
    slug = "hand-written-log1p-expm1"
    category = Category.NUMERICS
    severity = Severity.LOW
    summary = "torch.log(1 + x) / torch.exp(x) - 1 in half-precision code lose small x; use torch.log1p / torch.expm1"
    # log/exp next to a literal 1, in a file that computes in float16 / bfloat16
    source_hint = (re.compile(r"\blog\b|\bexp\b"), _HALF_PRECISION)
    what = """
        Flags `torch.log(1 + x)` / `torch.log(x + 1)` / `(1 + x).log()` and `torch.exp(x) - 1` /
        `x.exp() - 1` on tensors (any import alias of `torch`) in a file that computes in half
        precision (`autocast`, `float16` / `bfloat16`, `.half()`, `torch_dtype=`). Left alone:
        `torch.log(1 + torch.exp(x))` (TR411's softplus), magnitudes and counts
        (`torch.log(1 + x.abs())`, `torch.log(1 + torch.arange(n))`: a range compression with no
        tiny values to lose), NumPy / `math`, tests (a reference formula mirrors the math on
        purpose), and float32-only files, where `1 + x` only drops values below 6e-8.
    """
    why = """
        `1 + x` is rounded to the tensor's precision before the log sees it: below about 5e-4
        in float16 and 4e-3 in bfloat16 `1 + x` is exactly 1, so `log(1 + x)` returns 0 instead
        of about `x`, and larger small values keep only two or three significant digits.
        `exp(x) - 1` cancels the same way. `torch.log1p(x)` and `torch.expm1(x)` compute the same
        functions without the rounding, for every `x`, in every dtype; the fix changes nothing else.
    """
    example = """
        with torch.autocast("cuda", dtype=torch.bfloat16):
            log_rate = torch.log(1 + rate)
            growth = torch.exp(log_growth) - 1
    """
    fix_example = """
        with torch.autocast("cuda", dtype=torch.bfloat16):
            log_rate = torch.log1p(rate)
            growth = torch.expm1(log_growth)
    """
    OPTIONS = {"any-precision": """
        `torch.log(1 + x)` and `torch.exp(x) - 1` are reported in any precision (float32 files too), at low
        severity, as TorchFix reported them.
    """}
    VALID = [
        """
        import torch
        import numpy as np
        import math
        model = model.to(torch.bfloat16)
        a = torch.log1p(rate)
        b = torch.expm1(z)
        c = torch.log(1 + torch.exp(x))  # softplus: TR411
        d = np.log(1 + counts)
        e = math.exp(t) - 1
        f = torch.log(2 + x)
        g = torch.log(1 + x + y)
        h = torch.log(torch.tensor(1 + 1e-3))
        i = torch.sign(coords) * torch.log(1.0 + coords.abs())
        j = torch.log(1 + torch.arange(n).float())
        """,
        # float32 only: 1 + x drops nothing above 6e-8
        """
        import torch
        log_rate = torch.log(1 + rate)
        """,
        # half precision only in a comment and a message: the code computes in float32
        """
        import torch
        # a float16 version of this would lose small rates; see the autocast notes
        log_rate = torch.log(1 + rate)
        print("no .half() here")
        """,
        # selected through TorchFix, in any precision: a magnitude still has no tiny values to lose
        Valid("""
        import torch
        j = torch.log(1 + torch.arange(n).float())
        k = torch.exp(x.abs()) - 1
        """, select=("TOR106", "TOR107")),
    ]
    INVALID = [
        # selected through TorchFix: float32 too
        Invalid(
            """
            import torch
            a = torch.randn(5)
            b = torch.log(a + 1.0)
            """,
            line=4, message="TOR106", select=("TOR106",),
            fixed="""
            import torch
            a = torch.randn(5)
            b = torch.log1p(a)
            """,
        ),
        Invalid(
            """
            import torch
            ret = (torch.exp(a) - 1) * scale
            """,
            line=3, message="TOR107", select=("TOR1",),
            fixed="""
            import torch
            ret = (torch.expm1(a)) * scale
            """,
        ),
        Invalid(
            """
            import torch
            with torch.autocast("cuda", dtype=torch.bfloat16):
                log_rate = torch.log(1 + rate)
            """,
            line=4, message="`torch.log(1 + rate)`",
            fixed="""
            import torch
            with torch.autocast("cuda", dtype=torch.bfloat16):
                log_rate = torch.log1p(rate)
            """,
        ),
        Invalid(
            """
            import torch as th
            def elu(x, alpha):
                return th.where(x > 0, x, alpha * (th.exp(x) - 1.0))
            model.half()
            """,
            line=4, message="th.expm1(x)",
            fixed="""
            import torch as th
            def elu(x, alpha):
                return th.where(x > 0, x, alpha * (th.expm1(x)))
            model.half()
            """,
        ),
        Invalid(
            """
            import torch
            def bonus(p, scale):
                damped = (p * scale + 1).log()
                return damped * (p.exp() - 1)
            x = torch.randn(8, dtype=torch.float16)
            """,
            line=4, count=2,
            fixed="""
            import torch
            def bonus(p, scale):
                damped = (p * scale).log1p()
                return damped * (p.exp() - 1)
            x = torch.randn(8, dtype=torch.float16)
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "log") and \
                not (isinstance(func, cst.Name) and func.value == "log"):
            return
        qualified = ctx.qualified_name(func)
        if qualified == "torch.log":
            argument = _single_argument(node)
            x = _other_than_one(argument) if argument is not None else None
            if x is None or _never_small(x) or tensor_operation_operand(_unwrap(x), ctx, "exp") is not None:
                return
            replacement = None
            if isinstance(func, cst.Attribute):  # keep the file's alias: ``th.log`` -> ``th.log1p``
                replacement = node.with_changes(func=func.with_changes(attr=cst.Name("log1p")), args=[cst.Arg(x)])
            self._report(node, replacement, "torch.log1p(x)", "`1 + x` rounds to exactly 1", ctx)
        elif qualified is None and isinstance(func, cst.Attribute) and func.attr.value == "log" and not node.args:
            x = _other_than_one(func.value)
            if x is None or _never_small(x) or tensor_operation_operand(_unwrap(x), ctx, "exp") is not None:
                return
            replacement = cst.Call(func=cst.Attribute(parenthesized(x), cst.Name("log1p")))  # ``(a * b).log1p()``
            self._report(node, replacement, "x.log1p()", "`1 + x` rounds to exactly 1", ctx)

    def visit_BinaryOperation(self, node: cst.BinaryOperation, ctx: FileContext) -> None:
        if not isinstance(node.operator, cst.Subtract) or not _is_one(node.right):
            return
        exp = _unwrap(node.left)
        if tensor_operation_operand(exp, ctx, "exp") is None:
            return
        assert isinstance(exp, cst.Call) and isinstance(exp.func, (cst.Attribute, cst.Name))
        replacement: Optional[cst.BaseExpression] = None
        if ctx.qualified_name(exp.func) == "torch.exp":
            x = _single_argument(exp)
            if x is None or _never_small(_unwrap(x)):
                return
            if isinstance(exp.func, cst.Attribute):
                replacement = cst.Call(func=exp.func.with_changes(attr=cst.Name("expm1")), args=[cst.Arg(_unwrap(x))])
            generic = "torch.expm1(x)"
        else:
            assert isinstance(exp.func, cst.Attribute)
            if _never_small(exp.func.value):
                return
            replacement = cst.Call(func=exp.func.with_changes(attr=cst.Name("expm1")))
            generic = "x.expm1()"
        self._report(node, replacement, generic, "`exp(x) - 1` cancels to 0", ctx)

    @classmethod
    def may_report_on(cls, source: str, options: frozenset[str] = frozenset()) -> bool:
        if "any-precision" in options:  # the half-precision evidence is not needed
            return cls.source_hint[0].search(source) is not None
        return super().may_report_on(source, options)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._half: Optional[bool] = None  # does the file compute in half precision: asked once, at the first site

    def _report(self, node: cst.CSTNode, replacement: Optional[cst.BaseExpression], generic: str, loss: str,
                ctx: FileContext) -> None:
        if is_test_code(ctx):
            return  # a test's reference formula mirrors the math on purpose
        instead = code_span(short(ctx, replacement)) if replacement is not None else code_span(generic)
        if self._half is None:
            self._half = computes_in_half_precision(ctx)
        if self._half:
            self.report(node, f"{code_span(short(ctx, node))} in half-precision code: {loss} when |x| is below ~5e-4 "
                              f"in float16 (4e-3 in bfloat16) and keeps only a few digits above; {instead} computes "
                              f"the same function without the rounding", replacement=replacement)
        elif "any-precision" in self.options:  # float32 too, as TorchFix's rule; low
            code = "TOR106" if "log1p" in generic else "TOR107"
            self.report(node, f"{code_span(short(ctx, node))}: {loss} when |x| is below ~6e-8 in float32 and keeps "
                              f"fewer digits of small x; {instead} computes the same function without the rounding "
                              f"(TorchFix's {code}, selected)", replacement=replacement, severity=Severity.LOW)
