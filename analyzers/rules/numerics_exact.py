"""Numerics that have an exact, stable spelling: NaN comparisons, softplus, logsumexp, integer ratios."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, keyword_arg, local_name_for, short, string_value
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule, Valid
from analyzers.program.names import parenthesized, render_name
from analyzers.program.roles import is_test_code

_NAN_ATTRIBUTES = {"math.nan": "math", "numpy.nan": "numpy", "numpy.NaN": "numpy", "numpy.NAN": "numpy",
                   "torch.nan": "torch"}


def _nan_source(expr: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """``torch`` / ``numpy`` / ``math`` / ``float`` when ``expr`` is a NaN constant, else None."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "float" and \
            len(expr.args) == 1 and ctx.binding("float") is None:
        text = string_value(expr.args[0].value)
        if text is not None and text.strip().lower() in ("nan", "+nan", "-nan"):
            return "float"
        return None
    if isinstance(expr, (cst.Attribute, cst.Name)):
        return _NAN_ATTRIBUTES.get(ctx.qualified_name(expr) or "")
    return None


class NanEqualityComparison(Rule):
    id = "TR410"
    slug = "nan-equality-comparison"
    category = Category.NUMERICS
    severity = Severity.HIGH
    summary = "x == float('nan') is always False (and != always True); use isnan"
    what = """
        Flags `==` and `!=` comparisons against a NaN constant: `float("nan")`, `math.nan`,
        `np.nan` and `torch.nan`.
    """
    why = """
        NaN compares unequal to everything, itself included: `x == np.nan` is False for every
        `x` (elementwise too), and `x != np.nan` always True. A NaN check written this way never
        fires, so the NaN loss or the missing value it was meant to catch goes through.
    """
    example = """
        if loss == float("nan"):
            raise RuntimeError("diverged")
        mask = values != torch.nan
    """
    fix_example = """
        if math.isnan(loss):
            raise RuntimeError("diverged")
        mask = ~torch.isnan(values)
    """
    VALID = [
        """
        import torch
        import math
        if math.isnan(loss):
            pass
        mask = ~torch.isnan(values)
        """,
        """
        import torch
        import numpy as np
        x = np.full(3, np.nan)
        if value == float("inf"):
            pass
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            mask = values != torch.nan
            """,
            line=3, message="`values != torch.nan` is always True",
            fixed="""
            import torch
            mask = ~torch.isnan(values)
            """,
        ),
        Invalid(
            """
            import math
            import torch
            if loss.item() == float("nan"):
                raise RuntimeError("diverged")
            """,
            line=4, message="always False",
            fixed="""
            import math
            import torch
            if math.isnan(loss.item()):
                raise RuntimeError("diverged")
            """,
        ),
        Invalid(
            """
            import numpy as np
            import torch
            bad = df[df["score"] == np.nan]
            """,
            line=4,
            fixed="""
            import numpy as np
            import torch
            bad = df[np.isnan(df["score"])]
            """,
        ),
    ]

    def visit_Comparison(self, node: cst.Comparison, ctx: FileContext) -> None:
        left = node.left
        for target in node.comparisons:
            equal = isinstance(target.operator, cst.Equal)
            if equal or isinstance(target.operator, cst.NotEqual):
                source = _nan_source(target.comparator, ctx)
                other = left
                if source is None:
                    source, other = _nan_source(left, ctx), target.comparator
                if source is not None:
                    replacement = self._fix(node, other, source, equal, ctx) if len(node.comparisons) == 1 else None
                    answer = "False" if equal else "True"
                    check = "~torch.isnan(x)" if not equal else "torch.isnan(x)"
                    suggestion = code_span(short(ctx, replacement)) if replacement is not None else \
                        f"`math.isnan(x)` / `{check}`"
                    self.report(node, f"{code_span(short(ctx, node))} is always {answer}: NaN is unequal to everything, "
                                      f"itself included; use {suggestion}", replacement=replacement)
                    return
            left = target.comparator

    @staticmethod
    def _fix(node: cst.Comparison, other: cst.BaseExpression, source: str, equal: bool,
             ctx: FileContext) -> Optional[cst.BaseExpression]:
        module = {"float": "math"}.get(source, source)
        local = local_name_for(ctx, module)
        if local is None:
            return None
        if module == "math" and not equal:
            return None  # `not math.isnan(x)` may need parentheses where it lands
        call = cst.Call(func=cst.Attribute(cst.Name(local), cst.Name("isnan")),
                        args=[cst.Arg(other.with_changes(lpar=[], rpar=[]) if other.lpar else other)])
        result: cst.BaseExpression = call if equal else cst.UnaryOperation(cst.BitInvert(), call)
        return result


# ---------------------------------------------------------------------------------------------
# TR411 / TR412

def _is_one(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Integer):
        return expr.value == "1"
    if isinstance(expr, cst.Float):
        try:
            return float(expr.value) == 1.0
        except ValueError:
            return False
    return False


def _single_argument(call: cst.Call) -> Optional[cst.BaseExpression]:
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    return call.args[0].value


def _unwrap(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.with_changes(lpar=[], rpar=[]) if getattr(expr, "lpar", None) else expr


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
            replacement = cst.Call(func=cst.Attribute(x, cst.Name("logsumexp")), args=dims) if dims else None
            self._report(node, replacement, "x.logsumexp(dim)", ctx)

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


# ---------------------------------------------------------------------------------------------
# TR413

_COMPARISONS = (cst.Equal, cst.NotEqual, cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual)
_COUNT_KEEPING = {"cpu", "cuda", "squeeze", "view", "reshape", "detach", "long", "int", "to"}
_TRUE_DIVISION = (1, 7)  # torch 1.7 made ``/`` on integer tensors a true division (1.6 raised, before floor-divided)


def _is_comparison(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Comparison):
        return all(isinstance(target.operator, _COMPARISONS) for target in expr.comparisons)
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in (
        "eq", "ne", "lt", "gt", "le", "ge")


def _is_count(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """An integer tensor counting matches: ``(pred == y).sum()``, ``torch.sum(a == b)``, ``pred.eq(y).sum()``."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in _COUNT_KEEPING and not expr.args:
        expr = expr.func.value
    while isinstance(expr, cst.Attribute) and expr.attr.value == "data":
        expr = expr.value
    if not isinstance(expr, cst.Call) or keyword_arg(expr, "dtype") is not None:
        return False
    if ctx.qualified_name(expr.func) in ("torch.sum", "torch.count_nonzero"):
        return bool(expr.args) and _is_comparison(expr.args[0].value)
    return isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("sum", "count_nonzero") and \
        ctx.qualified_name(expr.func) is None and _is_comparison(expr.func.value)


class IntegerTensorRatio(Rule):
    id = "TR413"
    source_hint = re.compile(r"sum|count_nonzero")  # matches are counted
    slug = "integer-tensor-ratio"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "a count of matches (an integer tensor) divided with / on a torch that floor-divides integers"
    what = """
        Flags `correct / total` where `correct` is an integer tensor counting matches
        (`(pred == y).sum()`, `torch.sum(pred == y)`, `pred.eq(y).sum()`, or a variable that
        only ever accumulates such counts), in a repository that pins PyTorch below 1.7
        (`requirements*.txt`, `setup.py`, `environment.yml`...). Unpinned code is left alone:
        since 1.7, `/` is a true division.
    """
    why = """
        Before PyTorch 1.5, `/` between integer tensors floor-divides: the accuracy
        `correct / total` is 0 until every sample is right (and `100. * correct / total` drops
        the fraction too, since the float scalar is cast to the tensor's integer type). 1.5 only
        warns, and 1.6 raises a RuntimeError instead.
    """
    example = """
        correct += (pred == target).sum()
        accuracy = 100. * correct / len(loader.dataset)
    """
    fix_example = """
        correct += (pred == target).sum().item()
        accuracy = 100. * correct / len(loader.dataset)
    """
    VALID = [
        Valid("""
            import torch
            correct = (pred == target).sum()
            accuracy = correct / len(target)
            """, requirements="torch>=1.8\n"),
        Valid("""
            import torch
            correct = 0
            correct += (pred == target).sum().item()
            accuracy = correct / total
            rate = (pred == target).float().sum() / total
            """, requirements="torch==1.4.0\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def test(model, loader):
                correct = 0
                for data, target in loader:
                    pred = model(data).argmax(dim=1)
                    correct += pred.eq(target.view_as(pred)).sum()
                return 100. * correct / len(loader.dataset)
            """,
            requirements="torch==1.4.0\ntorchvision==0.5.0\n",
            line=8, message="`correct`",
        ),
        Invalid(
            """
            import torch as T
            acc = T.sum(preds == labels) / labels.size(0)
            """,
            requirements="torch==1.6.0\n",
            line=3, message="RuntimeError",
        ),
    ]

    def visit_BinaryOperation(self, node: cst.BinaryOperation, ctx: FileContext) -> None:
        if not isinstance(node.operator, cst.Divide):
            return
        cap = ctx.facts(VersionFacts).cap("torch")
        if cap is None or cap.admits(_TRUE_DIVISION):
            return  # asked first: most repositories run a torch that divides truly
        left = node.left
        while isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Multiply) and \
                isinstance(left.left, (cst.Integer, cst.Float)):
            left = left.right  # 100. * correct: the scalar takes the tensor's integer type
        if isinstance(node.right, cst.Float):
            return  # how an old torch divided by a float scalar is not worth guessing
        counted = _is_count(left, ctx) or (isinstance(left, cst.Name) and self._only_counts(left.value, node, ctx))
        if not counted:
            return
        effect = "raises a RuntimeError" if cap.admits((1, 6)) else "floor-divides, so the ratio loses its fraction"
        self.report(node, f"{code_span(short(ctx, node))} divides {code_span(short(ctx, left))}, an integer tensor "
                          f"counting matches: on the pinned torch {cap.text} ({cap.source}) `/` on integer tensors "
                          f"{effect}; take `.item()` of the count (or `.float()`) before dividing")

    @staticmethod
    def _only_counts(name: str, use: cst.CSTNode, ctx: FileContext) -> bool:
        """Every value ``name`` takes in its function is 0 or a count of matches, and at least one is a count."""
        scope = next((a for a in ctx.ancestors(use) if isinstance(a, cst.FunctionDef)), ctx.module)
        counts = 0
        for node in subtree(scope):
            if isinstance(node, cst.Assign) and any(dotted_name(t.target) == name for t in node.targets):
                value = node.value
            elif isinstance(node, cst.AugAssign) and dotted_name(node.target) == name:
                value = node.value
            else:
                continue
            if _is_count(value, ctx):
                counts += 1
            elif not (isinstance(value, cst.Integer) and value.value == "0"):
                return False
        return counts > 0


# ---------------------------------------------------------------------------------------------
# TR414

# Half-precision evidence in the file: where `1 + x` rounds away anything below 5e-4 (float16) / 4e-3 (bfloat16).
_HALF_PRECISION = re.compile(r"bfloat16|float16|\.half\(\)|autocast|torch_dtype")
# ``x`` that is a magnitude or a count: log(1 + |x|) compresses a range, and small values cannot be lost there.
_MAGNITUDES = {"abs", "arange", "numel", "long", "int", "count_nonzero", "bincount", "len", "size"}


def _is_exp(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """``torch.exp(x)`` or a tensor's ``x.exp()`` (not ``math.exp`` / ``np.exp``)."""
    expr = _unwrap(expr)
    if not isinstance(expr, cst.Call):
        return False
    qualified = ctx.qualified_name(expr.func)
    if qualified == "torch.exp":
        return True
    return qualified is None and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "exp" and \
        not expr.args


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
    ]
    INVALID = [
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
            if x is None or _never_small(x) or _is_exp(x, ctx):
                return
            replacement = None
            if isinstance(func, cst.Attribute):  # keep the file's alias: ``th.log`` -> ``th.log1p``
                replacement = node.with_changes(func=func.with_changes(attr=cst.Name("log1p")), args=[cst.Arg(x)])
            self._report(node, replacement, "torch.log1p(x)", "`1 + x` rounds to exactly 1", ctx)
        elif qualified is None and isinstance(func, cst.Attribute) and func.attr.value == "log" and not node.args:
            x = _other_than_one(func.value)
            if x is None or _never_small(x) or _is_exp(x, ctx):
                return
            replacement = cst.Call(func=cst.Attribute(parenthesized(x), cst.Name("log1p")))  # ``(a * b).log1p()``
            self._report(node, replacement, "x.log1p()", "`1 + x` rounds to exactly 1", ctx)

    def visit_BinaryOperation(self, node: cst.BinaryOperation, ctx: FileContext) -> None:
        if not isinstance(node.operator, cst.Subtract) or not _is_one(node.right):
            return
        exp = _unwrap(node.left)
        if not _is_exp(exp, ctx):
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

    def _report(self, node: cst.CSTNode, replacement: Optional[cst.BaseExpression], generic: str, loss: str,
                ctx: FileContext) -> None:
        if is_test_code(ctx):
            return  # a test's reference formula mirrors the math on purpose
        instead = code_span(short(ctx, replacement)) if replacement is not None else code_span(generic)
        self.report(node, f"{code_span(short(ctx, node))} in half-precision code: {loss} when |x| is below ~5e-4 in "
                          f"float16 (4e-3 in bfloat16) and keeps only a few digits above; {instead} computes the same "
                          f"function without the rounding", replacement=replacement)
