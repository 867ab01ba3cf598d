"""The checkpoints a file writes, as the other files of its repository see them: a cheap ``ast`` summary.

``train.py`` saves ``{'model': net.state_dict(), 'epoch': epoch}`` to ``os.path.join(args.save_dir, 'best.pth')``;
``eval.py`` (or a utility module, or a script one folder down) loads ``os.path.join(args.save_dir, 'best.pth')``.
The load reads a file the repository itself writes, and what that file holds decides whether ``weights_only=True``
loads it. Each ``torch.save`` is recorded by the shape of its path (the file names spelled in it, the option and
configuration keys it is built from: ``args.save_dir`` gives ``save_dir``, ``cfg['ckpt']`` gives ``ckpt``) and by
what it saves (:class:`~analyzers.program.roles.Payload` kinds; None when the code does not show it). A path handed
in as a parameter of the saving function is read from the calls of that function in the same file
(``save_checkpoint(state, args.out)``); a function nobody in the file calls says nothing (its callers choose).

:meth:`analyzers.program.modules.RepositoryIndex.checkpoint_saves_near` collects these for the scripts around a
file; :meth:`analyzers.program.roles.CheckpointWrites.saved_elsewhere` matches a load's path against them.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Optional

from analyzers.program.names import name_is_model_like, names_configuration
from analyzers.program.roles import SAVE_ON_MASTER, Payload

# calls whose result a checkpoint holds as tensors and plain values (weights_only=True loads them)
_PLAIN_RESULTS = {"state_dict", "item", "tolist", "detach", "cpu", "clone", "vars", "dict", "list", "tuple", "int",
                  "float", "str", "len", "round", "sum", "min", "max", "mean", "OrderedDict"}
_RECEIVER_KEPT = {"to", "half", "float", "double", "cuda", "cpu", "module"}  # ``model.cpu()``: still the model
_PLAIN_NODES = (ast.Constant, ast.List, ast.ListComp, ast.Tuple, ast.Set, ast.SetComp, ast.JoinedStr, ast.Compare,
                ast.BinOp, ast.UnaryOp, ast.DictComp)
_DEPTH = 3


@dataclass(frozen=True)
class SavedCheckpoint:
    """One ``torch.save`` of a file: the file names its path spells, the option / configuration keys the path is
    built from, and what the checkpoint holds (None: the code does not show it)."""
    files: frozenset[str]
    keys: frozenset[str]
    kinds: Optional[frozenset[Payload]]


def dotted_ast(node: ast.AST) -> Optional[str]:
    """``a.b.c`` of an ``ast`` name or attribute chain; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def writes_checkpoint(call: ast.Call) -> bool:
    """``torch.save(...)``, a bare ``save(...)``, or a ``save_on_master(...)`` helper."""
    called = dotted_ast(call.func) or ""
    return called in ("torch.save", "save") or called.rsplit(".", 1)[-1] == SAVE_ON_MASTER


class _File:
    """The assignments and functions of one file, read once for all its saves."""

    def __init__(self, nodes: list[ast.AST]) -> None:
        self.assigned: dict[str, list[ast.AST]] = {}
        self.stored: dict[str, list[tuple[Optional[str], ast.AST]]] = {}  # ``ckpt["args"] = args``
        self.calls: list[ast.Call] = []
        self.owner: dict[int, ast.FunctionDef] = {}
        for node in nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                name = dotted_ast(target)
                if name:
                    self.assigned.setdefault(name, []).append(node.value)
                elif isinstance(target, ast.Subscript) and dotted_ast(target.value):
                    key = target.slice.value if isinstance(target.slice, ast.Constant) else None
                    self.stored.setdefault(dotted_ast(target.value), []).append(
                        (key if isinstance(key, str) else None, node.value))
            elif isinstance(node, ast.Call):
                self.calls.append(node)
        # the innermost function holding each node (``nodes`` is breadth-first: an inner def comes later)
        for fn in (node for node in nodes if isinstance(node, ast.FunctionDef)):
            for inner in ast.walk(fn):
                if inner is not fn:
                    self.owner[id(inner)] = fn

    def call_values(self, fn: ast.FunctionDef, name: str) -> list[ast.AST]:
        """What the calls of ``fn`` in this file pass for its parameter ``name`` (positional or keyword)."""
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        offset = 1 if params[:1] in (["self"], ["cls"]) else 0
        found = []
        for call in self.calls:
            called = dotted_ast(call.func) or ""
            if called.rsplit(".", 1)[-1] != fn.name:
                continue
            keyword = next((k.value for k in call.keywords if k.arg == name), None)
            if keyword is not None:
                found.append(keyword)
            elif name in params and 0 <= params.index(name) - offset < len(call.args):
                found.append(call.args[params.index(name) - offset])
        return found


def _parameter(fn: Optional[ast.FunctionDef], name: str) -> Optional[ast.arg]:
    if fn is None:
        return None
    return next((a for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg == name), None)


def _default(fn: ast.FunctionDef, name: str) -> Optional[ast.AST]:
    positional = fn.args.posonlyargs + fn.args.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(fn.args.defaults):], fn.args.defaults))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    return defaults.get(name)


# a resolver: what a name in a path means where the path is built; None when the callers of the function choose it
# (a parameter no call in view fills), else the values it may hold, each with the resolver of where it is written
Resolver = Callable[[str], Optional[list[tuple[ast.AST, "Resolver"]]]]
_NOT_KEYS = {"path", "join", "format", "parent", "name", "stem", "with_suffix", "replace", "joinpath"}


def path_shape(expr: ast.AST, resolve: Resolver, depth: int = _DEPTH
               ) -> Optional[tuple[frozenset[str], frozenset[str]]]:
    """(file names, keys) a path expression is built from: the file names spelled in its strings (``best.pth``),
    and the option / configuration keys of its parts (``args.save_dir`` → ``save_dir``, ``cfg['ckpt']`` →
    ``ckpt``), through the names it is assigned from; None when a part is a parameter no call in view fills."""
    files: set[str] = set()
    keys: set[str] = set()
    stack = [(expr, resolve, depth)]
    while stack:
        node, where, left = stack.pop()
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            last = node.value.replace("\\", "/").rsplit("/", 1)[-1]
            if "." in last.strip("."):
                files.add(last)
        elif isinstance(node, ast.JoinedStr):
            stack.extend((value, where, left) for value in node.values)
        elif isinstance(node, ast.FormattedValue):
            stack.append((node.value, where, left))
        elif isinstance(node, ast.BinOp):
            stack.extend([(node.left, where, left), (node.right, where, left)])
        elif isinstance(node, ast.Call):
            stack.extend((arg, where, left) for arg in node.args)
            stack.extend((keyword.value, where, left) for keyword in node.keywords)
            if isinstance(node.func, ast.Attribute) and not isinstance(node.func.value, ast.Name):
                stack.append((node.func.value, where, left))  # ``'{}/best.pt'.format(d)``, ``(root / 'x').joinpath``
        elif isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)  # ``cfg['ckpt_path']``
        elif isinstance(node, ast.Attribute):
            if (dotted_ast(node) or "").split(".", 1)[0] not in ("os", "osp", "sys"):
                keys.add(node.attr)  # ``args.save_dir``, ``self.cfg.ckpt``
        elif isinstance(node, ast.Name) and left and node.id not in ("self", "cls"):
            values = where(node.id)
            if values is None:
                return None
            stack.extend((value, resolver, left - 1) for value, resolver in values[:4])
    return frozenset(files), frozenset(keys - _NOT_KEYS)


def _resolver(file: "_File", fn: Optional[ast.FunctionDef]) -> Resolver:
    """Names in a function of the summarized file: a parameter is what the file's calls of the function pass (its
    default when none does; None when there is neither), any other name what it is assigned."""
    def resolve(name: str) -> Optional[list[tuple[ast.AST, Resolver]]]:
        if fn is not None and _parameter(fn, name) is not None:
            values = file.call_values(fn, name)
            default = _default(fn, name)
            if not values and default is None:
                return None
            return [(value, _resolver(file, file.owner.get(id(value)))) for value in values] or \
                [(default, _resolver(file, None))]
        return [(value, _resolver(file, file.owner.get(id(value)))) for value in file.assigned.get(name, ())[:2]]
    return resolve


def saved_kinds(value: ast.AST, file: _File, fn: Optional[ast.FunctionDef], key: Optional[str] = None,
                depth: int = _DEPTH) -> Optional[frozenset[Payload]]:
    """What ``value`` puts in a checkpoint: tensors and plain values, a whole module, a Namespace or config
    object, NumPy arrays; None when nothing shows it (an unknown call, a parameter no call in the file fills)."""
    if isinstance(value, ast.Dict):
        entries = [(k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None, v)
                   for k, v in zip(value.keys, value.values)]
        return _union([saved_kinds(v, file, fn, k, depth) for k, v in entries]) if entries else \
            frozenset({Payload.TENSORS})
    if isinstance(value, ast.IfExp):
        return _union([saved_kinds(value.body, file, fn, key, depth), saved_kinds(value.orelse, file, fn, key, depth)])
    if isinstance(value, _PLAIN_NODES):
        return frozenset({Payload.TENSORS})
    if isinstance(value, ast.Call):
        called = dotted_ast(value.func) or ""
        last = called.rsplit(".", 1)[-1]
        if last in ("parse_args", "Namespace", "SimpleNamespace") or last[:1].isupper() and names_configuration(last):
            return frozenset({Payload.NAMESPACE})
        if last in ("dict", "OrderedDict") and (value.args or value.keywords):
            # ``dict(epoch=epoch, best=best_acc)``: what each value puts there
            return _union([saved_kinds(v, file, fn, None, depth - 1) for v in value.args if depth] +
                          [saved_kinds(k.value, file, fn, k.arg, depth - 1) for k in value.keywords if depth]) \
                if depth else None
        if last == "numpy" or called.startswith(("np.", "numpy.")):
            return frozenset({Payload.NUMPY})
        if last in ("load", "loads") and not called.startswith("json."):
            return None  # what a load returns is what the file held: nothing here shows it (a resume saving it back)
        if last in _PLAIN_RESULTS or called.startswith("torch.") and last[:1].islower():
            return frozenset({Payload.TENSORS})
        if last == "deepcopy" and value.args and depth:
            return saved_kinds(value.args[0], file, fn, key, depth - 1)
        if last in _RECEIVER_KEPT and isinstance(value.func, ast.Attribute) and depth:
            return saved_kinds(value.func.value, file, fn, key, depth - 1)
        return None
    name = dotted_ast(value)
    if name is None:
        return None
    # what the name holds, before what it is called: ``config = {k: globals()[k] ...}`` and ``model_args =
    # dict(n_layer=...)`` hold plain values whatever their names say; a saving function's parameter holds what the
    # file's calls hand it
    unknown = False
    if isinstance(value, ast.Name) and _parameter(fn, value.id) is not None:
        values = file.call_values(fn, value.id) if depth else []
        if values:
            return _union([saved_kinds(v, file, file.owner.get(id(v)), key, depth - 1) for v in values[:4]])
        unknown = True  # no call in view: only its name may tell
    elif depth and (name in file.stored or name in file.assigned):
        kinds = [saved_kinds(v, file, fn, k, depth - 1) for k, v in file.stored.get(name, ())]
        kinds += [saved_kinds(v, file, fn, key, depth - 1) for v in file.assigned.get(name, ())[:4]]
        if _union(kinds) is not None:
            return _union(kinds)
        if all(isinstance(v, ast.Dict) or isinstance(v, ast.Call) and dotted_ast(v.func) == "dict"
               for v in file.assigned.get(name, ())):
            return None  # a dict filled with values nothing shows: not known, whatever the name says
        unknown = True
    short = name.rsplit(".", 1)[-1].lower()
    if names_configuration(short) or names_configuration(key):
        return frozenset({Payload.NAMESPACE})
    if name_is_model_like(short) and not short.endswith(("_state", "state_dict", "_sd", "states")):
        return frozenset({Payload.MODULE})
    if unknown:
        return None
    return frozenset({Payload.TENSORS})  # ``epoch``, ``best_acc``, ``features``: a plain value by its name


def _union(kinds: list[Optional[frozenset[Payload]]]) -> Optional[frozenset[Payload]]:
    """What the parts hold together: None when one part is not known, unless a known part already holds what
    ``weights_only=True`` refuses (the checkpoint needs full unpickling whatever the rest is)."""
    known = [k for k in kinds if k is not None]
    refused = any(not kind.loads_weights_only for k in known for kind in k)
    if not kinds or len(known) < len(kinds) and not refused:
        return None
    return frozenset().union(*known)


def checkpoint_saves(nodes: list[ast.AST]) -> list[SavedCheckpoint]:
    """Every ``torch.save`` of a file (``nodes``: the file's, from ``modules._walk``), as
    :class:`SavedCheckpoint`; one whose path is a parameter no call in the file fills is left out."""
    file: Optional[_File] = None
    found = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and len(node.args) + len(node.keywords) > 1 and writes_checkpoint(node)):
            continue
        file = file or _File(nodes)
        fn = file.owner.get(id(node))
        obj = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "obj"), None)
        path = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "f"), None)
        if obj is None or path is None:
            continue
        shape = path_shape(path, _resolver(file, fn))
        if shape is None or not (shape[0] or shape[1]):
            continue
        found.append(SavedCheckpoint(shape[0], shape[1], saved_kinds(obj, file, fn)))
    return found
