"""TR611 distributed-load-without-map-location: torch.load without map_location in distributed code puts every rank's
copy on GPU 0.
"""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.ranks import in_single_process_test, rank_guarded
from analyzers.rules.base import Invalid
from analyzers.rules.serialization._checkpoints import LoadsWithoutMapLocation as _LoadsWithoutMapLocation


class DistributedLoadWithoutMapLocation(_LoadsWithoutMapLocation):
    id = "TR611"
    source_hint = re.compile(r"distributed|DDP|rank")
    slug = "distributed-load-without-map-location"
    category = Category.SECURITY
    severity = Severity.MEDIUM
    summary = "torch.load without map_location in distributed code puts every rank's copy on GPU 0"
    what = """
        Flags `torch.load(...)` without `map_location=` in a file that sets up distributed
        training (`init_process_group` / `DistributedDataParallel`), unless another `torch.load`
        in the same function passes one, only some ranks run it, or it sits in a collected test
        that does no distributed work itself (the test runner runs it in one process).
    """
    why = """
        `torch.load` restores each tensor onto the device it was saved from, usually `cuda:0`.
        In a distributed job every rank then allocates the whole checkpoint on GPU 0: rank 0
        runs out of memory or the job slows down, and the stray CUDA context on GPU 0 stays for
        the whole run. Map to the CPU (or to the rank's own device) and let `load_state_dict`
        copy the tensors where the model lives.
    """
    example = """
        dist.init_process_group("nccl")
        ...
        ckpt = torch.load(args.resume)
    """
    fix_example = """
        ckpt = torch.load(args.resume, map_location="cpu")
        # or map_location=f"cuda:{local_rank}"
    """
    VALID = [
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        ckpt = torch.load(args.resume, map_location="cpu")
        """,
        # a single-process test beside the file's distributed ones
        """
        import pytest
        import torch
        import torch.distributed as dist
        def _run_on_ranks(rank):
            dist.init_process_group("gloo", rank=rank)
        def test_checkpoint_round_trip(tmp_path):
            torch.save({"w": torch.ones(2)}, tmp_path / "c.pt")
            state = torch.load(tmp_path / "c.pt")
        """,
        # not distributed
        """
        import torch
        ckpt = torch.load(args.resume)
        """,
        # the other branch handles it
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def resume(args):
            if args.gpu is None:
                checkpoint = torch.load(args.resume)
            else:
                checkpoint = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
        """,
    ]
    INVALID = [
        # a test that starts the distributed job itself: every rank loads
        Invalid(
            """
            import pytest
            import torch
            import torch.distributed as dist
            def test_resume_on_every_rank(tmp_path):
                dist.init_process_group("gloo")
                state = torch.load(tmp_path / "ckpt.pt")
            """,
            line=7, message="no `map_location`",
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            def main(rank):
                dist.init_process_group("nccl", rank=rank)
                model = Net().to(rank)
                if args.resume:
                    model.load_state_dict(torch.load(args.resume))
            """,
            line=8, message="`torch.load(args.resume)`",
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            state = torch.load("checkpoint.pt")
            model = DDP(model, device_ids=[local_rank])
            """,
            line=4, message="usually GPU 0",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._one_rank: set[int] = set()

    def load_seen(self, node: cst.Call, ctx: FileContext) -> None:
        if rank_guarded(node, ctx):
            self._one_rank.add(id(node))  # only some ranks load it: they do not all crowd one GPU
        elif in_single_process_test(node, ctx):
            self._one_rank.add(id(node))  # a test of one process beside the file's distributed ones

    def end_file(self, ctx: FileContext) -> None:
        if not self._loads or not self._distributed:
            return
        for call, scope in self._loads:
            if scope in self._mapped_scopes or id(call) in self._one_rank:
                continue
            self.report(call, f"{code_span(short(ctx, call))} has no `map_location` in distributed code: every rank "
                              f"restores the tensors onto the GPU they were saved from (usually GPU 0); pass "
                              f"`map_location=\"cpu\"` or the rank's device")
