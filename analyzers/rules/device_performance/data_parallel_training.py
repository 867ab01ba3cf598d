"""TR724 data-parallel-training: nn.DataParallel for training; DistributedDataParallel is faster even on one machine."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.loops import loop_stack
from analyzers.program.names import node_text
from analyzers.program.roles import is_test_code, runs_in_interactive_kernel
from analyzers.program.library import Does, does
from analyzers.program.values import is_plain_backward


class DataParallelTraining(Rule):
    id = "TR724"
    source_hint = re.compile(r"DataParallel")
    slug = "data-parallel-training"
    category = Category.DEVICE
    severity = Severity.LOW
    speed_only = True
    summary = "nn.DataParallel for training; DistributedDataParallel is faster even on one machine"
    what = """
        Flags `nn.DataParallel(model)` in a file that trains (calls `.backward()` in a loop) and
        does not offer `DistributedDataParallel` or `torch.distributed` (where it does, DataParallel is
        a fallback). A notebook is not flagged: its kernel is one process, which cannot be launched as one
        process per GPU.
    """
    why = """
        DataParallel runs one Python process: it scatters each batch, replicates the model on
        every step, gathers the outputs on GPU 0 (which runs out of memory first) and is bound by
        the GIL. PyTorch recommends `DistributedDataParallel` - one process per GPU - even on a
        single machine; it is significantly faster and scales.
    """
    example = """
        model = nn.DataParallel(model).cuda()
    """
    fix_example = """
        # torchrun --nproc_per_node=N train.py
        dist.init_process_group("nccl")
        model = DDP(model.to(local_rank), device_ids=[local_rank])
    """
    VALID = [
        """
        import torch
        model = torch.nn.DataParallel(model)
        with torch.no_grad():
            preds = model(x)
        """,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        if distributed:
            model = DDP(model)
        else:
            model = torch.nn.DataParallel(model)
        for x in loader:
            model(x).sum().backward()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            model = nn.DataParallel(Net()).cuda()
            for x, y in loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
            """,
            line=3, message="`nn.DataParallel(Net())`",
        ),
        Invalid(
            """
            import torch
            from torch.nn import DataParallel
            def main():
                net = DataParallel(build(), device_ids=[0, 1])
                for epoch in range(5):
                    for b in loader:
                        net(b).mean().backward()
            """,
            line=5,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.calls: list[cst.Call] = []
        self.trains = False
        self.ddp = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if does(ctx.call_name(node), Does.REPLICATES_PER_DEVICE):
            self.calls.append(node)
        elif is_plain_backward(node) and loop_stack(ctx):
            self.trains = True

    def visit_Name(self, node: cst.Name, ctx: FileContext) -> None:
        if "DDP" in node.value or node.value in ("DistributedDataParallel", "FullyShardedDataParallel",
                                                 "init_process_group"):
            self.ddp = True

    def end_file(self, ctx: FileContext) -> None:
        if not self.trains or self.ddp or ctx.imports.imports_root("torch.distributed") or is_test_code(ctx):
            return  # with DDP in the file, DataParallel is the single-process fallback
        if runs_in_interactive_kernel(ctx):
            return  # a notebook runs in one kernel process: DataParallel is how it uses several GPUs
        for call in self.calls[:1]:
            self.report(call, f"{code_span(node_text(ctx, call))} trains through single-process DataParallel "
                              f"(model replicated every step, outputs gathered on GPU 0, GIL-bound); "
                              f"`DistributedDataParallel` with one process per GPU is faster even on one machine")
