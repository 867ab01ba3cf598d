"""TR723 ddp-accumulation-without-no-sync: gradient accumulation on a DDP model all-reduces on every micro-step (no
model.no_sync()).
"""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext, dotted_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.loops import AccumulationFacts
from analyzers.program.values import is_ddp_call as _is_ddp_call


class DdpAccumulationWithoutNoSync(Rule):
    id = "TR723"
    source_hint = re.compile(r"DistributedDataParallel|DDP")
    slug = "ddp-accumulation-without-no-sync"
    category = Category.DEVICE
    severity = Severity.MEDIUM
    speed_only = True
    summary = "gradient accumulation on a DDP model all-reduces on every micro-step (no model.no_sync())"
    what = """
        Flags gradient accumulation (`backward()` on every batch, `optimizer.step()` only under
        `if (i + 1) % accum_steps == 0`) in a file that wraps the model in
        `DistributedDataParallel` and never uses `no_sync()` (or sets
        `require_backward_grad_sync`).
    """
    why = """
        DDP all-reduces the gradients in every `backward()`. During accumulation only the last
        micro-step's all-reduce is needed; the others move the full gradient over the network
        for nothing, which often makes accumulation nearly as slow as not accumulating at all.
    """
    example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(ddp_model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    fix_example = """
        for i, (x, y) in enumerate(loader):
            sync = (i + 1) % accum_steps == 0
            with ddp_model.no_sync() if not sync else contextlib.nullcontext():
                loss = criterion(ddp_model(x), y) / accum_steps
                loss.backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
    """
    VALID = [
        """
        import contextlib
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        for i, (x, y) in enumerate(loader):
            ctx = model.no_sync() if (i + 1) % accum_steps else contextlib.nullcontext()
            with ctx:
                (criterion(model(x), y) / accum_steps).backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        # nanoGPT's flag
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        for i, (x, y) in enumerate(loader):
            model.require_backward_grad_sync = (i + 1) % grad_accum_steps == 0
            (model(x).mean() / grad_accum_steps).backward()
            if (i + 1) % grad_accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        # no DDP
        """
        import torch
        for i, (x, y) in enumerate(loader):
            (criterion(model(x), y) / accum_steps).backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net, device_ids=[rank])
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum_steps
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=8, message="`model.no_sync()`",
        ),
        Invalid(
            """
            import torch
            def train(args, model):
                model = torch.nn.parallel.DistributedDataParallel(model)
                for step, batch in enumerate(loader):
                    (model(**batch).loss / args.accumulation_steps).backward()
                    if step % args.accumulation_steps == 0:
                        opt.step()
                        opt.zero_grad()
            """,
            line=7,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.synced = False
        self.models: set[str] = set()

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if _is_ddp_call(node, ctx):
            self.ddp = True
            parent = ctx.parent(node)
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                self.models.add(dotted_name(parent.targets[0].target) or "")

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        ctx.facts(AccumulationFacts).note_if(node, ctx)

    def visit_Name(self, node: cst.Name, ctx: FileContext) -> None:
        if node.value in ("no_sync", "require_backward_grad_sync", "no_sync_context"):
            self.synced = True

    def end_file(self, ctx: FileContext) -> None:
        if not self.ddp or self.synced:
            return
        for step in ctx.facts(AccumulationFacts).steps:
            divisor = dotted_name(step.divisor) or "the accumulation steps"
            self.report(step.node.test, f"gradients of a `DistributedDataParallel` model are accumulated over "
                                        f"{code_span(divisor)} micro-batches, but every `backward()` all-reduces "
                                        f"them: wrap the micro-steps that do not step in "
                                        f"{self._no_sync()}")

    def _no_sync(self) -> str:
        if len(self.models) == 1 and "" not in self.models:
            return code_span(next(iter(self.models)) + ".no_sync()")
        return "the DDP model's `no_sync()`"
