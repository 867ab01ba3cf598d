"""TR722 checkpoint-saved-on-every-rank: torch.save in a DDP training function without a rank-0 guard."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.names import node_text
from analyzers.program.library import Does, does
from analyzers.program.values import is_plain_backward
from analyzers.program.ranks import depends_on_rank, rank_guarded, returns_off_rank
from analyzers.program.values import is_ddp_call as _is_ddp_call, DDP_HINT as _DDP_HINT


class SaveOnEveryRank(Rule):
    id = "TR722"
    source_hint = (_DDP_HINT, re.compile(r"backward"), re.compile(r"save"))
    slug = "checkpoint-saved-on-every-rank"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "torch.save in a DDP training function without a rank-0 guard"
    what = """
        Flags `torch.save(...)` in a function that trains a `DistributedDataParallel` model
        (the same function calls `.backward()`) when the save is not under a rank check
        (`if rank == 0`, `if is_main_process()`, `if local_rank in [-1, 0]`...), the function
        does not return early on other ranks, and the path does not name the rank.
    """
    why = """
        Every process runs the same code: N processes write the same file at once. The writes
        race (a torn or truncated checkpoint that fails to load later), the shared filesystem
        takes N times the traffic, and the run is slower for nothing - all ranks hold identical
        weights.
    """
    example = """
        model = DDP(model, device_ids=[rank])
        for epoch in range(epochs):
            train_one_epoch(model)
            torch.save(model.module.state_dict(), "ckpt.pt")
    """
    fix_example = """
        model = DDP(model, device_ids=[rank])
        for epoch in range(epochs):
            train_one_epoch(model)
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), "ckpt.pt")
    """
    VALID = [
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(rank, model):
            model = DDP(model, device_ids=[rank])
            for x in loader:
                model(x).sum().backward()
                if rank == 0:
                    torch.save(model.module.state_dict(), "ckpt.pt")
        """,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Trainer:
            def train(self):
                self.model = DDP(self.model, device_ids=[self.gpu_id])
                for x in self.loader:
                    self.model(x).sum().backward()
                if self.gpu_id == 0 and self.epoch % self.save_every == 0:
                    torch.save(self.model.module.state_dict(), "ckpt.pt")
        """,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel
        def train(args, model):
            model = DistributedDataParallel(model)
            for x in loader:
                model(x).sum().backward()
            if args.local_rank not in [-1, 0]:
                return
            torch.save(model.state_dict(), "final.pt")
        """,
        # per-rank shards
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(rank, model):
            model = DDP(model)
            for x in loader:
                model(x).sum().backward()
            torch.save(model.state_dict(), f"shard_{rank}.pt")
            path = os.path.join(out_dir, "opt_rank%d.pt" % dist.get_rank())
            torch.save(opt.state_dict(), path)
        """,
        # not a DDP file
        """
        import torch
        for x in loader:
            model(x).sum().backward()
            torch.save(model.state_dict(), "ckpt.pt")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            def train(rank, world_size):
                model = DDP(Net().to(rank), device_ids=[rank])
                for epoch in range(10):
                    for x, y in loader:
                        opt.zero_grad()
                        loss_fn(model(x), y).backward()
                        opt.step()
                    torch.save(model.state_dict(), "checkpoint.pt")
            """,
            line=11, message="`torch.save(model.state_dict(), \"checkpoint.pt\")`",
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Trainer:
                def __init__(self, model, gpu_id):
                    self.model = nn.parallel.DistributedDataParallel(model, device_ids=[gpu_id])
                def train(self, epochs):
                    for epoch in range(epochs):
                        for x in self.loader:
                            self.model(x).sum().backward()
                        if epoch % self.save_every == 0:
                            torch.save(self.model.module.state_dict(), "ckpt.pt")
            """,
            line=12,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.saves: list[tuple[cst.Call, object]] = []
        self.trains: set[int] = set()
        self.guarded: set[int] = set()  # functions that return early on other ranks

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if _is_ddp_call(node, ctx):
            self.ddp = True
        elif is_plain_backward(node):
            self.trains.add(id(ctx.function))
        elif does(ctx.call_name(node), Does.WRITES_TORCH_CHECKPOINT) and not rank_guarded(node, ctx):
            path = node.args[1].value if len(node.args) > 1 else None
            if path is not None and (depends_on_rank(path, ctx) or depends_on_rank(ctx.origin(path) or path, ctx)):
                return  # one file per rank
            self.saves.append((node, ctx.function))

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        if returns_off_rank(node, ctx):
            self.guarded.add(id(ctx.function))

    def end_file(self, ctx: FileContext) -> None:
        if not self.ddp:
            return
        for call, fn in self.saves:
            if id(fn) not in self.trains or id(fn) in self.guarded:
                continue
            self.report(call, f"{code_span(node_text(ctx, call))} runs on every DDP rank: all processes write the same "
                              f"file at once (a torn checkpoint, N times the I/O); save only on rank 0 "
                              f"(`if dist.get_rank() == 0:`)")
