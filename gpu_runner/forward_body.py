"""What a model's ``forward`` body says about each of its tensor parameters.

``build`` asks here before guessing inputs by name: the body is read once, statement by statement, keeping
for each local name the forward parameters it was computed from and, where a layer fixes it, its feature width
(the last axis after a ``Linear``, the channel axis after a convolution). From that:

- a parameter given to a layer (directly, or through activations, dropout and ``torch.cat``) must have that
  layer's input width: ``Linear`` in_features, a convolution's in_channels, an RNN's input_size; given to an
  ``nn.Embedding`` it is integer ids below num_embeddings;
- ``torch.cat([q, action], 1)`` into ``Linear(in)``, with ``q`` already ``out`` wide: ``action`` is ``in - out``
  wide and shares ``q``'s leading axes (a condition vector, an action, a context);
- ``torch.spmm(adj, h)`` / ``torch.matmul(adj, h)`` / ``adj @ h`` with ``h`` computed from another parameter:
  ``adj`` is a square [N, N] matrix over the N rows of the node features;
- ``pack_padded_sequence(x, lengths, ...)``: ``lengths`` is sorted integer lengths, on the CPU.

A submodule of the model's own code called with a parameter (``self.encoder(x)``) is read the same way, one
level down; so is a helper the forward calls with a parameter, a method of the model or a function of the
repository (``embed(t, self.dim)``), whose asserts then bind the parameter (``assert t.dim() == 1``: one value
per sample). Nothing here runs the model: the facts become candidate inputs that the prober verifies.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

# calls that return a tensor of the same feature width as their first argument
_WIDTH_PRESERVING = frozenset({"relu", "relu_", "gelu", "tanh", "sigmoid", "elu", "selu", "leaky_relu", "silu",
                               "softplus", "dropout", "dropout2d", "softmax", "log_softmax", "mish", "hardtanh",
                               "contiguous", "float", "clone", "abs", "exp", "sin", "cos", "normalize"})
# calls that resample or pad a map's positions and keep its channels (axis 1): a convolution's width still holds
_CHANNEL_PRESERVING = frozenset({"interpolate", "upsample", "upsample_bilinear", "upsample_nearest", "pad",
                                 "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
                                 "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool2d"})
_MATRIX_PRODUCTS = frozenset({"mm", "spmm", "matmul", "bmm"})
MAX_DEPTH = 2  # submodules read below the model (an embedding block, then its value and time embeddings)
MAX_HELPERS = 2  # helper methods and functions read inside one another below the forward
_NORMALIZATIONS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)
_LAYERS_WITH_WIDTH = (nn.Linear, nn.modules.conv._ConvNd, nn.RNNBase, nn.Embedding, nn.EmbeddingBag)


@dataclass
class ParameterFacts:
    """What the body requires of one forward parameter."""

    width: Optional[int] = None  # its feature width
    layer: Optional[nn.Module] = None  # the layer that fixes it (Linear, Conv, RNN)
    vocabulary: Optional[int] = None  # integer ids below this
    adjacency: bool = False
    lengths: bool = False
    partner: Optional[str] = None  # concatenated with this parameter along the feature axis
    split_of: Optional[tuple[str, int]] = None  # (other parameter, total width) when both widths are unknown
    columns: Optional[tuple[int, int]] = None  # (count, below): one id per column, each into its own table
    time_first: bool = False  # transposed to batch-first in the body: [T, B, ...], the batch on axis 1
    state_of: Optional[nn.Module] = None  # given to this RNN as its initial state
    channels_last: bool = False  # [L, C]: its last two axes swapped before the convolution that fixes its width
    spread: bool = False  # a [B, C] vector made [B, C, 1, 1] and spread over an image's positions: C is its width
    axis_sizes: dict = field(default_factory=dict)  # axis (batch included) -> the size an assert in forward requires
    rank: Optional[int] = None  # how many axes (batch included) an assert requires: 1 is one value per sample
    why: list[str] = field(default_factory=list)

    def known(self) -> bool:
        return bool(self.width or self.vocabulary or self.adjacency or self.lengths or self.split_of or self.columns
                    or self.time_first or self.state_of is not None or self.axis_sizes or self.rank or self.spread)


def column_tables(layer: nn.Module) -> Optional[tuple[int, int]]:
    """(k, rows) for a module that holds a list of k embedding tables, one per column of its input (categorical
    features, each with its own vocabulary): its input is k integer ids per row, each below ``rows``, the
    smallest table's size. None for any other module."""
    for child in layer.children():
        if isinstance(child, nn.ModuleList) and len(child) and all(isinstance(m, nn.Embedding) for m in child):
            return len(child), min(m.num_embeddings for m in child)
    return None


def feature_weights(layer: nn.Module) -> Optional[int]:
    """n for a module without sublayers whose own parameters are all [n, d] (a weight row per input feature,
    applied as ``x[..., None] * weight``): its input has n features. None otherwise."""
    if list(layer.children()):
        return None
    shapes = [p.shape for p in layer.parameters(recurse=False)]
    if shapes and all(len(s) == 2 for s in shapes) and len({s[0] for s in shapes}) == 1 and shapes[0][0] > 1:
        return int(shapes[0][0])
    return None


@dataclass(frozen=True)
class _Value:
    sources: frozenset  # forward parameters it was computed from
    parts: Optional[tuple] = None  # along the feature axis: (parameter or None, width or None) per part
    kind: Optional[type] = None  # the layer type whose output fixed the width (Linear or a convolution)
    channels_last: bool = False  # the parameter with its last two axes swapped: [B, L, C] made [B, C, L]
    spread: bool = False  # the parameter, a [B, C] vector, with axes of size 1 added after C ([B, C, 1, 1])

    @property
    def bare(self) -> Optional[str]:
        """The parameter itself (possibly through width-preserving calls)."""
        if self.parts and len(self.parts) == 1 and self.parts[0][0] is not None:
            return self.parts[0][0]
        return None


_UNKNOWN = _Value(frozenset())


def _forward_node(model: nn.Module) -> Optional[ast.FunctionDef]:
    try:
        source = textwrap.dedent(inspect.getsource(type(model).forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def packed_parameters(model: nn.Module) -> dict[str, int]:
    """The forward parameters the body only unpacks (``ids, lengths = batch``) or indexes by constants
    (``batch[0]``, ``batch[1]``): a tuple of tensors a loader hands over as one argument. Name -> how many items
    (the unpacking's, else the highest index read plus one). Uses after the name is bound again do not count."""
    node = _forward_node(model)
    if node is None:
        return {}
    parents = {id(child): parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
    names = [a.arg for a in node.args.args[1:]]
    found: dict[str, int] = {}
    for name in names:
        rebound = min((n.lineno for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name
                       and isinstance(n.ctx, ast.Store)), default=None)
        uses = [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                and (rebound is None or n.lineno <= rebound)]
        count = 0
        for use in uses:
            parent = parents.get(id(use))
            if isinstance(parent, ast.Subscript) and parent.value is use and isinstance(parent.slice, ast.Constant) \
                    and type(parent.slice.value) is int and 0 <= parent.slice.value < 8:
                count = max(count, parent.slice.value + 1)
            elif isinstance(parent, ast.Assign) and parent.value is use and len(parent.targets) == 1 \
                    and isinstance(parent.targets[0], (ast.Tuple, ast.List)) \
                    and not any(isinstance(e, ast.Starred) for e in parent.targets[0].elts):
                count = max(count, len(parent.targets[0].elts))
            else:
                count = 0
                break
        if count:
            found[name] = count
    return found


def _unpacking(node: ast.FunctionDef, name: str) -> Optional[ast.Assign]:
    """The forward's own statement ``a, b = name`` (names only, at the top of the body), if there is one."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name) \
                and statement.value.id == name and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], (ast.Tuple, ast.List)) \
                and all(isinstance(e, ast.Name) for e in statement.targets[0].elts):
            return statement
    return None


def read_packed(model: nn.Module, depth: int = 0) -> dict[str, list[tuple[str, ParameterFacts]]]:
    """Per packed parameter the body unpacks into names (``audio, cond = pair``), what the body requires of each
    item, read as if the items were parameters of their own: a pair of tensors of different widths handed over
    as one argument. Name -> [(item name, its facts)] in order; parameters only indexed are left out."""
    node = _forward_node(model)
    if node is None:
        return {}
    found: dict[str, list[tuple[str, ParameterFacts]]] = {}
    for name in packed_parameters(model):
        unpacking = _unpacking(node, name)
        if unpacking is None:
            continue
        items = [e.id for e in unpacking.targets[0].elts]
        if len(set(items)) != len(items):
            continue
        reader = _Reader(model, items, depth)
        reader.run([statement for statement in node.body if statement is not unpacking])
        found[name] = [(item, reader.facts[item]) for item in items]
    return found


def parameters_handed_to_children(model: nn.Module) -> dict[str, tuple[nn.Module, int]]:
    """The forward parameters the body hands, as they are, to a submodule of the model: ``self.encoder(x)``,
    ``self.heads[0](x)``, or each module of a list it loops over (``for d in self.discriminators: d(y)``, also
    through ``enumerate``), read as the list's first module. Name -> (that submodule, the position it takes the
    parameter at); the first such call of each parameter. A parameter bound again before the call, outside a
    branch, does not count."""
    node = _forward_node(model)
    if node is None or not node.args.args:
        return {}
    owner = node.args.args[0].arg
    names = [a.arg for a in node.args.args[1:]]

    def child(expression: ast.AST) -> Optional[nn.Module]:
        if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name) \
                and expression.value.id == owner:
            found = getattr(model, expression.attr, None)
            return found if isinstance(found, nn.Module) else None
        if isinstance(expression, ast.Subscript) and isinstance(expression.slice, ast.Constant) \
                and type(expression.slice.value) is int:
            listed = child(expression.value)
            if isinstance(listed, (nn.ModuleList, nn.Sequential)) and -len(listed) <= expression.slice.value < len(listed):
                return listed[expression.slice.value]
        return None

    looped: dict[str, nn.Module] = {}
    for loop in ast.walk(node):
        if not isinstance(loop, ast.For):
            continue
        iterated, target = loop.iter, loop.target
        if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and iterated.func.id == "enumerate" \
                and len(iterated.args) == 1 and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            iterated, target = iterated.args[0], target.elts[1]
        listed = child(iterated)
        if isinstance(target, ast.Name) and isinstance(listed, (nn.ModuleList, nn.Sequential)) and len(listed):
            looped[target.id] = listed[0]
    conditional = {id(n) for branch in ast.walk(node) if isinstance(branch, ast.If)
                   for statement in branch.body + branch.orelse for n in ast.walk(statement)}
    # bound again before the call, unconditionally (``x = self.embed(x)``); a branch (``if i: y = pool(y)``) may not run
    stores = {name: [n.lineno for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name
                     and isinstance(n.ctx, ast.Store) and id(n) not in conditional] for name in names}
    found: dict[str, tuple[nn.Module, int]] = {}
    for call in sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
        module = looped.get(call.func.id) if isinstance(call.func, ast.Name) else child(call.func)
        if module is None or module is model:
            continue
        for position, argument in enumerate(call.args):
            if isinstance(argument, ast.Name) and argument.id in stores and argument.id not in found \
                    and not any(line < call.lineno for line in stores[argument.id]):
                found[argument.id] = (module, position)
    return found


def _is_minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
        and node.operand.value == 1


def _constants(node: ast.Call) -> Optional[list[int]]:
    values = []
    for argument in node.args:
        if isinstance(argument, ast.Constant) and isinstance(argument.value, int):
            values.append(argument.value)
        elif isinstance(argument, ast.UnaryOp) and isinstance(argument.op, ast.USub) \
                and isinstance(argument.operand, ast.Constant) and isinstance(argument.operand.value, int):
            values.append(-argument.operand.value)
        else:
            return None
    return values


def _swaps_first_two_axes(node: ast.Call) -> bool:
    """``.transpose(0, 1)`` or ``.permute(1, 0, ...)`` (three axes or more: the last one stays)."""
    values = _constants(node)
    return values is not None and (sorted(values) == [0, 1] and _call_name(node.func) == "transpose"
                                   or len(values) >= 3 and values[:2] == [1, 0])


def _swaps_last_two_axes(node: ast.Call) -> bool:
    """``.permute(0, 2, 1)``, ``.transpose(1, 2)`` or ``.transpose(-1, -2)`` (of a three-axis tensor)."""
    values = _constants(node)
    if values is None:
        return False
    if _call_name(node.func) == "transpose":
        return sorted(values) in ([1, 2], [-2, -1])
    return values == [0, 2, 1]


def _singleton_axes_after_features(node: ast.Call) -> bool:
    """``v.view(v.size(0), v.size(1), 1, 1)`` / ``v.reshape(-1, k, 1, 1)`` / ``v.view(*v.shape, 1, 1)``: a
    [B, C] vector given axes of size 1 after its features, to broadcast over an image's positions."""
    arguments = node.args
    if arguments and isinstance(arguments[0], ast.Starred):
        arguments = [None, None] + arguments[1:]
    if len(arguments) < 3:
        return False
    return all(isinstance(a, ast.Constant) and a.value == 1 for a in arguments[2:])


def _keeps_channel_axis(name: str, node: ast.Call) -> bool:
    """A call that leaves axis 1 of a [B, C, 1, 1] tensor where it is: ``repeat(1, 1, H, W)``, ``expand(...)``,
    ``expand_as(x)``."""
    if name in ("expand", "expand_as"):
        return True
    return name == "repeat" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
        and node.args[1].value == 1


def _keeps_last_axis(name: str, node: ast.Call) -> bool:
    """A method call that leaves a tensor's last axis (its feature width) where it is: ``transpose(0, 1)``,
    ``repeat(t, 1, 1)`` (the last factor 1), ``unsqueeze(0)``."""
    if name == "transpose":
        return _swaps_first_two_axes(node)
    if name == "repeat":
        last = node.args[-1] if node.args else None
        return isinstance(last, ast.Constant) and last.value == 1
    if name == "unsqueeze":
        values = _constants(node)
        return values in ([0], [1])
    return False


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


class _Reader:
    def __init__(self, model: nn.Module, parameters: list[str], depth: int):
        self.model, self.depth = model, depth
        self.facts: dict[str, ParameterFacts] = {p: ParameterFacts() for p in parameters}
        self.env: dict[str, _Value] = {p: _Value(frozenset({p}), ((p, None),)) for p in parameters}
        self.reading: set[str] = set()  # helper methods being read (no recursion)
        self.aliases: dict[str, ast.AST] = {}  # loop names bound to an expression (``module`` to ``self.encoder``)
        self.axes: dict[str, tuple[str, int]] = {}  # ``B, C, H, W = x.shape``: H is axis 2 of x
        # in a helper's body, its parameters bound to a forward parameter passed unchanged (``embed(t)``: t)
        self.unchanged: dict[str, str] = {}
        forward = getattr(type(model), "forward", None)
        self.globals: dict = getattr(forward, "__globals__", {})  # where a called function's name is looked up

    # -- statements, in order; both branches of an `if` and loop bodies are read as straight-line code
    def run(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            if isinstance(statement, ast.Assert):
                self._asserted_sizes(statement.test)
            elif isinstance(statement, ast.Assign):
                self._unpacked_shape(statement)
                value = self.value(statement.value)
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        self.env[target.id] = value
                        self.unchanged.pop(target.id, None)
                    elif isinstance(target, (ast.Tuple, ast.List)):  # out, hidden = self.rnn(x): derived, width unknown
                        for element in target.elts:
                            if isinstance(element, ast.Name):
                                self.env[element.id] = _Value(value.sources)
            elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
                self.value(statement.value)
            elif isinstance(statement, (ast.Expr, ast.Return)) and statement.value is not None:
                self.value(statement.value)
            elif isinstance(statement, ast.For) and self._unrolled(statement):
                continue
            elif isinstance(statement, (ast.If, ast.For, ast.While, ast.With)):
                self.run(statement.body + getattr(statement, "orelse", []))

    def _shape_of(self, node: ast.AST) -> Optional[str]:
        """The forward parameter whose shape ``node`` is (``x.shape``, ``x.size()``)."""
        if isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "size":
            node = ast.Attribute(value=node.func.value, attr="shape")
        if isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name):
            return self._unchanged(node.value.id)
        return None

    def _unchanged(self, name: str) -> Optional[str]:
        """The forward parameter the local ``name`` still is: the parameter itself, or a helper's parameter it
        was passed to unchanged."""
        value = self.env.get(name)
        if value is None or value.bare is None or value.bare not in self.facts:
            return None
        return value.bare if value.bare == name or self.unchanged.get(name) == value.bare else None

    def _rank_of(self, node: ast.AST) -> Optional[str]:
        """The forward parameter whose number of axes ``node`` is (``len(x.shape)``, ``x.dim()``, ``x.ndim``)."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" \
                and len(node.args) == 1:
            return self._shape_of(node.args[0])
        if isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("dim", "ndimension"):
            node = node.func
        if isinstance(node, ast.Attribute) and node.attr in ("ndim", "dim", "ndimension") \
                and isinstance(node.value, ast.Name):
            return self._unchanged(node.value.id)
        return None

    def _unpacked_shape(self, statement: ast.Assign) -> None:
        """``B, C, H, W = x.shape``: each name is one axis of the parameter ``x``."""
        parameter = self._shape_of(statement.value)
        for target in statement.targets:
            if parameter is not None and isinstance(target, (ast.Tuple, ast.List)) and \
                    not any(isinstance(e, ast.Starred) for e in target.elts):
                for axis, element in enumerate(target.elts):
                    if isinstance(element, ast.Name):
                        self.axes[element.id] = (parameter, axis)
            elif isinstance(target, ast.Name):
                self.axes.pop(target.id, None)

    def _axis(self, node: ast.AST) -> Optional[tuple[str, int]]:
        """(parameter, axis) for ``x.shape[2]``, ``x.size(2)``, ``x.size(-1)`` or a name unpacked from ``x.shape``."""
        if isinstance(node, ast.Name):
            return self.axes.get(node.id)
        index = None
        if isinstance(node, ast.Subscript):
            parameter, index = self._shape_of(node.value), node.slice
        elif isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "size":
            parameter, index = self._shape_of(ast.Attribute(value=node.func.value, attr="shape")), node.args[0]
        else:
            return None
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and isinstance(index.operand, ast.Constant):
            index = ast.Constant(-index.operand.value)
        if parameter is None or not isinstance(index, ast.Constant) or not isinstance(index.value, int):
            return None
        return parameter, index.value

    def _model_size(self, node: ast.AST) -> Optional[int]:
        """A size the built model holds (``self.resolution``, ``self.img_size[0]``) or a literal one."""
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, int) and not isinstance(node.value, bool) else None
        index = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            node, index = node.value, node.slice.value
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
            return None
        value = getattr(self.model, node.attr, None)
        if index is not None:
            try:
                value = value[index] if isinstance(value, (tuple, list)) else None
            except IndexError:
                return None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def _asserted_sizes(self, test: ast.AST) -> None:
        """``assert x.shape[2] == x.shape[3] == self.resolution`` / ``assert H == self.img_size[0]``: the axes
        compared for equality with one size of the model must have that size."""
        for compare in ast.walk(test):
            if not isinstance(compare, ast.Compare) or not all(isinstance(op, ast.Eq) for op in compare.ops):
                continue
            operands = [compare.left, *compare.comparators]
            ranked = [p for p in (self._rank_of(o) for o in operands) if p is not None]
            literal = {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, int)
                       and not isinstance(o.value, bool) and o.value > 0}
            if ranked and len(literal) == 1:
                rank = literal.pop()
                for parameter in ranked:
                    self._note(parameter, "rank", rank, f"{rank} axes asserted"
                               + (" (one value per sample)" if rank == 1 else ""))
            axes = [a for a in (self._axis(o) for o in operands) if a is not None]
            sizes = {v for v in (self._model_size(o) for o in operands) if v is not None}
            if axes and len(sizes) == 1:
                size = sizes.pop()
                for parameter, axis in axes:
                    self.facts[parameter].axis_sizes[axis] = size
                    self.facts[parameter].why.append(f"axis {axis} asserted to be {size} in the forward")

    def _unrolled(self, loop: ast.For) -> bool:
        """A loop over a literal list of tuples (``for name, x, module in [("a", a, self.enc_a), ...]``), read
        once per tuple with its names bound to the tuple's expressions: ``module(x)`` is ``self.enc_a(a)``."""
        rows = loop.iter.elts if isinstance(loop.iter, (ast.List, ast.Tuple)) else []
        names = loop.target.elts if isinstance(loop.target, (ast.Tuple, ast.List)) else []
        if not rows or not names or not all(isinstance(n, ast.Name) for n in names) \
                or not all(isinstance(r, (ast.Tuple, ast.List)) and len(r.elts) == len(names) for r in rows):
            return False
        saved = dict(self.aliases)
        try:
            for row in rows:
                for name, expression in zip(names, row.elts):
                    self.aliases[name.id] = expression
                    self.env[name.id] = self.value(expression)
                self.run(loop.body + loop.orelse)
        finally:
            self.aliases = saved
        return True

    def _layer(self, func: ast.AST) -> Optional[nn.Module]:
        """``self.fc`` or ``self.layers[0]`` as a module of the model (or a loop name bound to one)."""
        if isinstance(func, ast.Name) and func.id in self.aliases:
            func = self.aliases[func.id]
        index = None
        if isinstance(func, ast.Subscript) and isinstance(func.slice, ast.Constant) and isinstance(func.slice.value, int):
            index, func = func.slice.value, func.value
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
            return None
        module = getattr(self.model, func.attr, None)
        if index is not None:
            try:
                module = module[index]
            except Exception:  # noqa: BLE001 - not indexable: not a layer we can read
                return None
        return module if isinstance(module, nn.Module) else None

    def value(self, node: ast.AST) -> _Value:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, _UNKNOWN)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return self._over_modules(node)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id not in self.axes:
            index = self.env.get(node.slice.id, _UNKNOWN)
            if index.sources:  # ``x[order]``, an index tensor made from the inputs (a batch sorted by length): rows
                base = self.value(node.value)  # chosen or reordered, each row's shape kept
                return dataclasses.replace(base, sources=base.sources | index.sources)
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(node.op, ast.MatMult):
                return self._matrix_product(node.left, left, right, node.right)
            sources = left.sources | right.sources
            kept = left if left.parts else right
            return _Value(sources, kept.parts, kept.kind)
        sources: set = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                sources |= self.value(child).sources
        return _Value(frozenset(sources))

    def _over_modules(self, node: ast.AST) -> _Value:
        """``[head(x, adj) for head in self.heads]``: each head is read like ``self.heads[0](x, adj)``."""
        sources: set = set()
        for generator in node.generators:
            sources |= self.value(generator.iter).sources
        element = node.elt
        if len(node.generators) == 1 and isinstance(node.generators[0].target, ast.Name) \
                and isinstance(element, ast.Call) and isinstance(element.func, ast.Name) \
                and element.func.id == node.generators[0].target.id:
            iterated = node.generators[0].iter
            modules = getattr(self.model, iterated.attr, None) if isinstance(iterated, ast.Attribute) \
                and isinstance(iterated.value, ast.Name) and iterated.value.id == "self" else None
            first = next(iter(modules), None) if isinstance(modules, (nn.ModuleList, nn.Sequential, list, tuple)) else None
            if isinstance(first, nn.Module):
                arguments = [self.value(a) for a in element.args]
                sources |= frozenset().union(*(a.sources for a in arguments)) if arguments else frozenset()
                return self._through_layer(first, element, arguments[0] if arguments else _UNKNOWN,
                                           frozenset(sources))
        return _Value(frozenset(sources))

    def _matrix_product(self, left_node: ast.AST, left: _Value, right: _Value, right_node: ast.AST) -> _Value:
        parameter = left.bare if isinstance(left_node, ast.Name) else None
        if parameter and right.sources and parameter not in right.sources:
            self._note(parameter, "adjacency", True, "a square matrix multiplying node features in the forward")
        weight = self._weight(right_node)
        if weight is not None and weight.dim() == 2:  # x @ self.W: x is W's rows wide, the product W's columns
            if left.parts and len(left.parts) == 1 and left.parts[0][0] and not left.parts[0][1]:
                self._note(left.parts[0][0], "width", int(weight.shape[0]),
                           f"{int(weight.shape[0])} wide into a product with a {list(weight.shape)} weight")
            return _Value(left.sources, ((None, int(weight.shape[1])),), nn.Linear)
        return _Value(left.sources | right.sources)

    def _weight(self, node: ast.AST) -> Optional[nn.Parameter]:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            value = getattr(self.model, node.attr, None)
            return value if isinstance(value, nn.Parameter) else None
        return None

    def _call(self, node: ast.Call) -> _Value:
        name = _call_name(node.func)
        arguments = [self.value(a) for a in node.args]
        sources = frozenset().union(*(a.sources for a in arguments)) if arguments else frozenset()
        for keyword in node.keywords:
            sources |= self.value(keyword.value).sources
        receiver = _UNKNOWN  # x.view(...), self.fc(h).view(...): what the method is called on
        if isinstance(node.func, ast.Attribute) and not (isinstance(node.func.value, ast.Name)
                                                         and node.func.value.id in ("self", "torch", "F", "nn")):
            receiver = self.value(node.func.value)
            sources |= receiver.sources
        first = arguments[0] if arguments else _UNKNOWN
        layer = self._layer(node.func)
        if layer is not None:
            return self._through_layer(layer, node, first, sources)
        if name == "cat" and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
            return self._concatenation([self.value(e) for e in node.args[0].elts], sources)
        if name in _MATRIX_PRODUCTS and len(node.args) >= 2:
            return self._matrix_product(node.args[0], arguments[0], arguments[1], node.args[1])
        if name == "pack_padded_sequence" and len(node.args) >= 2 and arguments[1].bare:
            self._note(arguments[1].bare, "lengths", True, "the lengths given to pack_padded_sequence")
        if name == "sort" and isinstance(node.func, ast.Attribute):
            self._sorted_lengths(node)
        if name == "permute" and isinstance(node.func, ast.Attribute):
            self._permuted_rank(node)
        if name in _WIDTH_PRESERVING and isinstance(node.func, (ast.Name, ast.Attribute)):
            if receiver.parts:  # h.relu(), h.contiguous()
                return _Value(sources, receiver.parts, receiver.kind)
            if arguments:
                return _Value(sources, first.parts, first.kind)
        if name in _CHANNEL_PRESERVING and arguments and first.parts and first.kind is not nn.Linear \
                and not receiver.parts:  # F.interpolate(x, size=...): x's channels reach the next convolution
            return _Value(sources, first.parts, first.kind)
        if name in ("transpose", "permute") and receiver.bare and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and _swaps_first_two_axes(node):
            self._note(receiver.bare, "time_first", True, f"'{receiver.bare}' made batch-first by .{name}(...) in "
                                                          "the forward: [T, B, ...]")
        if name in ("transpose", "permute") and receiver.bare and isinstance(node.func, ast.Attribute) \
                and _swaps_last_two_axes(node):  # x.permute(0, 2, 1) into a Conv1d: x is [B, L, C]
            return _Value(sources, receiver.parts, receiver.kind, channels_last=True)
        if name in ("view", "reshape") and receiver.bare and isinstance(node.func, ast.Attribute) \
                and _singleton_axes_after_features(node):  # c.view(B, C, 1, 1): a vector spread over positions
            return _Value(sources, receiver.parts, receiver.kind, spread=True)
        if receiver.spread and _keeps_channel_axis(name, node):  # c.repeat(1, 1, H, W): still C on axis 1
            return _Value(sources, receiver.parts, receiver.kind, spread=True)
        if _keeps_last_axis(name, node) and receiver.parts:  # x.transpose(0, 1), h.repeat(t, 1, 1), h.unsqueeze(0)
            return _Value(sources, receiver.parts, receiver.kind)
        if name in ("view", "reshape") and isinstance(node.func, ast.Attribute) and len(node.args) == 2 \
                and _is_minus_one(node.args[0]) and isinstance(node.args[1], ast.Constant):
            # t.view(-1, k): any tensor of B * k values, as wide as k where a layer needs it
            return _Value(sources, receiver.parts)
        helper = self._helper(node.func)
        if helper is not None and len(self.reading) < MAX_HELPERS:
            self._read_helper(*helper, node.args, [self.value(a) for a in node.args])
        return _Value(sources)

    def _helper(self, func: ast.AST) -> Optional[tuple[ast.FunctionDef, bool, dict]]:
        """``self.score`` as a method of the model's class (not a submodule), or ``embed`` / ``utils.embed`` as a
        function of the repository's own code: (its parsed definition, whether it takes ``self`` first, the
        globals its names are looked up in)."""
        method = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        if method:
            function = inspect.getattr_static(type(self.model), func.attr, None)
        elif isinstance(func, ast.Name):
            function = self.globals.get(func.id)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and inspect.ismodule(self.globals.get(func.value.id)):
            function = getattr(self.globals[func.value.id], func.attr, None)
        else:
            return None
        if not inspect.isfunction(function) or function.__name__ in self.reading \
                or (not method and not _repository_code(function)):
            return None
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            return None
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)
        return (node, method, function.__globals__) if node is not None else None

    def _read_helper(self, helper: ast.FunctionDef, method: bool, names_in: dict, argument_nodes: list[ast.expr],
                     arguments: list[_Value]) -> None:
        """Read a helper's body with its parameters bound to the caller's values: what it requires of them
        (a width, an assert) is required of the forward parameters they come from."""
        names = [a.arg for a in helper.args.posonlyargs + helper.args.args][1 if method else 0:]
        unchanged = {name: self._unchanged(node.id) for name, node in zip(names, argument_nodes)
                     if isinstance(node, ast.Name) and self._unchanged(node.id)}
        saved = self.env, self.unchanged, self.axes, self.globals
        self.env, self.unchanged, self.axes = dict(zip(names, arguments)), unchanged, {}
        if not method:
            self.globals = names_in
        self.reading.add(helper.name)
        try:
            self.run(helper.body)
        finally:
            self.env, self.unchanged, self.axes, self.globals = saved
            self.reading.discard(helper.name)

    def _concatenation(self, values: list[_Value], sources: frozenset) -> _Value:
        for value in values:  # torch.cat([x, c_map], 1): c's features are channels beside x's
            if value.spread and value.bare:
                self._note(value.bare, "spread", True, "a vector given one value per channel at every position "
                                                       "(made [B, C, 1, 1] and repeated) in the forward")
        bare = [v.bare for v in values]
        for one, other in zip(bare, bare[1:]):
            if one and other:
                self.facts[one].partner = self.facts[one].partner or other
                self.facts[other].partner = self.facts[other].partner or one
        if any(not v.parts for v in values):
            return _Value(sources)
        kinds = {v.kind for v in values if v.kind is not None}
        return _Value(sources, tuple(p for v in values for p in v.parts), next(iter(kinds)) if len(kinds) == 1 else None)

    def _through_layer(self, layer: nn.Module, node: ast.Call, first: _Value, sources: frozenset) -> _Value:
        if isinstance(layer, nn.Sequential) and len(layer):
            layer = next((m for m in layer.modules() if isinstance(m, _LAYERS_WITH_WIDTH)), layer)
        if isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
            if first.bare:
                self._note(first.bare, "vocabulary", layer.num_embeddings,
                           f"ids given to Embedding({layer.num_embeddings}, {layer.embedding_dim})")
            return _Value(sources, ((None, layer.embedding_dim),), nn.Linear)
        width = None
        if isinstance(layer, nn.Linear):
            width, out, kind = layer.in_features, layer.out_features, nn.Linear
        elif isinstance(layer, nn.modules.conv._ConvNd):
            width, out, kind = layer.in_channels, layer.out_channels, type(layer)
        elif isinstance(layer, nn.RNNBase):
            width, out, kind = layer.input_size, None, None
            state = self.value(node.args[1]) if len(node.args) >= 2 else _UNKNOWN
            if state.bare and isinstance(node.args[1], ast.Name):
                self._note(state.bare, "state_of", layer, f"the initial state of {describe_layer(layer)}")
        if width:
            self._require(first, width, layer)
            if first.spread and first.bare and isinstance(layer, nn.modules.conv._ConvNd):
                self._note(first.bare, "spread", True, f"a vector spread over the positions {describe_layer(layer)} reads")
            if first.channels_last and first.bare and isinstance(layer, nn.modules.conv._ConvNd):
                self._note(first.bare, "channels_last", True, f"its last two axes swapped before {describe_layer(layer)}")
            return _Value(sources, ((None, out),) if out else None, kind)
        if type(layer).forward is not nn.Module.forward and not any(True for _ in layer.parameters(recurse=False)) \
                and not list(layer.children()):
            return _Value(sources, first.parts, first.kind)  # an activation or dropout module
        if isinstance(layer, _NORMALIZATIONS):  # a normalization keeps its input's width (BatchNorm2d(48) after a
            return _Value(sources, first.parts, first.kind)  # 48-channel convolution)
        inner = read_forward(layer, self.depth + 1) if self.depth < MAX_DEPTH and node.args else {}
        if first.bare and not next(iter(inner.values()), ParameterFacts()).known():
            tables, features = column_tables(layer), feature_weights(layer)
            if tables is not None:
                self._note(first.bare, "columns", tables, f"{tables[0]} columns of ids, one per embedding table of "
                                                          f"{type(layer).__name__} (the smallest has {tables[1]} rows)")
            elif features is not None:
                self._note(first.bare, "width", features, f"{features} features, one per row of the weights of "
                                                          f"{type(layer).__name__}")
        if inner:  # the model's own submodule (two levels down at most): what its forward requires
            for argument, facts in zip(node.args, inner.values()):
                parameter = self.value(argument).bare if isinstance(argument, ast.Name) else None
                if parameter is None or not facts.known():
                    continue
                mine = self.facts[parameter]
                for key in ("width", "layer", "vocabulary", "adjacency", "lengths", "columns", "time_first",
                            "state_of", "channels_last", "rank", "spread"):
                    if getattr(facts, key) and not getattr(mine, key):
                        setattr(mine, key, getattr(facts, key))
                mine.why += [f"{why} in {type(layer).__name__}" for why in facts.why]
        return _Value(sources)

    def _require(self, value: _Value, width: int, layer: nn.Module) -> None:
        """``value`` enters ``layer``, whose input is ``width`` wide: solve for the parts of unknown width."""
        if not value.parts:
            return
        known = sum(w for _, w in value.parts if w)
        unknown = [p for p, w in value.parts if not w]
        if len(unknown) == 1 and unknown[0] is not None and width > known:
            self._note(unknown[0], "width", width - known, f"{width - known} wide into {describe_layer(layer)}"
                       + (f" after {known} computed features" if known else ""))
            self.facts[unknown[0]].layer = self.facts[unknown[0]].layer or layer
        elif len(unknown) == 2 and all(unknown) and not known:
            a, b = unknown
            if not self.facts[a].width and not self.facts[b].width:
                self.facts[a].split_of = (b, width)
                self.facts[b].split_of = (a, width)
                for p in (a, b):
                    self.facts[p].layer = self.facts[p].layer or layer

    def _permuted_rank(self, node: ast.Call) -> None:
        """``x.permute(0, 2, 1)`` names every axis of what it permutes: x has that many, less one for each
        ``unfold`` between them (``x.unfold(1, n, n).permute(0, 2, 1)``: frames cut from a [B, T] signal)."""
        if not node.args or node.keywords or not all(isinstance(a, ast.Constant) and type(a.value) is int
                                                      for a in node.args):
            return
        receiver, added = node.func.value, 0
        while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
                and receiver.func.attr == "unfold" and len(receiver.args) == 3:
            receiver, added = receiver.func.value, added + 1
        if not isinstance(receiver, ast.Name):
            return
        parameter = self._unchanged(receiver.id)
        rank = len(node.args) - added
        if parameter is not None and parameter in self.facts and rank >= 1:
            self._note(parameter, "rank", rank, f"{len(node.args)} axes permuted"
                       + (f" after {added} unfold" if added else ""))

    def _sorted_lengths(self, node: ast.Call) -> None:
        """``lengths.sort(dim=0, descending=True)`` (also of ``lengths.squeeze(1)``): a batch ordered longest
        first, the idiom of sequence lengths; a squeezed axis is one of size 1 ([B, 1] lengths)."""
        if not any(k.arg == "descending" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in node.keywords):
            return
        receiver, squeezed = node.func.value, None
        if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
                and receiver.func.attr == "squeeze" and len(receiver.args) == 1 \
                and isinstance(receiver.args[0], ast.Constant) and type(receiver.args[0].value) is int \
                and receiver.args[0].value > 0:
            receiver, squeezed = receiver.func.value, receiver.args[0].value
        if not isinstance(receiver, ast.Name):
            return
        parameter = self._unchanged(receiver.id)
        if parameter is None or parameter not in self.facts:
            return
        self._note(parameter, "lengths", True, "sorted longest first, as sequence lengths are")
        if squeezed is not None and not self.facts[parameter].axis_sizes:
            self.facts[parameter].axis_sizes = {squeezed: 1}

    def _note(self, parameter: str, key: str, value: Any, why: str) -> None:
        facts = self.facts.get(parameter)
        if facts is None or getattr(facts, key):
            return
        setattr(facts, key, value)
        facts.why.append(why)


def _repository_code(function: Any) -> bool:
    """A function of the code under test, not of Python, torch or another installed package."""
    try:
        path = inspect.getsourcefile(function) or ""
    except TypeError:
        return False
    top = (function.__module__ or "").split(".")[0]
    return bool(path) and top not in sys.stdlib_module_names and top not in ("torch", "numpy", "einops") \
        and not any(part in path for part in ("site-packages", "dist-packages"))


def describe_layer(layer: nn.Module) -> str:
    if isinstance(layer, nn.Linear):
        return f"Linear({layer.in_features}→{layer.out_features})"
    if isinstance(layer, nn.modules.conv._ConvNd):
        return f"{type(layer).__name__}({layer.in_channels}→{layer.out_channels})"
    if isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
        return f"{type(layer).__name__}({layer.num_embeddings}, {layer.embedding_dim})"
    if isinstance(layer, nn.RNNBase):
        return f"{type(layer).__name__}(input_size={layer.input_size}, batch_first={layer.batch_first})"
    return type(layer).__name__


def read_forward(model: nn.Module, depth: int = 0) -> dict[str, ParameterFacts]:
    """Per positional parameter of ``model.forward`` (in order, ``self`` left out), what its body requires;
    empty when the source cannot be read."""
    node = _forward_node(model)
    if node is None:
        return {}
    parameters = [a.arg for a in node.args.posonlyargs + node.args.args][1:]
    reader = _Reader(model, parameters, depth)
    reader.run(node.body)
    return reader.facts


# what a distribution's probabilities are consumed by: sampling from them, their logarithm, a distribution made of
# them (``Categorical(probs)``); a loss that expects logits is none of these
_PROBABILITY_READERS = frozenset({"multinomial", "log", "log2", "log10", "Categorical", "OneHotCategorical",
                                  "RelaxedOneHotCategorical", "Multinomial", "Bernoulli"})


def output_read_as_probabilities(model: nn.Module) -> str:
    """The method of the model's own class (or a base's, in the repository) that takes ``self.forward(...)`` /
    ``self(...)`` and reads it as probabilities: samples from it, takes its log, or makes a distribution of it
    (``probs = self.forward(x); probs.multinomial(1)``). A softmax ending such a forward is the design (a policy's
    action probabilities), not a softmax before a loss that expects logits. "" when no method does."""
    for cls in type(model).__mro__:
        if cls in (nn.Module, object) or not _repository_code(cls):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        for method in ast.walk(tree):
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or method.name == "forward":
                continue
            outputs = {target.id for node in ast.walk(method) if isinstance(node, ast.Assign)
                       and _calls_own_forward(node.value) for target in node.targets if isinstance(target, ast.Name)}
            for node in ast.walk(method):
                if not isinstance(node, ast.Call) or _call_name(node.func) not in _PROBABILITY_READERS:
                    continue
                read = [*node.args, *(k.value for k in node.keywords)]
                if isinstance(node.func, ast.Attribute):
                    read.append(node.func.value)
                if any(_calls_own_forward(e) or isinstance(e, ast.Name) and e.id in outputs
                       or _reads_output(e, outputs) for e in read):
                    return f"{cls.__name__}.{method.name}"
    return ""


def _calls_own_forward(node: ast.AST) -> bool:
    """``self.forward(...)`` or ``self(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return isinstance(func, ast.Name) and func.id == "self" or isinstance(func, ast.Attribute) \
        and func.attr == "forward" and isinstance(func.value, ast.Name) and func.value.id == "self"


def _reads_output(node: ast.AST, outputs: set[str]) -> bool:
    """An indexing or gather of the output (``probs.gather(1, a)``, ``probs[:, a]``), still its probabilities."""
    while isinstance(node, (ast.Subscript, ast.Call)):
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("gather", "squeeze", "unsqueeze", "view"):
            node = node.func.value
        else:
            return False
    return isinstance(node, ast.Name) and node.id in outputs
