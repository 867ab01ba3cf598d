"""The rule base of TR201 and TR202: feeds the model's ``EvaluationPaths`` during the walk and reports its model
calls that a subclass :meth:`check` finds unprotected."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext
from analyzers.program.evaluation import ModelCall, EvaluationPaths
from analyzers.model import Severity
from analyzers.rules.base import Rule


class InferencePathRule(Rule):
    """Shares one set of facts between TR201 and TR202 (collected by whichever runs first)."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        facts = ctx.facts(EvaluationPaths)
        if facts.collector is None:
            facts.collector = self  # the first of TR201 / TR202 to run feeds the facts during the walk
        self._owner = facts.collector is self
        self.facts: EvaluationPaths = facts

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_function(node, ctx)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_function()

    def visit_With(self, node: cst.With, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_with(node, ctx)

    def leave_With(self, node: cst.With, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_with(node)

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_loop(node, node.iter)

    def leave_For(self, node: cst.For, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_loop(node)

    def visit_ListComp(self, node: cst.ListComp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_loop(node, node.for_in.iter)

    def leave_ListComp(self, node: cst.ListComp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_loop(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_loop(node, node.for_in.iter)

    def leave_GeneratorExp(self, node: cst.GeneratorExp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_loop(node)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if self._owner:
            self.facts.on_call(node, ctx)

    def visit_Return(self, node: cst.Return, ctx: FileContext) -> None:
        if self._owner:
            self.facts.on_return(node, ctx)

    def end_file(self, ctx: FileContext) -> None:
        seen: set[tuple] = set()
        for call in self.facts.model_calls:
            where = self.facts.path_of(call)
            if where is None or not self.facts.runs_a_module(call):
                continue
            key = (id(call.stack[-1]), call.model)
            if key in seen:
                continue
            message = self.check(call, where)
            if message:
                seen.add(key)
                self.report(call.node, message, severity=self.severity_of(call))

    def check(self, call: ModelCall, where: str) -> Optional[str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def severity_of(self, call: ModelCall) -> Optional[Severity]:
        """The finding's severity when it differs from the rule's: None keeps the rule's."""
        return None
