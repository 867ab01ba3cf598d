"""Which values carry an autograd graph: a loss or a model's output still attached to the parameters it was
computed from (kept alive by whoever holds it), and which expressions cut it off (``.item()``, ``.detach()``,
``float(...)``)."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, call_receiver, code_children_as_written, dotted_name, is_false,
                               keyword_arg, method_name, positional_args, string_value)
from analyzers.program.flow import assigned_values, subtree
from analyzers.program.names import last_segment
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import called_object, is_model_call

DETACHING_METHODS = {"item", "detach", "tolist", "numpy", "detach_"}
DETACHING_FUNCS = {"float", "int", "round", "len", "str", "bool"}
# tensor -> tensor methods that keep the autograd graph of their receiver
GRAPH_KEEPING_METHODS = {"mean", "sum", "cpu", "cuda", "to", "float", "double", "half", "clone", "squeeze",
                          "unsqueeze", "view", "reshape", "mul", "div", "add", "sub", "sqrt", "abs", "exp", "log",
                          "pow", "contiguous", "flatten", "norm", "max", "min"}


def is_criterion_call(call: cst.Call, ctx: FileContext) -> bool:
    """A loss computation: ``criterion(out, y)``, ``F.cross_entropy(...)``, ``nn.MSELoss()(...)``, also called
    through an explicit ``criterion.forward(out, y)``."""
    func = called_object(call.func)
    name = dotted_name(func)
    if name is not None:
        last = last_segment(name).lower()
        if "loss" in last or "criterion" in last:
            return True
        qualified = ctx.qualified_name(func) or ""
        if qualified.startswith("torch.nn.functional.") and (
                "loss" in qualified or "entropy" in qualified or qualified.endswith(("kl_div", "margin_ranking"))):
            return True
    origin = ctx.origin(func)
    if isinstance(origin, cst.Call):
        qualified = ctx.call_name(origin) or ""
        if qualified.startswith("torch.nn.") and qualified.endswith("Loss"):
            return True
    return False


def graph_kind(value: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> Optional[str]:
    """"loss" / "model" when ``value`` evaluates to a tensor that carries an autograd graph."""
    if value is None or depth > 4:
        return None
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Name) and func.value in DETACHING_FUNCS:
            return None
        method = method_name(value)
        receiver = call_receiver(value)
        if receiver is not None and method in DETACHING_METHODS:
            return None
        if receiver is not None and method in GRAPH_KEEPING_METHODS:
            inner = graph_kind_read(receiver, ctx, depth + 1)
            if inner is not None:
                return inner
            if ctx.qualified_name(receiver) != "torch":
                return None
        if is_criterion_call(value, ctx):
            return "loss"
        if is_model_call(func, ctx):
            return "model"
        qualified = ctx.qualified_name(func) or ""
        if qualified in ("torch.mean", "torch.sum", "torch.stack", "torch.cat"):
            args = positional_args(value)
            return graph_kind_read(args[0].value, ctx, depth + 1) if args else None
        return None
    if isinstance(value, cst.BinaryOperation):
        return graph_kind_read(value.left, ctx, depth + 1) or graph_kind_read(value.right, ctx, depth + 1)
    if isinstance(value, cst.UnaryOperation):
        return graph_kind_read(value.expression, ctx, depth + 1)
    if isinstance(value, (cst.Name, cst.Attribute)):
        return graph_kind_read(value, ctx, depth + 1)
    if isinstance(value, cst.Subscript):
        return graph_kind(value.value, ctx, depth + 1)
    return None


def graph_kind_read(expr: cst.BaseExpression, ctx: FileContext, depth: int = 0) -> Optional[str]:
    """Like :func:`graph_kind` for an expression read now (names resolved through bindings)."""
    if depth > 4:
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return graph_kind(expr, ctx, depth)
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("data", "grad"):
        return None
    name = dotted_name(expr)
    if name is None:
        # ``model(x).loss``
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            return "loss" if graph_kind(expr.value, ctx, depth + 1) else None
        return None
    binding = ctx.binding(name)
    if binding is None:
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            # ``outputs.loss`` with ``outputs = model(**batch)``
            return "loss" if graph_kind_read(expr.value, ctx, depth + 1) else None
        return None
    if in_no_grad_block(ctx, binding.node) or binding_graph_free(binding, ctx):
        return None
    if binding.kind in ("assign", "annassign", "walrus"):
        if binding.value is None:
            # ``logits, loss = model(x, y)``: tuple unpacking of a model/criterion call
            node = binding.node
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and "loss" in last_segment(name).lower():
                return "loss" if graph_kind(node.value, ctx, depth + 1) else None
            return None
        if binding.value is expr:
            return None
        return graph_kind(binding.value, ctx, depth + 1)
    if binding.kind == "augassign" and isinstance(binding.node, cst.AugAssign):
        kind = graph_kind(binding.node.value, ctx, depth + 1)
        if kind is not None:
            return kind
        return "loss" if "loss" in last_segment(name).lower() and not detached_value(binding.node.value) else None
    return None


# methods whose result is a Python value or a tensor read off the graph: ``.size()`` is a ``torch.Size``
_NO_GRAPH_METHODS = DETACHING_METHODS | {"size", "dim", "numel", "nelement", "stride"}


def graph_free(value: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0, resolve=True) -> bool:
    """True when ``value`` is known to carry no autograd graph: numbers and arithmetic on them, ``.item()`` /
    ``.tolist()`` / ``.detach()`` / ``.numpy()`` / ``float(...)``, anything read through ``.data`` (``loss.data[0]``:
    a Python number on old torch), names bound to such values, and what a function of this file returns when every
    ``return`` hands back such a value. False when unsure. ``resolve`` is True for an expression of this scope, or
    the other function whose returns are read (its names are read through its own assignments)."""
    if value is None or depth > 12:
        return False
    if isinstance(value, (cst.Integer, cst.Float, cst.Imaginary)):
        return True
    if isinstance(value, cst.UnaryOperation):
        return graph_free(value.expression, ctx, depth + 1, resolve)
    if isinstance(value, cst.BinaryOperation):
        return graph_free(value.left, ctx, depth + 1, resolve) and graph_free(value.right, ctx, depth + 1, resolve)
    if isinstance(value, cst.Subscript):
        return graph_free(value.value, ctx, depth + 1, resolve)
    if isinstance(value, cst.Attribute) and value.attr.value == "data":
        return True
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Name) and func.value in DETACHING_FUNCS:
            return resolve is not True or ctx.binding(func.value) is None  # the builtin, not a local of that name
        receiver = call_receiver(value)
        method = method_name(value)
        if receiver is not None and method in _NO_GRAPH_METHODS:
            return True
        if receiver is not None and method in GRAPH_KEEPING_METHODS:
            return graph_free(receiver, ctx, depth + 1, resolve)
        if resolve is True and isinstance(func, cst.Name):
            return _returns_graph_free(ctx.binding(func.value), None, ctx, depth + 1)
        return False
    if isinstance(value, cst.Name) and isinstance(resolve, cst.FunctionDef):
        # a name in another function's return: known only through that function's own plain assignments
        if value.value in ctx.facts(FunctionShapes).names_of(resolve):
            return False
        values = assigned_values(ctx, resolve, value.value)
        if values:
            return all(graph_free(v, ctx, depth + 1, resolve) for v in values)
    if isinstance(value, cst.Name) or isinstance(value, cst.Attribute) and resolve is True:
        name = dotted_name(value)
        binding = ctx.binding(name, value) if name is not None else None
        return binding is not None and binding_graph_free(binding, ctx, depth + 1)
    return False


def binding_graph_free(binding, ctx: FileContext, depth: int = 0) -> bool:
    """One assignment (see :func:`graph_free`): ``x = loss.item()``, ``out, l = train(...)`` with ``train`` returning
    ``out, loss.data[0]`` at that position, ``total += loss.data[0]`` after a graph-free start."""
    if depth > 12:
        return False
    if binding.kind in ("assign", "annassign", "walrus"):
        if binding.value is not None:
            return graph_free(binding.value, ctx, depth + 1)
        call = binding.unpacked_from
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and binding.element is not None:
            return _returns_graph_free(ctx.binding(call.func.value, call), binding.element, ctx, depth + 1)
        return False
    if binding.kind == "augassign" and isinstance(binding.node, cst.AugAssign):
        return graph_free(binding.node.value, ctx, depth + 1) and (
            binding.previous is None or binding_graph_free(binding.previous, ctx, depth + 1))
    return False


def _returns_graph_free(binding, element: Optional[int], ctx: FileContext, depth: int) -> bool:
    """Every ``return`` of the function ``binding`` defines hands back a graph-free value (its ``element``-th
    item when the caller unpacks a tuple)."""
    if binding is None or binding.kind != "def" or not isinstance(binding.node, cst.FunctionDef):
        return False
    returned = [node.value for node in ctx.facts(FunctionShapes).own_returns(binding.node)]
    if not returned or any(v is None for v in returned):
        return False
    for value in returned:
        if element is not None:
            if not isinstance(value, (cst.Tuple, cst.List)) or element >= len(value.elements):
                return False
            value = value.elements[element].value
        if not graph_free(value, ctx, depth + 1, resolve=binding.node):
            return False
    return True


class FunctionShapes:
    """Per function of the file, read once: the names it binds other than by a plain assignment, and its own
    ``return`` statements (the graph questions ask them again for every value a caller reads)."""

    def __init__(self, ctx: FileContext) -> None:
        self._names: dict[cst.FunctionDef, frozenset] = {}
        self._returns: dict[cst.FunctionDef, list[cst.Return]] = {}

    def names_of(self, fn: cst.FunctionDef) -> frozenset:
        found = self._names.get(fn)
        if found is None:
            found = self._names[fn] = _names_of(fn)
        return found

    def own_returns(self, fn: cst.FunctionDef) -> list[cst.Return]:
        found = self._returns.get(fn)
        if found is None:
            found = self._returns[fn] = _own_returns(fn)
        return found


def _names_of(fn: cst.FunctionDef) -> frozenset:
    """The names ``fn`` binds other than by a plain ``name = value`` (parameters, loop and tuple targets,
    ``+=``): their values in its returns are unknown here."""
    names = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
    names |= {p.name.value for p in (fn.params.star_arg, fn.params.star_kwarg) if isinstance(p, cst.Param)}
    stack: list[cst.CSTNode] = [fn.body]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.AsName)) or (
                isinstance(node, cst.AssignTarget) and not isinstance(node.target, cst.Name)):
            names |= {n.value for n in _subtree_names(node.target if not isinstance(node, cst.AsName) else node.name)}
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(code_children_as_written(node))
    return frozenset(names)


def _subtree_names(node: cst.CSTNode) -> list[cst.Name]:
    if isinstance(node, cst.Name):
        return [node]
    return [n for child in code_children_as_written(node) for n in _subtree_names(child)]


def _own_returns(fn: cst.FunctionDef) -> list[cst.Return]:
    """The function's ``return`` statements, not those of functions or classes nested in it."""
    found: list[cst.Return] = []
    stack: list[cst.CSTNode] = [fn.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Return):
            found.append(node)
            continue
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) or isinstance(node, cst.BaseExpression):
            continue  # no return statement lies inside an expression
        stack.extend(code_children_as_written(node))
    return found


def detached_value(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Name) and value.func.value in DETACHING_FUNCS:
            return True
        return method_name(value) in DETACHING_METHODS and call_receiver(value) is not None
    return isinstance(value, (cst.Integer, cst.Float))




def _detached_read(node: cst.CSTNode, ctx: FileContext) -> bool:
    """``node`` (a value) is read through tensor methods that keep its numbers, or indexing, into ``.detach()`` /
    ``.numpy()`` / ``.item()`` / ``.tolist()``: ``out.detach()``, ``out[0].cpu().numpy()``."""
    current = node
    for _ in range(8):
        parent = ctx.parent(current)
        if isinstance(parent, cst.Subscript) and parent.value is current:
            current = parent
            continue
        if not isinstance(parent, cst.Attribute) or parent.value is not current:
            return False
        call = ctx.parent(parent)
        if not isinstance(call, cst.Call) or call.func is not parent:
            return parent.attr.value == "data"  # ``out.data``: the numbers, off the graph
        if parent.attr.value in DETACHING_METHODS:
            return True
        if parent.attr.value not in GRAPH_KEEPING_METHODS:
            return False
        current = call
    return False


def output_taken_off_graph(call: cst.Call, scope: cst.CSTNode, ctx: FileContext) -> bool:
    """The output of ``call`` (a model's forward) leaves autograd within ``scope``: read straight into
    ``.detach()`` / ``.numpy()`` / ``.item()`` (through views and copies), or bound to a name that ``scope`` reads so.
    Code that keeps only the numbers of a forward pass uses it for its results, not for a backward pass."""
    if _detached_read(call, ctx):
        return True
    parent = ctx.parent(call)
    if not isinstance(parent, cst.Assign) or len(parent.targets) != 1 or \
            not isinstance(parent.targets[0].target, cst.Name):
        return False
    target = parent.targets[0].target
    reads = [node for node in subtree(scope) if isinstance(node, cst.Name) and node.value == target.value and
             node is not target and not _names_an_attribute(node, ctx)]
    # every read keeps only the numbers: one that feeds a loss or any other computation keeps the graph
    return bool(reads) and all(_detached_read(node, ctx) or _reads_metadata(node, ctx) for node in reads)


def _names_an_attribute(node: cst.Name, ctx: FileContext) -> bool:
    parent = ctx.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr is node


def _reads_metadata(node: cst.CSTNode, ctx: FileContext) -> bool:
    """``out.shape``, ``out.size(0)``, ``out.device``: what a tensor is, not its numbers."""
    parent = ctx.parent(node)
    return isinstance(parent, cst.Attribute) and parent.value is node and \
        parent.attr.value in ("shape", "size", "dim", "ndim", "device", "dtype", "numel")


# ---- values taken off the graph on purpose ---------------------------------------------------------------

def detached_side_output(found: cst.CSTNode, ctx: FileContext) -> bool:
    """A NumPy copy returned next to the result, after an explicit ``.detach()`` / ``.data``: a second output
    (replay priorities, statistics) that the author took out of autograd on purpose, not part of the loss. It may
    get there inside a container (``info = dict(q=q.detach().numpy()); return loss, info``)."""
    if not taken_off_graph(found):
        return False
    holder = _container_holding(found, ctx)
    parent = ctx.parent(holder)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
        name = parent.targets[0].target.value
        fn = next((a for a in ctx.ancestors(parent) if isinstance(a, cst.FunctionDef)), None)
        uses = [n for n in subtree(fn.body) if isinstance(n, cst.Name) and n.value == name
                and not isinstance(ctx.parent(n), cst.AssignTarget)] if fn is not None else []
        return bool(uses) and all(_returned_beside_result(use, ctx) for use in uses)
    return _returned_beside_result(holder, ctx)


def taken_off_graph(found: cst.CSTNode) -> bool:
    """``found`` is reached through ``.detach()`` or ``.data``: the value was taken off the graph on purpose."""
    node = found
    while isinstance(node, (cst.Call, cst.Attribute)):
        if isinstance(node, cst.Call):
            node = node.func
            continue
        if node.attr.value in ("data", "detach"):
            return True
        node = node.value
    return False


def flows_back_into_result(found: cst.CSTNode, ctx: FileContext) -> bool:
    """A NumPy copy taken off the graph (``h.detach().numpy()``) that comes back into the computation: wrapped
    into a tensor again (``torch.from_numpy(np.exp(...))``), returned as the function's result, or assigned to a
    name read that way. Anything else (metrics, replay priorities, logging) left the graph on purpose."""
    def fed_back(node: cst.CSTNode) -> bool:
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, cst.Call) and (ctx.call_name(ancestor) or "").startswith("torch"):
                return True
            if isinstance(ancestor, cst.Return):
                return True
            if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return False
        return False

    if fed_back(found):
        return True
    statement = ctx.statement_of(found)
    fn = next((a for a in ctx.ancestors(found) if isinstance(a, cst.FunctionDef)), None)
    if not isinstance(statement, cst.Assign) or fn is None:
        return False
    names = {t.target.value for t in statement.targets if isinstance(t.target, cst.Name)}
    return any(fed_back(n) for n in subtree(fn.body) if isinstance(n, cst.Name) and n.value in names
               and not isinstance(ctx.parent(n), cst.AssignTarget))


def _container_holding(node: cst.CSTNode, ctx: FileContext) -> cst.CSTNode:
    """The outermost dict / list / tuple / ``dict(...)`` literal or arithmetic (``a.numpy() - b.numpy()``)
    ``node`` is part of (``node`` if none)."""
    while True:
        parent = ctx.parent(node)
        grand = ctx.parent(parent) if parent is not None else None
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
            node = parent
        elif isinstance(parent, (cst.DictElement, cst.Element)) and isinstance(grand, (cst.Dict, cst.List, cst.Tuple)) \
                and not isinstance(ctx.parent(grand), cst.Return):
            node = grand
        elif isinstance(parent, cst.Arg) and parent.keyword is not None and isinstance(grand, cst.Call) and \
                dotted_name(grand.func) == "dict":
            node = grand
        else:
            return node


def _returned_beside_result(node: cst.CSTNode, ctx: FileContext) -> bool:
    element = ctx.parent(node)
    tup = ctx.parent(element) if isinstance(element, cst.Element) else None
    return isinstance(tup, cst.Tuple) and isinstance(ctx.parent(tup), cst.Return) and tup.elements[0] is not element


# ---- what backward is called on ------------------------------------------------------------------------

def _unreduced(call: cst.Call) -> bool:
    reduction = keyword_arg(call, "reduction")
    if reduction is not None and string_value(reduction.value) == "none":
        return True
    reduce = keyword_arg(call, "reduce")
    return reduce is not None and is_false(reduce.value)


def non_scalar_origin(value: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[str]:
    """Why ``value`` (what ``.backward()`` is called on) is not a scalar: ``"none"``, a loss computed with
    ``reduction="none"`` (or the old ``reduce=False``), alone or in arithmetic; ``"model"``, a model's output
    rather than a criterion's. None when neither shows."""
    if isinstance(value, cst.BinaryOperation):
        for side in (value.left, value.right):
            if isinstance(side, cst.Call) and non_scalar_origin(side, ctx) == "none":
                return "none"
        return None
    if not isinstance(value, cst.Call):
        return None
    qualified = ctx.qualified_name(value.func) or ""
    if qualified.startswith("torch.nn.functional.") and _unreduced(value):
        return "none"
    origin = ctx.origin(value.func)
    if isinstance(origin, cst.Call):
        constructor = ctx.call_name(origin) or ""
        if constructor.startswith("torch.nn.") and constructor.endswith("Loss"):
            return "none" if _unreduced(origin) else None
    if is_model_call(value.func, ctx) and not is_criterion_call(value, ctx):
        return "model"
    return None
