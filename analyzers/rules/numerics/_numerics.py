"""The rule base of TR401, TR402 and TR403: an activation output (as the model's ``activations`` reads it) passed to
a loss that applies the activation itself."""
from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst

from analyzers.context import FileContext, short, argument, dotted_name
from analyzers.markdown import code_span
from analyzers.model import Severity
from analyzers.program.activations import (Act, activation_of, arms, caller_value, layer_passed_to, module_passed_to,
                                           module_value, same_choice)
from analyzers.program.flow import call_site_values
from analyzers.program.library import method_returns_same_module
from analyzers.program.modules import ModuleFacts
from analyzers.program.names import last_name
from analyzers.rules.base import Rule


class ActivationIntoLoss(Rule):
    """Base: an activation output passed as the ``input`` of a loss that applies it itself."""

    fix_safety = "unsafe"  # dropping the activation changes the loss values (that is the point)

    #: qualified loss class / function name -> display name
    LOSS_MODULES: ClassVar[dict[str, str]] = {}
    LOSS_FUNCS: ClassVar[dict[str, str]] = {}
    #: which producer kinds each loss (display name) objects to
    KINDS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._criteria: set[str] = set()  # dotted names ever assigned a loss object
        self._criteria_last: set[str] = set()
        self._func_last = {q.rsplit(".", 1)[-1] for q in self.LOSS_FUNCS}
        self._module_last = {q.rsplit(".", 1)[-1] for q in self.LOSS_MODULES}
        self._deferred: list[tuple] = []
        self._passed: dict[tuple[int, str], Optional[str]] = {}  # (function, parameter) -> the loss passed for it

    # ---- per-file facts ----------------------------------------------------------------
    def leave_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        self._note_criterion([t.target for t in node.targets], node.value, ctx)

    def leave_AnnAssign(self, node: cst.AnnAssign, ctx: FileContext) -> None:
        if node.value is not None:
            self._note_criterion([node.target], node.value, ctx)

    def _note_criterion(self, targets, value, ctx: FileContext) -> None:
        if not any(self._names_loss(arm, ctx) for _, arm in arms(value)):
            return
        if not self._losses(value, ctx):
            return
        for target in targets:
            name = dotted_name(target)
            if name:
                self._criteria.add(name)
                self._criteria_last.add(name.rsplit(".", 1)[-1])

    def _passed_loss(self, fn: cst.FunctionDef, name: str, ctx: FileContext) -> Optional[str]:
        """``def train(model, criterion, ...)``: the loss every caller in this file passes for the parameter."""
        key = (id(fn), name)
        if key not in self._passed:
            binding = ctx.binding(name)
            self._passed[key] = None
            if binding is not None and binding.kind == "param":
                losses = set()
                for value in call_site_values(ctx, fn, name) or ():
                    value = caller_value(value, ctx)
                    losses.add(self._loss_module(module_value(value, ctx, value), ctx))
                self._passed[key] = losses.pop() if len(losses) == 1 else None
        return self._passed[key]

    def _names_loss(self, value, ctx: FileContext) -> bool:
        """A call that may build one of the losses (cheap, by the name called)."""
        if not isinstance(value, cst.Call):
            return False
        last = last_name(value.func)
        return last in self._module_last or method_returns_same_module(last) or \
            ctx.imports.names.get(last or "") in self.LOSS_MODULES

    def _loss_module(self, expr, ctx: FileContext) -> Optional[str]:
        if isinstance(expr, cst.Call):
            return self.LOSS_MODULES.get(ctx.call_name(expr) or "")
        return None

    def _losses(self, expr, ctx: FileContext) -> list[tuple[Optional[tuple], str]]:
        """The losses a criterion object may be, each with the condition that picks it (``nn.BCELoss() if binary
        else nn.CrossEntropyLoss()`` may be a BCELoss, where ``binary`` holds)."""
        found = []
        for choice, arm in arms(module_value(expr, ctx, expr) if not isinstance(expr, cst.IfExp) else expr):
            loss = self._loss_module(module_value(arm, ctx, arm) if arm is not None else None, ctx)
            if loss is not None:
                found.append((choice, loss))
        return found

    # ---- the check ---------------------------------------------------------------------
    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value  # ``criterion.forward(out, y)`` is ``criterion(out, y)``
        last = last_name(func)
        loss = None
        names = ctx.imports.names
        if last in self._func_last or names.get(last or "") in self.LOSS_FUNCS:
            loss = self.LOSS_FUNCS.get(ctx.qualified_name(func) or "")
            crit_text = loss
        elif last in self._criteria_last and dotted_name(func) in self._criteria:
            losses = [(choice, loss) for choice, loss in self._losses(module_value(func, ctx, node), ctx)]
            crit_text = dotted_name(func)
            if len(losses) == 1 and losses[0][0] is None:
                loss = losses[0][1]
            elif losses:
                self._chosen(node, losses, crit_text, ctx)
                return
        elif isinstance(func, cst.Name) and ctx.function_def is not None:
            loss = self._passed_loss(ctx.function_def, func.value, ctx)
            crit_text = func.value
        elif isinstance(func, cst.Call) and (last_name(func.func) in self._module_last or
                                             names.get(last_name(func.func) or "") in self.LOSS_MODULES):
            loss = self._loss_module(func, ctx)
            crit_text = loss
        if loss is None:
            return
        value = argument(node, 0, "input")
        act = activation_of(value, ctx, node)
        if act is None:
            return
        if act.kind in ("class", "param"):
            self._deferred.append((node, value, act, crit_text, loss, ctx.function_def))
            return
        if act.kind in self.KINDS.get(loss, ()):
            self._emit(node, value, act, act.kind, crit_text, loss, None)

    def _chosen(self, node: cst.Call, losses: list[tuple[Optional[tuple], str]], crit_text: str,
                ctx: FileContext) -> None:
        """A criterion picked by a condition: reported when an activation it objects to may meet the loss that
        applies it (not when the same condition picks them on opposite sides)."""
        value = argument(node, 0, "input")
        act = activation_of(value, ctx, node)
        if act is None or act.kind in ("class", "param"):
            return
        for choice, loss in losses:
            if act.kind in self.KINDS.get(loss, ()) and same_choice(choice, act.choice, ctx):
                self._emit(node, value, act, act.kind, crit_text, loss, None)
                return

    def end_file(self, ctx: FileContext) -> None:
        for node, value, act, crit_text, loss, fn in self._deferred:
            cls = act.class_name
            if act.kind == "param":
                passed, cls = module_passed_to(fn, act.class_name, ctx)
                if passed is None:
                    continue
                if passed != "class":  # every caller passes a module that ends in this activation
                    if passed in self.KINDS.get(loss, ()):
                        act.layer = layer_passed_to(fn, act.class_name, ctx)
                        self._emit(node, value, act, passed, crit_text, loss, None)
                    continue
            kind = ctx.facts(ModuleFacts).forward_activation(cls)
            if kind in self.KINDS.get(loss, ()):
                self._emit(node, value, act, kind, crit_text, loss, cls)

    def _emit(self, call, value, act: Act, kind: str, crit_text: str, loss: str, cls: Optional[str]) -> None:
        ctx = self.ctx
        shown = short(ctx, value)
        if cls is not None and act.inline:
            source = f"{code_span(shown)} is the output of {cls}, and {cls}.forward returns {kind}(...)"
        elif cls is not None:
            source = f"{code_span(shown)} comes from {code_span(short(ctx, act.producer))}, and {cls}.forward returns {kind}(...)"
        elif act.inline:
            source = f"{code_span(shown)} is a {kind} output"
        else:
            source = f"{code_span(shown)} comes from {code_span(short(ctx, act.producer))}"
        if act.choice is not None:
            test, holds = act.choice
            source += f" (where `{short(ctx, test)}` {'holds' if holds else 'does not hold'})"
        crit = f"`{crit_text}` ({loss})" if crit_text != loss else f"{loss}"
        message, severity = self.describe(crit, source, kind, loss)
        # the other site: where the activation is applied (often the line to change), so a pull request
        # that only touches forward's return is still told about the loss it feeds
        related = []
        if cls is not None:
            line = ctx.facts(ModuleFacts).forward_site(cls)
            if line is not None:
                related.append((line, f"`{cls}.forward` returns {kind}(...) here"))
        elif not act.inline:
            related.append((act.producer, f"the {kind} is applied here"))
        if act.layer is not None and act.layer is not act.producer:
            related.append((act.layer, f"the {kind} layer is built here"))
        self.report(value, message, replacement=self.fix(act, kind, cls), severity=severity, related=related)

    def describe(self, crit: str, source: str, kind: str, loss: str) -> tuple[str, Optional[Severity]]:
        raise NotImplementedError

    def fix(self, act: Act, kind: str, cls: Optional[str]) -> Optional[cst.CSTNode]:
        return None
