"""TR961 count-batches-by-iterating: len(list(loader)) / sum(1 for _ in loader) runs the whole data pipeline to count
batches.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.values import is_loader


class CountBatchesByIterating(Rule):
    id = "TR961"
    slug = "count-batches-by-iterating"
    category = Category.DATA_PIPELINE
    severity = Severity.MEDIUM
    summary = "len(list(loader)) / sum(1 for _ in loader) runs the whole data pipeline to count batches"
    what = """
        Flags `len(list(loader))`, `len([b for b in loader])` and `sum(1 for _ in loader)` on a
        DataLoader.
    """
    why = """
        Each of these iterates the loader to the end: every sample is read from disk, decoded,
        augmented and collated (and `list` keeps the whole epoch in memory) only to produce a
        count. For a map-style dataset `len(loader)` answers at once; for a streaming pipeline,
        count the batches in the loop that already iterates them.
    """
    example = """
        for batch in train_dl:
            losses += train_step(batch)
        return losses / len(list(train_dl))
    """
    fix_example = """
        batches = 0
        for batch in train_dl:
            losses += train_step(batch)
            batches += 1
        return losses / batches  # or len(train_dl) for a map-style dataset
    """
    VALID = [
        """
        import torch
        n = len(train_loader)
        layers = len(list(model.parameters()))
        """,
        """
        import torch
        files = sum(1 for _ in folder.iterdir())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def train_epoch(model, train_dl):
                losses = 0
                for src, tgt in train_dl:
                    losses += step(model, src, tgt)
                return losses / len(list(train_dl))
            """,
            line=7, message="`len(list(train_dl))`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            batches = DataLoader(ds, batch_size=32)
            steps = sum(1 for _ in batches)
            """,
            line=5,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Name) or func.value not in ("len", "sum") or len(node.args) != 1:
            return
        if ctx.binding(func.value) is not None:
            return
        inner = node.args[0].value
        iterated: Optional[cst.BaseExpression] = None
        if func.value == "len":
            if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value in (
                    "list", "tuple") and len(inner.args) == 1:
                iterated = inner.args[0].value
            elif isinstance(inner, cst.ListComp) and inner.for_in.inner_for_in is None and not inner.for_in.ifs:
                iterated = inner.for_in.iter
        elif isinstance(inner, cst.GeneratorExp) and isinstance(inner.elt, cst.Integer) and inner.elt.value == "1" \
                and inner.for_in.inner_for_in is None and not inner.for_in.ifs:
            iterated = inner.for_in.iter
        if iterated is None or not is_loader(iterated, ctx):
            return
        loader = short(ctx, iterated)
        self.report(node, f"{code_span(short(ctx, node))} iterates {code_span(loader)} to the end, loading and "
                          f"collating every batch, just to count them; use {code_span(f'len({loader})')} (map-style "
                          f"datasets) or count the batches in the loop that already iterates them")
