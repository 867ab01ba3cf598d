"""TR410 nan-equality-comparison: x == float('nan') is always False (and != always True); use isnan."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, local_name_for, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.values import nan_constant_source
from analyzers.rules.base import Invalid, Rule


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
                source = nan_constant_source(target.comparator, ctx)
                other = left
                if source is None:
                    source, other = nan_constant_source(left, ctx), target.comparator
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
