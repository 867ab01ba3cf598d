"""TR812 checkpoint-without-use-reentrant: torch.utils.checkpoint.checkpoint without use_reentrant= warns and will
raise.
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, keyword_arg, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule


_CHECKPOINT = {"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"}


class CheckpointWithoutUseReentrant(Rule):
    id = "TR812"
    syntactic = True
    slug = "checkpoint-without-use-reentrant"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.MEDIUM
    summary = "torch.utils.checkpoint.checkpoint without use_reentrant= warns and will raise"
    what = """
        Flags `torch.utils.checkpoint.checkpoint(...)` and `checkpoint_sequential(...)` calls that
        do not pass `use_reentrant=` (unless a `**kwargs` may carry it).
    """
    why = """
        Current PyTorch releases warn on every call that omits `use_reentrant`, and PyTorch has
        announced that it will become an error. The implicit default (`True`, the reentrant variant) is also
        the one to avoid: it does not support `torch.autograd.grad`, keyword inputs, or inputs
        that do not require grad (gradients silently stop flowing through the block when no input
        requires grad, e.g. with frozen embeddings).
    """
    example = """
        x = checkpoint(block, x)
    """
    fix_example = """
        x = checkpoint(block, x, use_reentrant=False)
    """
    VALID = [
        """
        import torch
        from torch.utils.checkpoint import checkpoint
        x = checkpoint(block, x, use_reentrant=False)
        """,
        """
        import torch
        from torch.utils.checkpoint import checkpoint
        x = checkpoint(block, x, **ckpt_kwargs)
        """,
        # a project's own checkpoint helper
        """
        import torch
        from .utils import checkpoint
        x = checkpoint(block, x)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.checkpoint import checkpoint
            def forward(self, x):
                for blk in self.blocks:
                    x = checkpoint(blk, x)
                return x
            """,
            line=6, message="`checkpoint(blk, x)` does not pass `use_reentrant=`",
        ),
        Invalid(
            """
            import torch
            import torch.utils.checkpoint as cp
            y = cp.checkpoint_sequential(self.layers, 4, x)
            """,
            line=4,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        if last not in ("checkpoint", "checkpoint_sequential"):
            return
        if ctx.qualified_name(func) not in _CHECKPOINT:
            return
        if keyword_arg(node, "use_reentrant") is not None or any(a.star == "**" for a in node.args):
            return
        if in_compat_fallback(ctx, node) or not ctx.facts(VersionFacts).admits("torch", (2, 1)):
            return
        self.report(node, f"{code_span(short(ctx, node))} does not pass `use_reentrant=`: PyTorch warns on every call "
                          f"and plans to make it an error, and the implicit reentrant variant drops gradients when no "
                          f"input requires grad; pass `use_reentrant=False` (or `True` to keep today's behavior)")
