"""TR818 legacy-loss-reduction-arguments: size_average= / reduce= on losses are deprecated; use reduction=."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, is_false, is_true, keyword_arg, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.rules.mixed_precision_deprecation._removed_api import with_keyword


def _reduction(size_average: Optional[cst.Arg], reduce: Optional[cst.Arg]) -> Optional[str]:
    """torch's legacy_get_string: the reduction the two legacy flags meant (None when not literal)."""
    values = []
    for arg in (size_average, reduce):
        if arg is None:
            values.append(True)
        elif is_true(arg.value):
            values.append(True)
        elif is_false(arg.value):
            values.append(False)
        else:
            return None
    size, red = values
    if not red:
        return "none"
    return "mean" if size else "sum"


class LegacyLossReductionArguments(Rule):
    id = "TR818"
    syntactic = True
    slug = "legacy-loss-reduction-arguments"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "size_average= / reduce= on losses are deprecated; use reduction="
    what = """
        Flags `size_average=` and `reduce=` passed to `torch.nn` loss modules and
        `torch.nn.functional` loss functions, and rewrites them to the equivalent `reduction=`
        when their values are literals.
    """
    why = """
        Both arguments have been deprecated since PyTorch 0.4.1 and warn on every call; their
        combination is hard to read (`size_average=False` means *sum*, `reduce=False` means
        *no reduction* whatever `size_average` says). `reduction="mean" | "sum" | "none"` says it
        directly.
    """
    example = """
        loss = F.binary_cross_entropy(recon, x, size_average=False)
    """
    fix_example = """
        loss = F.binary_cross_entropy(recon, x, reduction="sum")
    """
    VALID = [
        """
        import torch
        import torch.nn.functional as F
        loss = F.binary_cross_entropy(recon, x, reduction="sum")
        crit = torch.nn.MSELoss(reduction="none")
        """,
        """
        import torch
        out = my_loss(x, y, size_average=False)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = F.binary_cross_entropy(recon, x, size_average=False)
            """,
            line=4, message='`reduction="sum"`',
            fixed="""
            import torch
            import torch.nn.functional as F
            loss = F.binary_cross_entropy(recon, x, reduction="sum")
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            crit = nn.CrossEntropyLoss(reduce=False)
            """,
            line=4,
            fixed="""
            import torch
            from torch import nn
            crit = nn.CrossEntropyLoss(reduction="none")
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        size_average, reduce = keyword_arg(node, "size_average"), keyword_arg(node, "reduce")
        if size_average is None and reduce is None:
            return
        qualified = ctx.qualified_name(node.func) or ""
        last = qualified.rsplit(".", 1)[-1]
        is_module = qualified.startswith("torch.nn.") and last.endswith("Loss")
        is_function = qualified.startswith("torch.nn.functional.") and (
            "loss" in last or last in ("binary_cross_entropy", "cross_entropy", "kl_div", "nll_loss"))
        if not (is_module or is_function):
            return
        reduction = _reduction(size_average, reduce)
        replacement = None
        if reduction is not None and keyword_arg(node, "reduction") is None:
            args = [a for a in node.args if a is not size_average and a is not reduce]
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            replacement = node.with_changes(args=with_keyword(args, "reduction", cst.SimpleString(f'"{reduction}"')))
        written = ", ".join(code_span(short(ctx, a, 40)) for a in (size_average, reduce) if a is not None)
        instead = f'`reduction="{reduction}"`' if reduction is not None else '`reduction="mean" | "sum" | "none"`'
        self.report(node, f"{code_span(short(ctx, node))} passes {written}, deprecated since PyTorch 0.4.1 (a warning "
                          f"on every call); use {instead}", replacement=replacement)
