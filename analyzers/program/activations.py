"""Which activation produced a value: softmax, log_softmax or sigmoid applied by a function, a tensor method, an
``nn`` module (also the last layer of a ``Sequential``) or a local model class whose ``forward`` returns one,
followed through assignments, reshapes, wrappers and a parameter's call sites."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import Binding, FileContext, dotted_name, positional_args
from analyzers.program.flow import assignment_before, call_site_values
from analyzers.program.library import is_library
from analyzers.program.names import last_name
from analyzers.program.values import wrapped_module


ACT_FUNCS = {
    "torch.softmax": "softmax",
    "torch.nn.functional.softmax": "softmax",
    "torch.special.softmax": "softmax",
    "torch.Tensor.softmax": "softmax",
    "torch.log_softmax": "log_softmax",
    "torch.nn.functional.log_softmax": "log_softmax",
    "torch.special.log_softmax": "log_softmax",
    "torch.Tensor.log_softmax": "log_softmax",
    "torch.sigmoid": "sigmoid",
    "torch.nn.functional.sigmoid": "sigmoid",
    "torch.special.expit": "sigmoid",
    "torch.Tensor.sigmoid": "sigmoid",
}


ACT_MODULES = {
    "torch.nn.Softmax": "softmax",
    "torch.nn.modules.activation.Softmax": "softmax",
    "torch.nn.modules.Softmax": "softmax",
    "torch.nn.LogSoftmax": "log_softmax",
    "torch.nn.modules.activation.LogSoftmax": "log_softmax",
    "torch.nn.modules.LogSoftmax": "log_softmax",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.Sigmoid": "sigmoid",
}


TENSOR_METHODS = {"softmax": "softmax", "log_softmax": "log_softmax", "sigmoid": "sigmoid"}


SEQUENTIAL = {"torch.nn.Sequential", "torch.nn.modules.container.Sequential", "torch.nn.modules.Sequential"}


FOLLOWED_KINDS = ("assign", "annassign", "walrus")


CONDITIONAL = tuple(c for c in (cst.If, cst.ExceptHandler, getattr(cst, "MatchCase", None)) if c is not None)


def is_conditional(binding: Binding, use: cst.CSTNode, ctx: FileContext) -> bool:
    """The assignment sits in an ``if``/``except`` branch that does not also enclose ``use``."""
    for ancestor in ctx.ancestors(binding.node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module, cst.Lambda)):
            return False
        if isinstance(ancestor, CONDITIONAL) and not ctx.inside(use, ancestor):
            return True
    return False


def resolve(expr: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode,
             depth: int = 6) -> Optional[cst.BaseExpression]:
    """Follow unconditional name/attribute assignments to the producing expression."""
    return follow(expr, ctx, use, None, depth)[0]


def follow(expr, ctx: FileContext, use: cst.CSTNode, inside: Optional[tuple[str, Binding]], depth: int = 6):
    """``_resolve`` that knows which binding's value it is reading: in ``D = D.to(device)`` the ``D`` on the
    right is the binding before this one. Returns (expression, the binding it came from)."""
    for _ in range(depth):
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return expr, inside
        name = dotted_name(expr)
        if name is None:
            return expr, inside
        binding = inside[1].previous if inside is not None and inside[0] == name else ctx.binding(name)
        if binding is not None and binding.value is None and binding.element == 0:
            # ``output, hidden = model(x)``: the first element is what a model's forward returns first
            if is_conditional(binding, use, ctx):
                return None, inside
            return binding.unpacked_from, (name, binding)
        if binding is None or binding.value is None or binding.kind not in FOLLOWED_KINDS:
            return expr, inside
        if is_conditional(binding, use, ctx):
            moved = wrapped_module(binding.value, ctx)
            if moved is None or dotted_name(moved) != name or binding.previous is None:
                return None, inside
            # ``if use_gpu: model = model.cuda()``: the branch moves or wraps the same value, so whether it ran
            # or not, the value is the one bound before it
            inside = (name, binding)
            expr = moved
            continue
        inside = (name, binding)
        expr = binding.value
    return expr, inside


def module_value(expr: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The constructor call of a module object, through ``.to(device)`` / ``torch.compile`` / DDP,
    also when the wrapped module is reassigned to its own name (``D = D.to(device)``)."""
    expr, inside = follow(expr, ctx, use, None)
    for _ in range(6):
        inner = wrapped_module(expr, ctx)
        if inner is None:
            return expr
        expr, inside = follow(inner, ctx, use, inside)
    return expr


@dataclass
class Act:
    kind: str  # softmax | log_softmax | sigmoid | class
    producer: cst.Call  # the call that produced the value
    inline: bool  # the expression examined *is* the producer (not reached through a name)
    form: str  # function | method | module | class
    class_name: Optional[str] = None


def module_kind(target: Optional[cst.BaseExpression], ctx: FileContext) -> tuple[Optional[str], Optional[str]]:
    """(activation kind, local class name) of a module object's constructor call."""
    if not isinstance(target, cst.Call):
        return None, None
    name = ctx.call_name(target)
    if name in ACT_MODULES:
        return ACT_MODULES[name], None
    if name in SEQUENTIAL:
        layers = positional_args(target)
        if layers and not layers[-1].star and isinstance(layers[-1].value, cst.Call):
            return ACT_MODULES.get(ctx.call_name(layers[-1].value) or ""), None
        return None, None
    if not is_library(name):
        # a class of this repository (defined here, or imported from a sibling module)
        local = dotted_name(target.func)
        if local and local.rsplit(".", 1)[-1][:1].isupper():
            return "class", local
    return None, None


def call_activation(call: cst.Call, ctx: FileContext, use: cst.CSTNode) -> tuple[Optional[str], str, Optional[str]]:
    """(kind, form, class name) for a call producing an activation output, or (None, "", None)."""
    func = call.func
    name = last_name(func)
    if isinstance(func, cst.Call):  # nn.Softmax(dim=1)(x)
        kind, cls = module_kind(func, ctx)
        return (kind, "class" if kind == "class" else "module", cls) if kind else (None, "", None)
    if name is None:
        return None, "", None
    qualified = ctx.qualified_name(func)
    if qualified is not None:
        if qualified in ACT_FUNCS:
            return ACT_FUNCS[qualified], "function", None
        if qualified.split(".", 1)[0] in ("torch", "numpy", "scipy", "jax", "tensorflow", "sklearn"):
            return None, "", None
    receiver = func.value if isinstance(func, cst.Attribute) else None
    is_self = isinstance(receiver, cst.Name) and receiver.value == "self"
    if name in TENSOR_METHODS and receiver is not None and not is_self and qualified is None:
        positional = len(positional_args(call))
        if (name == "sigmoid" and not call.args) or (name != "sigmoid" and positional <= 1 and call.args):
            return TENSOR_METHODS[name], "method", None
    if name == "forward" and receiver is not None:
        func = receiver  # model.forward(x) is model(x)
    if isinstance(func, cst.Name) and func.value == "self":
        cls = ctx.class_def
        return ("class", "class", cls.name.value) if cls is not None else (None, "", None)
    if isinstance(func, (cst.Name, cst.Attribute)):
        module = module_value(func, ctx, use)
        kind, cls = module_kind(module, ctx)
        if kind:
            return kind, "class" if kind == "class" else "module", cls
        if isinstance(module, cst.Name) and ctx.function_def is not None:
            binding = ctx.binding(module.value)
            if binding is not None and binding.kind == "param":
                # ``def train(model, ...)``: what the model is depends on the callers; decided at the end
                return "param", "class", module.value
    return None, "", None


SHAPE_METHODS = {"view", "reshape", "squeeze", "unsqueeze", "flatten", "contiguous", "view_as", "reshape_as"}


def unshaped(expr: cst.BaseExpression, ctx: FileContext) -> cst.BaseExpression:
    """``criterion(output.squeeze(), y)``: reshaping keeps what the values are."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in SHAPE_METHODS and ctx.qualified_name(expr.func) is None:
        expr = expr.func.value
    return expr


def activation_of(expr: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode) -> Optional[Act]:
    """Which activation (or which local model class) produced ``expr``, if known."""
    if expr is None:
        return None
    value = resolve(unshaped(expr, ctx), ctx, use)
    if value is not None:
        value = unshaped(value, ctx)  # ``outputs = model(x).squeeze()``
    if not isinstance(value, cst.Call):
        return None
    kind, form, cls = call_activation(value, ctx, use)
    if kind is None:
        return None
    return Act(kind, value, value is expr, form, cls)


def module_class_passed_to(fn: Optional[cst.FunctionDef], parameter: str, ctx: FileContext) -> Optional[str]:
    """The one model class every call of ``fn`` in this file passes for ``parameter``, if there is one."""
    if fn is None:
        return None
    values = call_site_values(ctx, fn, parameter)
    if not values:
        return None
    classes = set()
    for value in values:
        if isinstance(value, cst.Name) and ctx.binding(value.value) is None:
            value = assignment_before(ctx, value, value.value) or value  # a local of the calling function
        kind, cls = module_kind(module_value(value, ctx, value), ctx)
        if kind != "class":
            return None
        classes.add(cls)
    return classes.pop() if len(classes) == 1 else None
