"""Does the training step clip its gradients: the one answer to "is this model trained with gradient clipping".

The program clips when it does, not when its text holds a word (a ``--grad_clip`` option nobody reads, a comment
saying clipping is left out). A file clips the gradients its training step computes when

- it calls a function or method that clips in place (:data:`analyzers.program.library.CLIPPING_APIS`:
  ``torch.nn.utils.clip_grad_norm_``; a library's ``accelerator.clip_grad_norm_``, ``fabric.clip_gradients``...);
- it clamps or rescales a parameter's gradient in place itself (``p.grad.data.clamp_(-c, c)``,
  ``p.grad.data *= max_norm / norm``);
- it calls a function that does either: one of its own, or one of the repository it imports
  (``from utils import clip_gradient``), found through the repository's summaries.

A library's clipping option (:data:`~analyzers.program.library.CLIPPING_OPTIONS`: Lightning's
``gradient_clip_val``, a DeepSpeed configuration's ``"gradient_clipping"``) clips the steps that library takes
(its trainer's loop, its engine's ``step()``), never a torch optimizer's own ``step()`` in a loop of the user's:
``if args.deepspeed: engine.step() else: opt.step()`` with only the DeepSpeed configuration clipping leaves the
second step unclipped.
"""
from __future__ import annotations

import ast
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, literal_bool, method_name
from analyzers.program.flow import ModuleNodes, subtree
from analyzers.program.loops import functions_that
from analyzers.program.library import CLIPPING_APIS, CLIPPING_OPTIONS, METHODS, Does, does, is_library, method_does

# The in-place operations that bound or rescale a tensor's values: on a gradient, clipping by value, or by norm
# written by hand (``p.grad.data.mul_(max_norm / norm)``, ``p.grad *= max_norm / norm``).
_IN_PLACE_BOUNDS = frozenset({"clamp_", "clip_", "clamp_min_", "clamp_max_", "mul_", "div_"})
_IN_PLACE_SCALINGS = (ast.Mult, ast.Div)
# the last names of the clipping functions and methods: what the ``ast`` summaries of other files recognize
_CLIPPING_LAST_NAMES = frozenset({name.rsplit(".", 1)[-1] for name in CLIPPING_APIS}
                                 | {name for name, api in METHODS.items() if Does.CLIPS_GRADIENTS in api.does})


def _bounds_a_gradient(receiver: Optional[str]) -> bool:
    """``p.grad`` or ``p.grad.data``: the receiver of an in-place bound is a parameter's gradient."""
    if receiver is None:
        return False
    parts = receiver.split(".")
    if parts[-1] == "data":
        parts = parts[:-1]
    return len(parts) > 1 and parts[-1] == "grad"


def clipping_functions(tree: ast.Module) -> set[str]:
    """The top-level functions of a parsed file that clip gradients: they call a clipping function or method, bound
    a gradient in place, or call another function of the file that does (for :mod:`analyzers.program.modules`'
    summaries of the repository's files)."""
    return functions_that(tree, _clips_directly)


def _clips_directly(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            func = node.func
            last = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if last in _CLIPPING_LAST_NAMES or last in _IN_PLACE_BOUNDS and isinstance(func, ast.Attribute) and \
                    _bounds_a_gradient(_ast_dotted(func.value)):
                return True
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, _IN_PLACE_SCALINGS) and \
                _bounds_a_gradient(_ast_dotted(node.target)):
            return True
    return False


def _ast_dotted(node: ast.AST) -> Optional[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _turned_on(value: cst.BaseExpression) -> bool:
    """An option's value that does not switch it off: anything but ``None``, ``False`` or ``0``."""
    if isinstance(value, cst.Name) and value.value in ("None", "False"):
        return False
    if isinstance(value, (cst.Integer, cst.Float)):
        try:
            return float(value.value) != 0
        except ValueError:
            return True
    return literal_bool(value) is not False


class ClippingFacts:
    """Where a file clips gradients, computed once per file from its whole module (``ctx.facts(ClippingFacts)``)."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.clip_calls: list[cst.Call] = []
        self.options: list[cst.CSTNode] = []  # a library's clipping option turned on
        self._repository_answers: dict[str, bool] = {}
        own = self._own_functions()
        nodes = ctx.facts(ModuleNodes)
        for call in nodes.of_type(cst.Call):
            if self._clips(call, own):
                self.clip_calls.append(call)
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value in CLIPPING_OPTIONS and _turned_on(arg.value):
                    self.options.append(arg)
        for node in nodes.of_type(cst.DictElement):
            key = node.key
            if isinstance(key, cst.SimpleString) and key.evaluated_value in CLIPPING_OPTIONS and \
                    _turned_on(node.value):
                self.options.append(node)

    def _own_functions(self) -> set[str]:
        """This file's functions that clip (its top-level functions and its classes' methods)."""
        tree = self.ctx.python_tree
        if tree is None:
            return set()
        found = clipping_functions(tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found |= clipping_functions(ast.Module(body=node.body, type_ignores=[]))
        return found

    def _clips(self, call: cst.Call, own: set[str]) -> bool:
        ctx = self.ctx
        name = method_name(call)
        if name is None:
            return False
        if does(ctx.call_name(call), Does.CLIPS_GRADIENTS):
            return True
        if isinstance(call.func, cst.Attribute):
            if method_does(name, Does.CLIPS_GRADIENTS):
                return True  # accelerator.clip_grad_norm_(...), fabric.clip_gradients(...)
            if name in _IN_PLACE_BOUNDS and _bounds_a_gradient(dotted_name(call.func.value)):
                return True
            receiver = dotted_name(call.func.value)
            if receiver == "self" and name in own:
                return True
        dotted = dotted_name(call.func)
        if dotted is None:
            return False
        if isinstance(call.func, cst.Name) and name in own:
            return True
        if name in _CLIPPING_LAST_NAMES and isinstance(call.func, cst.Name):
            return True  # a clip_grad_norm_ imported from where the file does not say
        if is_library(ctx.call_name(call)):
            return False
        if dotted not in self._repository_answers:  # a function of the repository: asked once per name
            from analyzers.program.modules import ModuleFacts  # modules summarizes files with this module's functions
            self._repository_answers[dotted] = ctx.facts(ModuleFacts).marked_function(
                dotted, lambda summary: summary.clipping_functions)
        answer = self._repository_answers[dotted]
        # a function nothing resolves (a package beside the script, put on sys.path at run time) that the training
        # loop hands what the optimizer trains may clip it: unknown, so no claim that the step does not clip
        return self._hands_over_trained_parameters(call) if answer is None else answer

    def _hands_over_trained_parameters(self, call: cst.Call) -> bool:
        """``call`` sits in a loop that trains and is given the model the optimizer trains, or its parameters."""
        from analyzers.program.loops import loop_trains
        from analyzers.program.values import optimized_names  # values asks the program model that imports this one

        from analyzers.program.values import is_backward, is_optimizer_step

        loop = next((a for a in self.ctx.ancestors(call) if isinstance(a, (cst.For, cst.While))), None)
        if loop is None or not loop_trains(loop, self.ctx):
            return False  # set-up (``backend.distribute(model=model)``): not where a step clips
        # where clipping goes: after a backward and before the optimizer's step, in the loop's source order (an
        # evaluation helper after the step, handed the model, is not)
        order = [n for n in subtree(loop) if isinstance(n, cst.Call)]
        at = next(i for i, n in enumerate(order) if n is call)
        if not any(is_backward(n, self.ctx) for n in order[:at]) or \
                not any(is_optimizer_step(n, self.ctx) for n in order[at + 1:]):
            return False
        trained = optimized_names(self.ctx) or frozenset()
        for arg in call.args:
            value = arg.value
            if isinstance(value, cst.Call) and method_name(value) in ("parameters", "named_parameters"):
                return True
            name = dotted_name(value)
            if name is not None and (name in trained or f"{name}.parameters" in trained):
                return True
        return False

    @property
    def clips(self) -> bool:
        return bool(self.clip_calls)


def clips_gradients(ctx: FileContext, own_optimizer_step: bool) -> bool:
    """Does the file's training step clip its gradients? ``own_optimizer_step``: the step in question is a torch
    optimizer's own ``step()`` (a library's clipping option does not reach it; only a clipping call does)."""
    facts = ctx.facts(ClippingFacts)
    return facts.clips or (not own_optimizer_step and bool(facts.options))
