"""The rule base of the calls every DDP rank makes (TR722, TR723, TR725)."""
from __future__ import annotations


import libcst as cst

from analyzers.context import FileContext
from analyzers.program.ranks import returns_off_rank
from analyzers.program.roles import is_test_code
from analyzers.program.values import is_ddp_call
from analyzers.rules.base import Rule


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


