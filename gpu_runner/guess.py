"""Constructor arguments for real models: what the constructor's own code says about each argument.

``build._guess_arguments`` asks here when an argument's name is not in its table. Everything comes from
the model's module: how ``__init__`` uses the argument (``assert len(dims) == 3``, ``block(...)`` and
``block.expansion``, ``cfg[vgg_name]``, ``rnn_type in ['LSTM', 'GRU']``, ``config.n_embd``), the config
classes and ``get_default_config()`` next to it, and the module's own factory functions. Sizes are
shrunk (depth 2, narrow widths, heads dividing widths) so that a smoke run costs seconds.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

CONFIG_NAMES = ("config", "cfg", "conf", "args", "opt", "opts", "hparams", "hp", "params", "model_config",
                "model_cfg", "configs", "options", "settings")
_CONFIG_CLASS_WORDS = ("config", "cfg", "args", "params", "options", "settings")


@dataclass
class Usage:
    """How the constructor uses one argument."""

    attributes: list[str] = field(default_factory=list)  # arg.X read (in order)
    called: bool = False  # arg(...)
    stored_and_called: bool = False  # self.X = arg, and a method calls self.X(...): a module instance
    length: Optional[int] = None  # assert len(arg) == N, or a, b = arg
    max_index: Optional[int] = None  # arg[i]
    is_tuple: bool = False  # isinstance(arg, tuple)
    iterated: bool = False  # for _ in arg / zip(arg, ...)
    choices: list[Any] = field(default_factory=list)  # arg in {...} / arg == 'x'
    dict_keys: list[Any] = field(default_factory=list)  # MODULE_DICT[arg]
    free_size: bool = False  # a size no other shape depends on: a layer's output width, a table's number of rows
    # a count that only sets how many times a method loops (``self.t = t``, then ``for _ in range(self.t)`` in
    # ``forward``; or handed on to a class of the module that does): the smallest value that keeps the loop's
    # body running (1 when every ``range`` reads it bare, else 2); None for anything else
    loop_floor: Optional[int] = None


# Layers whose output width (out_features, out_channels) or number of rows (num_embeddings) is free: the layer
# alone fixes it, so an argument used only there can be made smaller without breaking any other shape. Position of
# that size among the positional arguments, and its keyword.
_FREE_SIZES = {**{name: (1, "out_features") for name in ("Linear", "LazyLinear")},
               **{name: (1, "out_channels") for name in ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
                                                         "ConvTranspose2d", "ConvTranspose3d")},
               **{name: (0, "num_embeddings") for name in ("Embedding", "EmbeddingBag")}}


def _parsed_source(obj: Any) -> Optional[ast.Module]:
    """The syntax tree of ``obj``'s source; a method whose lines mix tabs and spaces (``dedent`` then finds no
    common margin) is parsed inside a block instead."""
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    for text in (textwrap.dedent(source), "if True:\n" + source):
        try:
            return ast.parse(text)
        except SyntaxError:
            continue
    return None


def _function_node(function: Callable) -> Optional[ast.FunctionDef]:
    tree = _parsed_source(function)
    if tree is None:
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _class_functions(cls: type) -> list[ast.FunctionDef]:
    tree = _parsed_source(cls)
    if tree is None:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def argument_usage(function: Callable, module: Optional[types.ModuleType], owner: Optional[type] = None) -> dict[str, Usage]:
    """Per parameter of ``function`` (a class's ``__init__`` or a factory), how its body uses it; for a class,
    also how its other methods use a parameter of the same name (``self._make_layer(block, ...)``)."""
    node = _function_node(function)
    if node is None:
        return {}
    names = {a.arg for a in node.args.args + node.args.kwonlyargs} - {"self"}
    usage: dict[str, Usage] = {name: Usage() for name in names}
    for other in (_class_functions(owner) if owner is not None else []):
        if other.name == "__init__":
            continue
        shared = names & {a.arg for a in other.args.args + other.args.kwonlyargs}
        if shared:
            _collect_usage(other, shared, usage, module)
    _collect_usage(node, names, usage, module)
    if owner is not None:
        for name in _stored_and_called(node, _class_functions(owner)) & names:
            usage[name].stored_and_called = True
        for name, floor in _loop_counts(node, owner, module, names).items():
            usage[name].loop_floor = floor
    return usage


MAX_LOOP_COUNT_DEPTH = 4  # classes followed when a count is handed on from constructor to constructor


def _loop_counts(init: ast.FunctionDef, owner: type, module: Optional[types.ModuleType], names: set,
                 depth: int = 0) -> dict[str, int]:
    """The parameters of ``init`` whose every use is a loop count, with the smallest value each loop keeps
    running at: ``self.X = arg`` where the class's other methods read ``self.X`` only as ``range``'s argument
    (1 when bare, 2 inside arithmetic: ``range(self.X - 1)``), or ``Cls(..., arg)`` for a class of ``module``
    whose parameter there is such a count itself (followed through ``MAX_LOOP_COUNT_DEPTH`` classes). A
    parameter with any other use (a shape, a layer count built in ``__init__``, a condition) is left out."""
    parents = {child: parent for parent in ast.walk(init) for child in ast.iter_child_nodes(parent)}
    methods = [f for f in _class_functions(owner) if f.name != "__init__"]
    floors: dict[str, int] = {}
    refused: set[str] = set()
    for sub in ast.walk(init):
        if not (isinstance(sub, ast.Name) and sub.id in names and isinstance(sub.ctx, ast.Load)):
            continue
        floor = _count_floor(sub, parents, methods, module, depth)
        if floor is None:
            refused.add(sub.id)
        else:
            floors[sub.id] = max(floors.get(sub.id, 1), floor)
    return {name: floor for name, floor in floors.items() if name not in refused}


def _count_floor(use: ast.Name, parents: dict, methods: list[ast.FunctionDef],
                 module: Optional[types.ModuleType], depth: int) -> Optional[int]:
    """For one read of a parameter in ``__init__``: the loop floor it allows (``_loop_counts``), None when
    this use is not a loop count's."""
    parent = parents.get(use)
    target = None
    if isinstance(parent, ast.Assign) and parent.value is use and len(parent.targets) == 1:
        target = parent.targets[0]
    elif isinstance(parent, ast.Tuple) and isinstance(parents.get(parent), ast.Assign) \
            and parents[parent].value is parent and len(parents[parent].targets) == 1 \
            and isinstance(parents[parent].targets[0], ast.Tuple) \
            and len(parents[parent].targets[0].elts) == len(parent.elts):  # self.a, self.b = a, b
        target = parents[parent].targets[0].elts[parent.elts.index(use)]
    if target is not None:
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            return _attribute_loop_floor(target.attr, methods)
        return None
    call = parents.get(parent) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call) or use is call.func or module is None or depth >= MAX_LOOP_COUNT_DEPTH \
            or not isinstance(call.func, ast.Name):
        return None
    cls = getattr(module, call.func.id, None)
    if not inspect.isclass(cls) or getattr(cls, "__module__", None) != module.__name__:
        return None
    node = _function_node(cls.__init__)
    if node is None:
        return None
    positional = [a.arg for a in node.args.args][1:]  # past self
    if isinstance(parent, ast.keyword):
        name = parent.arg
    else:
        index = call.args.index(use)
        name = positional[index] if index < len(positional) and \
            not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]) else None
    if name is None:
        return None
    inner = _loop_counts(node, cls, module, {a.arg for a in node.args.args + node.args.kwonlyargs} - {"self"},
                         depth + 1)
    return inner.get(name)


def _loop_index_unused_as_index(call: ast.Call, parents: dict) -> bool:
    """``call`` (a ``range``) is what a ``for`` loop or a comprehension iterates, and the loop's variable never
    indexes or slices anything: ``x[:, i]`` ties the count to a size of the data, a recurrence's ``if i == 0``
    does not."""
    loop = parents.get(call)
    if isinstance(loop, ast.For) and loop.iter is call:
        scope: list[ast.AST] = [*loop.body, *loop.orelse]
    elif isinstance(loop, ast.comprehension) and loop.iter is call and parents.get(loop) is not None:
        scope = [parents[loop]]
    else:
        return False
    variables = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    return not any(isinstance(sub, ast.Subscript) and any(isinstance(n, ast.Name) and n.id in variables
                                                           for n in ast.walk(sub.slice))
                   for node in scope for sub in ast.walk(node))


def _attribute_loop_floor(attribute: str, methods: list[ast.FunctionDef]) -> Optional[int]:
    """1 when every read of ``self.<attribute>`` in ``methods`` is ``range(self.<attribute>)``, 2 when some sit
    in arithmetic inside ``range(...)``; None when one is read otherwise, or never."""
    floor = None
    for method in methods:
        parents = {child: parent for parent in ast.walk(method) for child in ast.iter_child_nodes(parent)}
        for sub in ast.walk(method):
            if not (isinstance(sub, ast.Attribute) and sub.attr == attribute and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"):
                continue
            if not isinstance(sub.ctx, ast.Load):
                return None  # set again outside the constructor
            node, bare = sub, True
            while isinstance(parents.get(node), ast.BinOp):
                node, bare = parents[node], False
            call = parents.get(node)
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"
                    and node in call.args) or not _loop_index_unused_as_index(call, parents):
                return None
            floor = max(floor or 1, 1 if bare and len(call.args) == 1 else 2)
    return floor


def _stored_and_called(init: ast.FunctionDef, methods: list[ast.FunctionDef]) -> set[str]:
    """Arguments ``__init__`` stores as ``self.X = arg`` whose attribute a method calls (``self.features(x)`` in
    ``forward``): modules or functions, never a size."""
    stored = {}
    for sub in ast.walk(init):
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name):
            for target in sub.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    stored[target.attr] = sub.value.id
    called = set()
    for method in methods:
        for sub in ast.walk(method):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name) \
                    and sub.func.value.id == "self" and sub.func.attr in stored:
                called.add(stored[sub.func.attr])
    return called


def _collect_usage(node: ast.AST, names: set, usage: dict[str, Usage], module: Optional[types.ModuleType]) -> None:

    def name_of(expression: ast.AST) -> Optional[str]:
        return expression.id if isinstance(expression, ast.Name) and expression.id in names else None

    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and (arg := name_of(sub.value)):
            if sub.attr not in usage[arg].attributes:
                usage[arg].attributes.append(sub.attr)
        elif isinstance(sub, ast.Call):
            if arg := name_of(sub.func):
                usage[arg].called = True
            func = sub.func
            layer = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if layer in _FREE_SIZES:
                index, keyword = _FREE_SIZES[layer]
                given = sub.args[index] if len(sub.args) > index else \
                    next((k.value for k in sub.keywords if k.arg == keyword), None)
                for named in _size_operands(given):
                    if named in names:
                        usage[named].free_size = True
            if isinstance(func, ast.Name) and func.id == "isinstance" and len(sub.args) == 2 \
                    and (arg := name_of(sub.args[0])):
                kinds = sub.args[1].elts if isinstance(sub.args[1], ast.Tuple) else [sub.args[1]]
                if any(isinstance(k, ast.Name) and k.id in ("tuple", "list") for k in kinds):
                    usage[arg].is_tuple = True
            if isinstance(func, ast.Name) and func.id in ("zip", "enumerate", "list", "tuple", "len", "map"):
                for a in sub.args:
                    if arg := name_of(a):
                        usage[arg].iterated = True
        elif isinstance(sub, ast.Compare) and len(sub.ops) == 1:
            left, op, right = sub.left, sub.ops[0], sub.comparators[0]
            if isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "len" \
                    and left.args and (arg := name_of(left.args[0])) and isinstance(op, ast.Eq):
                ok, value = _literal(right)
                if ok and isinstance(value, int):
                    usage[arg].length = value
            elif (arg := name_of(left)) and isinstance(op, (ast.In, ast.Eq)):
                ok, value = _literal(right)
                if ok:
                    values = sorted(value, key=str) if isinstance(value, (set, frozenset)) else \
                        list(value) if isinstance(value, (list, tuple, dict)) else [value]
                    usage[arg].choices += [v for v in values if isinstance(v, (str, int, float)) and v is not None]
        elif isinstance(sub, ast.Subscript):
            if (arg := name_of(sub.value)):
                ok, index = _literal(sub.slice)
                if ok and isinstance(index, int) and index >= 0:
                    usage[arg].max_index = max(usage[arg].max_index or 0, index)
            elif (arg := name_of(sub.slice)) and isinstance(sub.value, ast.Name) and module is not None:
                table = getattr(module, sub.value.id, None)
                if isinstance(table, dict) and table:
                    usage[arg].dict_keys = list(table)
        elif isinstance(sub, (ast.For, ast.comprehension)) and (arg := name_of(sub.iter)):
            usage[arg].iterated = True
        elif isinstance(sub, ast.Assign) and (arg := name_of(sub.value)) \
                and isinstance(sub.targets[0], (ast.Tuple, ast.List)):  # ih, iw = image_size
            elements = sub.targets[0].elts
            if any(isinstance(e, ast.Starred) for e in elements):
                usage[arg].iterated = True
            else:
                usage[arg].length = len(elements)


def _size_operands(node: Optional[ast.AST]) -> list[str]:
    """The names a size expression is made of: ``dim`` in ``dim``, ``2 * dim``, ``dim // 4``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.FloorDiv, ast.Add)):
        return _size_operands(node.left) + _size_operands(node.right)
    return []


def sequence_length(usage: Usage) -> Optional[int]:
    """The length a sequence argument must have, when the constructor says it needs a sequence."""
    if usage.length is not None:
        return usage.length
    if usage.max_index is not None:
        return usage.max_index + 1
    if usage.is_tuple or usage.iterated:
        return 3
    return None


def module_classes(module: types.ModuleType, base: type) -> list[type]:
    """Classes defined in ``module`` (not imported into it) that subclass ``base``, in source order."""
    found = [v for v in vars(module).values() if inspect.isclass(v) and issubclass(v, base)
             and getattr(v, "__module__", None) == module.__name__]

    def line(cls):
        try:
            return inspect.getsourcelines(cls)[1]
        except (OSError, TypeError):
            return 1 << 30
    return sorted(found, key=line)


def sibling_class(usage: Usage, module: types.ModuleType, base: type, exclude: type) -> Optional[type]:
    """A class of the module for an argument the constructor calls (``block(...)``), having every attribute it
    reads (``block.expansion``)."""
    for cls in module_classes(module, base):
        if cls is exclude:
            continue
        if all(hasattr(cls, attribute) for attribute in usage.attributes):
            return cls
    return None


def config_candidates(owner: type, module: types.ModuleType) -> list[tuple[str, Callable[[], Any]]]:
    """Ways to make a config object, best first: ``owner.get_default_config()`` (or a sibling's), then the
    config classes of the module constructible without arguments (dataclasses with defaults)."""
    found: list[tuple[str, Callable[[], Any]]] = []
    for holder in [owner] + [c for c in vars(module).values() if inspect.isclass(c) and c is not owner]:
        factory = inspect.getattr_static(holder, "get_default_config", None)
        if factory is not None:
            maker = getattr(holder, "get_default_config")
            if callable(maker):
                found.append((f"{holder.__name__}.get_default_config()", maker))
                break
    for value in vars(module).values():
        if inspect.isclass(value) and getattr(value, "__module__", None) == module.__name__ \
                and any(word in value.__name__.lower() for word in _CONFIG_CLASS_WORDS):
            try:
                required = [p for p in inspect.signature(value).parameters.values()
                            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            except (TypeError, ValueError):
                continue
            if not required:
                found.append((f"{value.__name__}()", value))
    return found


def config_attributes(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    try:
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    except TypeError:
        return {}


def module_factories(module: types.ModuleType, cls: type) -> list[Callable]:
    """Functions of the module that take no required argument and return ``cls(...)`` (``ResNet18()``)."""
    found = []
    for name, value in vars(module).items():
        if not inspect.isfunction(value) or getattr(value, "__module__", None) != module.__name__ \
                or name.startswith("_") or name in ("test", "main"):
            continue
        try:
            parameters = inspect.signature(value).parameters.values()
        except (TypeError, ValueError):
            continue
        if any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            continue
        node = _function_node(value)
        if node is None:
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Call) \
                    and isinstance(sub.value.func, ast.Name) and sub.value.func.id == cls.__name__:
                found.append(value)
                break
    return found


def forwarded_keyword_targets(function: Callable, module: Optional[types.ModuleType]) -> list[tuple[Callable, set]]:
    """The callables of ``module`` to which ``function`` (an ``__init__`` taking ``**kwargs``) hands its
    ``**kwargs`` on (``self.classifier = TransformerClassifier(..., **kwargs)``), each with the keywords that call
    sets itself: the callable's other defaults are sizes a caller of ``function`` can set through it. Only names
    of the module itself; ``super().__init__(**kwargs)`` and attribute calls are left out."""
    node = _function_node(function)
    if node is None or node.args.kwarg is None or module is None:
        return []
    kwargs_name = node.args.kwarg.arg
    found: list[tuple[Callable, set]] = []
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call) or not isinstance(sub.func, ast.Name):
            continue
        if not any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwargs_name for k in sub.keywords):
            continue
        target = getattr(module, sub.func.id, None)
        if callable(target) and getattr(target, "__module__", None) == module.__name__ \
                and all(target is not t for t, _ in found):
            found.append((target, {k.arg for k in sub.keywords if k.arg is not None}))
    return found
