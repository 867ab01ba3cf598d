"""What TR722, TR723, TR725, TR726, TR727 and TR728 share."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, dotted_name, keyword_arg, positional_args)
from analyzers.rules.base import Rule
from analyzers.program.ranks import returns_off_rank
from analyzers.program.roles import is_test_code
from analyzers.program.library import Does, does, is_ddp


def is_ddp_call(call: cst.Call, ctx: FileContext) -> bool:
    qualified = ctx.call_name(call)
    if is_ddp(qualified):
        return True
    return qualified is None and (dotted_name(call.func) or "") in ("DDP", "DistributedDataParallel")


DDP_HINT = re.compile(r"DistributedDataParallel|DDP")  # how _is_ddp_call recognises the wrapper


class CallsOnEveryRank(Rule):
    """Calls that every DDP rank makes: whether the file wraps a model in DDP, the calls ``collects``
    accepts (with their function), and the functions that return early off rank 0 (their calls are
    guarded). ``unguarded_calls`` is what the rule may report."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.calls: list[tuple[cst.Call, object]] = []
        self.guarded: set[int] = set()

    def collects(self, node: cst.Call, ctx: FileContext) -> bool:
        raise NotImplementedError

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if is_ddp_call(node, ctx):
            self.ddp = True
        elif self.collects(node, ctx):
            self.calls.append((node, ctx.function))

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        if returns_off_rank(node, ctx):
            self.guarded.add(id(ctx.function))

    def unguarded_calls(self, ctx: FileContext) -> list[tuple[cst.Call, object]]:
        if not self.ddp or is_test_code(ctx):
            return []
        return [(call, fn) for call, fn in self.calls if id(fn) not in self.guarded]


DISTRIBUTED_SAMPLER_NAME = re.compile(r"Distributed\w*Sampler")


def is_sharding_sampler(node: cst.Call, ctx: FileContext) -> bool:
    """torch's DistributedSampler, or a project's own ``Distributed*Sampler`` class."""
    return does(ctx.call_name(node), Does.SHARDS_DATA) or bool(
        DISTRIBUTED_SAMPLER_NAME.search(dotted_name(node.func) or ""))


def may_have_sampler(loader: cst.Call, max_positional: int) -> bool:
    """A ``DataLoader(...)`` call that passes a sampler, or may: ``**kwargs``, or more than ``max_positional``
    positional arguments (``sampler`` is the fourth: one passed that way is not read)."""
    return (any(a.star for a in loader.args) or len(positional_args(loader)) > max_positional
            or keyword_arg(loader, "sampler") is not None or keyword_arg(loader, "batch_sampler") is not None)


def assigned_name(node: cst.Call, ctx: FileContext) -> Optional[str]:
    """``name`` in ``name = <node>`` (one target), else None."""
    parent = ctx.parent(node)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    return None
