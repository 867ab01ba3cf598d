"""Which activation produced a value: softmax, log_softmax or sigmoid applied by a function, a tensor method, an
``nn`` module (also the last layer of a ``Sequential``) or a local model class whose ``forward`` returns one,
followed through assignments, reshapes, wrappers and a parameter's call sites."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import Binding, FileContext, dotted_name, positional_args
from analyzers.program.flow import ModuleNodes, assignment_before, call_site_values, module_function, subtree
from analyzers.program.graphs import FunctionShapes
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
    return _branch_of(binding, use, ctx) is not None


def _is_none(expr: Optional[cst.BaseExpression]) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _branch_of(binding: Binding, use: cst.CSTNode, ctx: FileContext) -> Optional[cst.CSTNode]:
    """The innermost ``if``/``except`` branch around the assignment that does not also enclose ``use``."""
    for ancestor in ctx.ancestors(binding.node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module, cst.Lambda)):
            return None
        if isinstance(ancestor, CONDITIONAL) and not ctx.inside(use, ancestor):
            return ancestor
    return None


def fills_default(binding: Binding, name: str, use: cst.CSTNode, ctx: FileContext) -> bool:
    """``if loss_fn is None: loss_fn = nn.BCELoss()``: the branch gives the name its value when it held
    ``None`` before (a parameter defaulting to ``None``, or ``name = None``). What the name holds at ``use`` is
    then this value whenever nobody set it: the default behaviour of the code."""
    branch = _branch_of(binding, use, ctx)
    if not isinstance(branch, cst.If) or branch.orelse is not None:
        return False
    test = branch.test
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or \
            not isinstance(test.comparisons[0].operator, cst.Is) or \
            not _is_none(test.comparisons[0].comparator) or dotted_name(test.left) != name:
        return False
    previous = binding.previous
    return previous is not None and previous.kind in ("param", "assign") and _is_none(previous.value)


def arms(expr: Optional[cst.BaseExpression]) -> list[tuple[Optional[tuple[cst.BaseExpression, bool]],
                                                           Optional[cst.BaseExpression]]]:
    """The values an expression may be: ``a if c else b`` is ``a`` (where ``c`` holds) or ``b`` (where it does
    not), each with the condition and the side that picks it; anything else is itself, picked always."""
    if isinstance(expr, cst.IfExp):
        test, holds = expr.test, True
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, holds = test.expression, not holds  # ``a if not c else b`` is ``b if c else a``
        return [((test, holds), expr.body), ((test, not holds), expr.orelse)]
    return [(None, expr)]


def same_choice(a: Optional[tuple[cst.BaseExpression, bool]], b: Optional[tuple[cst.BaseExpression, bool]],
                ctx: FileContext) -> bool:
    """Two values picked by conditions may meet: unless both are picked by the same condition (the same code)
    on opposite sides, which never hold at once."""
    if a is None or b is None:
        return True
    code = ctx.module.code_for_node
    return code(a[0]) != code(b[0]) or a[1] == b[1]


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
            if fills_default(binding, name, use, ctx):
                inside = (name, binding)
                expr = binding.value
                continue
            moved = wrapped_module(binding.value, ctx) or unshaped(binding.value, ctx)
            if moved is None or dotted_name(moved) != name or binding.previous is None:
                return None, inside
            # ``if use_gpu: model = model.cuda()``: the branch moves, wraps or reshapes the same value, so
            # whether it ran or not, the value is the one bound before it
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
    layer: Optional[cst.Call] = None  # the activation layer of the module that produced it (the line to change)
    # picked by a condition (``nn.Sigmoid() if binary else nn.Identity()``): the condition and the side that holds
    choice: Optional[tuple[cst.BaseExpression, bool]] = None


# the methods that add a layer at the end of a Sequential built first and filled after
GROWING_METHODS = {"add_module": 1, "append": 0}


def _added_layer(statement: cst.CSTNode, name: str) -> tuple[bool, Optional[cst.BaseExpression]]:
    """(adds, layer): whether ``statement`` is ``name.add_module("fc", layer)`` / ``name.append(layer)``, and the
    layer it adds."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or \
            not isinstance(statement.body[0], cst.Expr) or not isinstance(statement.body[0].value, cst.Call):
        return False, None
    call = statement.body[0].value
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in GROWING_METHODS or \
            not isinstance(func.value, cst.Name) or func.value.value != name:
        return False, None
    index = GROWING_METHODS[func.attr.value]
    positional = positional_args(call)
    if any(arg.star for arg in call.args) or len(positional) <= index:
        return True, None
    return True, positional[index].value


def _grows(node: cst.CSTNode, name: str) -> bool:
    """Anything under ``node`` adds a layer to ``name``."""
    return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in GROWING_METHODS
               and isinstance(n.func.value, cst.Name) and n.func.value.value == name for n in subtree(node))


def _rebinds(statement: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.AssignTarget) and isinstance(n.target, cst.Name) and n.target.value == name
               for n in subtree(statement))


def sequential_last_layer(target: cst.Call, ctx: FileContext) -> Optional[cst.BaseExpression]:
    """The layer a ``Sequential`` ends with: its last positional layer, or the last one the statements after its
    assignment add (``net = nn.Sequential()`` then ``net.add_module("act", nn.Softmax())`` / ``net.append(...)``).
    None when unknown: a starred layer, or a layer added under a branch or a loop."""
    layers = positional_args(target)
    last = layers[-1].value if layers and not layers[-1].star else None
    if layers and layers[-1].star:
        return None
    parents = ctx.parents if id(target) in ctx.parents else ctx.facts(ModuleNodes).parents
    assign = parents.get(id(target))
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or \
            not isinstance(assign.targets[0].target, cst.Name):
        return last
    name = assign.targets[0].target.value
    line = parents.get(id(assign))
    block = parents.get(id(line))
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or not any(statement is line for statement in body):
        return last
    after = False
    for statement in body:
        if statement is line:
            after = True
            continue
        if not after:
            continue
        adds, layer = _added_layer(statement, name)
        if adds:
            last = layer
            if layer is None:
                return None
        elif _rebinds(statement, name):
            break
        elif _grows(statement, name):
            return None  # a layer added under a branch or a loop: which one comes last is not known here
    return last


def module_kind(target: Optional[cst.BaseExpression], ctx: FileContext,
                depth: int = 0) -> tuple[Optional[str], Optional[str]]:
    """(activation kind, local class name) of a module object's constructor call, or of a call of a function of
    this file that builds and returns one (``net = build_model(n_in, n_out)``)."""
    if not isinstance(target, cst.Call):
        return None, None
    name = ctx.call_name(target)
    if name in ACT_MODULES:
        return ACT_MODULES[name], None
    if name in SEQUENTIAL:
        last = sequential_last_layer(target, ctx)
        if isinstance(last, cst.Call):
            return ACT_MODULES.get(ctx.call_name(last) or ""), None
        return None, None
    if not is_library(name):
        # a class of this repository (defined here, or imported from a sibling module)
        local = dotted_name(target.func)
        if local and local.rsplit(".", 1)[-1][:1].isupper():
            return "class", local
        if isinstance(target.func, cst.Name) and depth < 3:
            return _returned_module_kind(module_function(ctx, target.func.value), ctx, depth + 1)
    return None, None


def activation_layer(target: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> Optional[cst.Call]:
    """Where a module object's activation is built: the ``nn.Softmax(...)`` it is, or the one its ``Sequential``
    ends with, also through a builder function of this file (the line a fix changes)."""
    if not isinstance(target, cst.Call):
        return None
    name = ctx.call_name(target)
    if name in ACT_MODULES:
        return target
    if name in SEQUENTIAL:
        last = sequential_last_layer(target, ctx)
        return last if isinstance(last, cst.Call) and ctx.call_name(last) in ACT_MODULES else None
    if isinstance(target.func, cst.Name) and not is_library(name) and depth < 3:
        fn = module_function(ctx, target.func.value)
        for node in ctx.facts(FunctionShapes).own_returns(fn) if fn is not None else ():
            value = assignment_before(ctx, node, node.value.value) if isinstance(node.value, cst.Name) else node.value
            found = activation_layer(_unwrapped(value, ctx), ctx, depth + 1)
            if found is not None:
                return found
    return None


def _returned_module_kind(fn: Optional[cst.FunctionDef], ctx: FileContext,
                          depth: int) -> tuple[Optional[str], Optional[str]]:
    """What every ``return`` of the builder ``fn`` hands back, when they all agree."""
    if fn is None:
        return None, None
    kinds = set()
    for node in ctx.facts(FunctionShapes).own_returns(fn):
        value = node.value
        if isinstance(value, cst.Name):
            value = assignment_before(ctx, node, value.value)
        kinds.add(module_kind(_unwrapped(value, ctx), ctx, depth))
    return kinds.pop() if len(kinds) == 1 else (None, None)


def _unwrapped(expr: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[cst.BaseExpression]:
    """``Net().to(device)``: the module under moves and wrappers, without following names."""
    for _ in range(6):
        inner = wrapped_module(expr, ctx) if isinstance(expr, cst.Call) else None
        if inner is None:
            return expr
        expr = inner
    return expr


def chosen_module(module: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode
                  ) -> tuple[Optional[tuple[cst.BaseExpression, bool]], Optional[cst.BaseExpression]]:
    """``act = nn.Sigmoid() if binary else nn.Identity()``: (the condition and side, the arm) of the one arm that
    is an activation module, when only one is; else (None, the module itself)."""
    if not isinstance(module, cst.IfExp):
        return None, module
    found = []
    for choice, arm in arms(module):
        arm = module_value(arm, ctx, use) if isinstance(arm, (cst.Name, cst.Attribute)) else _unwrapped(arm, ctx)
        kind, _ = module_kind(arm, ctx)
        if kind is not None and kind != "class":
            found.append((choice, arm))
    return found[0] if len(found) == 1 else (None, module)


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
        module = chosen_module(module_value(func, ctx, use), ctx, use)[1]
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
    layer, choice = None, None
    if form == "module" and isinstance(value.func, (cst.Name, cst.Attribute)):
        func = value.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        choice, module = chosen_module(module_value(func, ctx, use), ctx, use)
        layer = activation_layer(module, ctx)
    return Act(kind, value, value is expr, form, cls, layer, choice)


def caller_value(value: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[cst.BaseExpression]:
    """What a call site passes, read in the caller's scope: a name is the value it was last assigned there (or at
    module level) before the call, not whatever the name means where the question is asked (the callee's own
    parameter of the same name, ``fit(net)`` inside ``def fit(net)``). None when the caller does not show it."""
    if not isinstance(value, cst.Name):
        return value
    found = assignment_before(ctx, value, value.value)
    if found is not None:
        return found
    return value if ctx.binding(value.value) is None else None


def module_passed_to(fn: Optional[cst.FunctionDef], parameter: str,
                     ctx: FileContext) -> tuple[Optional[str], Optional[str]]:
    """(activation kind, local class name) of the module every call of ``fn`` in this file passes for
    ``parameter``, when they all pass the same kind: one model class, or modules that end in the same activation."""
    if fn is None:
        return None, None
    values = call_site_values(ctx, fn, parameter)
    if not values:
        return None, None
    kinds = set()
    for value in values:
        kind, cls = module_kind(module_value(caller_value(value, ctx), ctx, value), ctx)
        if kind is None:
            return None, None
        kinds.add((kind, cls))
    return kinds.pop() if len(kinds) == 1 else (None, None)


def layer_passed_to(fn: Optional[cst.FunctionDef], parameter: str, ctx: FileContext) -> Optional[cst.Call]:
    """The activation layer of the module the first call of ``fn`` passes for ``parameter`` (see activation_layer)."""
    values = call_site_values(ctx, fn, parameter) if fn is not None else None
    return activation_layer(module_value(caller_value(values[0], ctx), ctx, values[0]), ctx) if values else None
