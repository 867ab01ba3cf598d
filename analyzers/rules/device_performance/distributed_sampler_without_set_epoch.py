"""TR720 distributed-sampler-without-set-epoch: DistributedSampler shuffles, but set_epoch() is never called in the
epoch loop.
"""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext, dotted_name, is_true, keyword_arg, method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.data import sampler_feeds_training
from analyzers.program.loops import loop_stack
from analyzers.program.library import Does, does, training_libraries_that
from analyzers.program.values import is_plain_backward


class SamplerWithoutSetEpoch(Rule):
    id = "TR720"
    source_hint = re.compile(r"DistributedSampler")
    slug = "distributed-sampler-without-set-epoch"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "DistributedSampler shuffles, but set_epoch() is never called in the epoch loop"
    what = """
        Flags a shuffling `DistributedSampler` in a file that trains over epochs (a loop that
        calls `.backward()`) when nothing in the file calls `set_epoch(...)`. Not flagged: a sampler
        over evaluation data, or one that orders only loaders named for evaluation data (their
        batch order changes no result).
    """
    why = """
        `DistributedSampler` seeds its shuffle with `seed + epoch`. Without
        `sampler.set_epoch(epoch)` the epoch stays 0, so every epoch visits the data in exactly
        the same order on every rank - the shuffle happens once, and the training loses the
        per-epoch reshuffling it was configured for (usually a measurable accuracy loss).
    """
    example = """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=sampler, batch_size=64)
        for epoch in range(epochs):
            for x, y in loader:
                ...
    """
    fix_example = """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=sampler, batch_size=64)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                ...
    """
    VALID = [
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(10):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                criterion(model(x), y).backward()
                opt.step()
        """,
        # evaluation sampler
        """
        import torch
        from torch.utils.data.distributed import DistributedSampler
        val_sampler = DistributedSampler(val_ds, shuffle=False)
        for epoch in range(10):
            for x, y in train_loader:
                criterion(model(x), y).backward()
        """,
        # a shuffling sampler over held-out data: the order of evaluation batches changes no result
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        holdout_sampler = DistributedSampler(eval_ds)
        for epoch in range(10):
            for x, y in fit_loader:
                criterion(model(x), y).backward()
        """,
        # named neutrally, but it orders only the batches of a loader named for held-out data
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        sampler_b = DistributedSampler(ds_b)
        dev_loader = DataLoader(ds_b, sampler=sampler_b)
        for epoch in range(10):
            for x, y in train_loader:
                criterion(model(x), y).backward()
            with torch.no_grad():
                for x, y in dev_loader:
                    model(x)
        """,
        # a builder module: the training script sets the epoch
        """
        import torch.utils.data as data
        def build_loader(ds, bs):
            return data.DataLoader(ds, batch_size=bs, sampler=data.DistributedSampler(ds))
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            train_sampler = DistributedSampler(train_ds)
            loader = DataLoader(train_ds, batch_size=32, sampler=train_sampler)
            for epoch in range(10):
                for x, y in loader:
                    opt.zero_grad()
                    criterion(model(x), y).backward()
                    opt.step()
            """,
            line=4, message="`train_sampler.set_epoch(epoch)`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.data.distributed import DistributedSampler as DS
            def main():
                loader = torch.utils.data.DataLoader(ds, sampler=DS(ds, shuffle=True))
                for epoch in range(3):
                    for batch in loader:
                        model(batch).mean().backward()
            """,
            line=5,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.samplers: list[cst.Call] = []
        self.set_epoch = False
        self.trains = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name == "set_epoch":
            self.set_epoch = True
        elif is_plain_backward(node) and loop_stack(ctx):
            self.trains = True
        elif does(ctx.call_name(node), Does.SAMPLES_PER_PROCESS):
            shuffle = keyword_arg(node, "shuffle")
            if shuffle is None or is_true(shuffle.value):
                self.samplers.append(node)

    def end_file(self, ctx: FileContext) -> None:
        if self.set_epoch or not self.trains or any(
                ctx.imports.imports_root(lib) for lib in training_libraries_that(Does.ADVANCES_SAMPLER_EPOCH)):
            return  # Accelerate and Lightning advance the sampler's epoch themselves
        for call in self.samplers:
            if not sampler_feeds_training(call, ctx):
                continue  # it orders evaluation batches only: their order changes no result
            parent = ctx.parent(call)
            owner = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                owner = dotted_name(parent.targets[0].target)
            fix = code_span(f"{owner}.set_epoch(epoch)") if owner else "`sampler.set_epoch(epoch)`"
            self.report(call, f"this `DistributedSampler` shuffles with `seed + epoch`, and nothing calls "
                              f"`set_epoch()`: every epoch sees the same order on every rank; call {fix} at the "
                              f"start of each epoch")
