"""TR962 dataloader-exclusive-options: DataLoader(shuffle=True, sampler=...) or batch_sampler= with batch options
raises ValueError.
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, is_false, is_true, keyword_arg, positional_args,
                               short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.library import is_data_loader


_BATCH_SAMPLER_EXCLUSIVE = ("batch_size", "shuffle", "sampler", "drop_last")


def _none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


class DataLoaderExclusiveOptions(Rule):  # TR721 (shuffle-with-sampler) was folded into it: an alias
    id = "TR962"
    slug = "dataloader-exclusive-options"
    category = Category.DATA_PIPELINE
    severity = Severity.HIGH
    summary = "DataLoader(shuffle=True, sampler=...) or batch_sampler= with batch options raises ValueError"
    what = """
        Flags `DataLoader` calls that pass `shuffle=True` together with a `sampler=`, or a
        `batch_sampler=` together with `batch_size`, `shuffle`, `sampler` or `drop_last`.
    """
    why = """
        These options are mutually exclusive: the constructor raises `ValueError: sampler
        option is mutually exclusive with shuffle` (or its `batch_sampler` variant) before the
        first batch. The usual case is adding a `DistributedSampler` to a loader that shuffled:
        the sampler shuffles itself (`DistributedSampler(shuffle=True)` and
        `sampler.set_epoch(epoch)`), so `shuffle=True` has to go.
    """
    example = """
        loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))
    """
    fix_example = """
        loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds))
    """
    VALID = [
        """
        import torch
        from torch.utils.data import DataLoader
        a = DataLoader(ds, batch_size=64, shuffle=True)
        b = DataLoader(ds, batch_size=64, sampler=sampler)
        c = DataLoader(ds, batch_size=64, shuffle=(sampler is None), sampler=sampler)
        d = DataLoader(ds, batch_sampler=bs, num_workers=4)
        e = DataLoader(ds, batch_size=64, shuffle=True, sampler=None)
        """,
        """
        import torch
        loader = make_loader(ds, shuffle=True, sampler=sampler)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))
            """,
            line=4, message="`shuffle=True`",
            fixed="""
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds))
            """,
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=32, batch_sampler=GroupedBatchSampler(ds, 32))
            """,
            line=3, message="`batch_size`",
        ),
        Invalid(  # the sampler chosen by a condition: the single-GPU run never shows the error
            """
            import torch.utils.data as tud
            sampler = tud.distributed.DistributedSampler(ds) if args.distributed else None
            loader = tud.DataLoader(ds, shuffle=True, sampler=sampler, num_workers=4)
            """,
            line=4, message="`shuffle=True`",
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last != "DataLoader" and "DataLoader" not in ctx.imports.names.get(last, ""):
            return
        if not is_data_loader(ctx.qualified_name(func)) or any(a.star for a in node.args):
            return
        batch_sampler = keyword_arg(node, "batch_sampler")
        if batch_sampler is not None and not _none(batch_sampler.value):
            clashing = []
            for name in _BATCH_SAMPLER_EXCLUSIVE:
                arg = keyword_arg(node, name)
                if arg is None or _none(arg.value):
                    continue
                if name in ("shuffle", "drop_last") and is_false(arg.value):
                    continue
                if name == "batch_size" and isinstance(arg.value, cst.Integer) and arg.value.value == "1":
                    continue  # the default
                clashing.append(name)
            if len(positional_args(node)) > 1:
                clashing.append("batch_size")
            if clashing:
                shown = ", ".join(code_span(c) for c in dict.fromkeys(clashing))
                self.report(node, f"{code_span(short(ctx, node))} passes `batch_sampler=` with {shown}: the "
                                  f"constructor raises ValueError (the batch sampler decides batch size, order and "
                                  f"dropping); drop {shown}")
            return
        shuffle, sampler = keyword_arg(node, "shuffle"), keyword_arg(node, "sampler")
        if shuffle is None or sampler is None or not is_true(shuffle.value) or _none(sampler.value):
            return
        args = [a for a in node.args if a is not shuffle]
        args[-1] = args[-1].with_changes(comma=node.args[-1].comma if node.args[-1] is not shuffle else
                                         cst.MaybeSentinel.DEFAULT)
        replacement = node.with_changes(args=args)
        self.report(node, f"{code_span(short(ctx, node))} passes `shuffle=True` with `sampler=`: DataLoader raises "
                          f"`ValueError: sampler option is mutually exclusive with shuffle`; drop `shuffle=True` and "
                          f"let the sampler shuffle (e.g. `DistributedSampler(shuffle=True)` with `set_epoch`)",
                    replacement=replacement)
