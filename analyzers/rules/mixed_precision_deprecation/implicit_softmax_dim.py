"""TR819 implicit-softmax-dim: F.softmax / nn.Softmax without dim= guess the dimension (deprecated)."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, keyword_arg, positional_args, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


_SOFTMAX_FUNCTIONS = {"torch.nn.functional.softmax", "torch.nn.functional.log_softmax", "torch.nn.functional.softmin"}
_SOFTMAX_MODULES = {"torch.nn.Softmax", "torch.nn.LogSoftmax", "torch.nn.Softmin", "torch.nn.Softmax2d"}


class ImplicitSoftmaxDim(Rule):
    id = "TR819"
    syntactic = True
    slug = "implicit-softmax-dim"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "F.softmax / nn.Softmax without dim= guess the dimension (deprecated)"
    what = """
        Flags `F.softmax`, `F.log_softmax`, `F.softmin` calls and `nn.Softmax()`,
        `nn.LogSoftmax()`, `nn.Softmin()` modules created without `dim`.
    """
    why = """
        Without `dim` PyTorch guesses: dimension 0 for 0-, 1- and 3-D inputs, 1 otherwise, and
        warns that the implicit choice is deprecated. For a batch of sequences (3-D) that guess
        normalizes across the batch instead of the classes, silently; for a single sample vs a
        batch the same line normalizes different axes.
    """
    example = """
        probs = F.softmax(logits)
        self.act = nn.LogSoftmax()
    """
    fix_example = """
        probs = F.softmax(logits, dim=-1)
        self.act = nn.LogSoftmax(dim=1)
    """
    VALID = [
        """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        probs = F.softmax(logits, dim=-1)
        act = nn.LogSoftmax(1)
        p = F.softmax(logits, -1)
        """,
        """
        import torch
        import torch.nn.functional as F
        probs = F.softmax(logits, **kwargs)
        s = nn.Softmax2d()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            probs = F.softmax(logits)
            """,
            line=4, message="`F.softmax(logits)`",
        ),
        Invalid(
            """
            import torch
            from torch import nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.out = nn.LogSoftmax()
            """,
            line=7,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last not in ("softmax", "log_softmax", "softmin", "Softmax", "LogSoftmax", "Softmin"):
            return
        qualified = ctx.qualified_name(func) or ""
        if any(a.star for a in node.args) or keyword_arg(node, "dim") is not None:
            return
        if qualified in _SOFTMAX_FUNCTIONS:
            if len(positional_args(node)) >= 2 or keyword_arg(node, "_stacklevel") is not None:
                return
        elif qualified in _SOFTMAX_MODULES - {"torch.nn.Softmax2d"}:
            if positional_args(node):
                return
        else:
            return
        self.report(node, f"{code_span(short(ctx, node))} has no `dim`: PyTorch guesses (dimension 0 for 1-D and 3-D "
                          f"inputs, 1 otherwise) and warns that the guess is deprecated; pass the class dimension, "
                          f"e.g. `dim=-1`")
