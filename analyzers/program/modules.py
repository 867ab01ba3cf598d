"""What the repository's ``nn.Module`` classes are: a cheap ``ast`` summary per file, and an index across files.

A rule that meets ``output = model(x)`` with ``model = Discriminator()`` asks this module what
``Discriminator.forward`` returns, whether its layers include dropout or BatchNorm, or whether it is recurrent,
wherever the class is defined: in the same file, in ``model.py`` beside it (``from model import Net``), or
behind a package's re-export (``from .models import Net`` in ``__init__.py``).

Summaries use the standard library's ``ast`` (about 20x cheaper than libcst) and are cached by file content,
so a repository of thousands of files costs only the files a review actually reaches.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

import libcst as cst

from analyzers.context import dotted_name, parse_ast
from analyzers.hints import prepare, search
from analyzers.program.flow import ModuleNodes
from analyzers.program.library import (MODE_DEPENDENT_LAYERS, NORM_LAYERS_STATS_OPTIONAL, NORM_LAYERS_WITH_STATS,
                                       norm_keeps_running_stats)
from analyzers.program.names import name_is_model_like, names_configuration
from analyzers.program.roles import Payload
from analyzers.program.saves import SavedCheckpoint, checkpoint_saves, writes_checkpoint
from analyzers.program.saves import dotted_ast as _dotted

if TYPE_CHECKING:
    from analyzers.context import FileContext

# Activations a forward may end in, by the callable that applies them.
_ACTIVATION_CALLS = {
    "softmax": "softmax", "log_softmax": "log_softmax", "sigmoid": "sigmoid",
}
_ACTIVATION_MODULES = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Sigmoid": "sigmoid"}
# Calls that return their input's values reshaped: an activation stays an activation.
_SHAPE_METHODS = {"view", "reshape", "squeeze", "unsqueeze", "flatten", "contiguous", "permute", "transpose",
                  "view_as", "reshape_as", "float", "double", "half", "to", "cpu", "cuda", "clone"}
_RECURRENT = {"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"}
_TRANSFORMER = {"Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
                "TransformerDecoderLayer", "MultiheadAttention"}
_CONTAINERS = {"Sequential"}
# ``nn.Linear`` / ``torch.nn.Conv2d`` / ``torchvision.models.resnet18``: library layers, never project classes
_LIBRARY_PREFIXES = {"nn", "torch", "torchvision", "timm", "transformers", "F", "L", "pl"}
# What a class's layers tell about it (the rest of Layer.kinds are project class names to resolve).
_FEATURES = {"dropout", "batchnorm", "recurrent", "vanilla-rnn", "transformer", "vocab-output", "reads-training",
             "carries-state"}
# The features that make eval() change what a module computes: dropout, batch norm with running statistics, and code
# of the repository's own that reads ``self.training`` (a branch of its own for training).
MODE_FEATURES = frozenset({"dropout", "batchnorm", "reads-training"})


def _last(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


@dataclass
class Layer:
    """What ``self.x = <constructor>`` registers, as far as a forward's output is concerned."""

    activation: Optional[str] = None  # the module's output is this activation (nn.Sigmoid, Sequential ending in one)
    kinds: set[str] = field(default_factory=set)  # dropout | batchnorm | recurrent | transformer | <class name>

    @property
    def classes(self) -> set[str]:
        """The callables this layer was built with that may be project classes, to resolve through the index."""
        return self.kinds - _FEATURES


@dataclass
class ClassSummary:
    name: str
    path: str
    bases: list[str]
    layers: dict[str, Layer] = field(default_factory=dict)
    forward_activation: Optional[str] = None  # every return path of forward ends in this activation
    forward_return_line: Optional[int] = None  # the first of those returns
    has_forward: bool = False
    functional_dropout: bool = False  # F.dropout in forward
    features: set[str] = field(default_factory=set)  # dropout | batchnorm | recurrent | transformer
    # ``__init__`` puts the instance or a module it holds in eval mode (``self.backbone.eval()``) and never
    # back: a wrapper built for inference
    init_evaluates: bool = False
    # a data set's items, from what ``__getitem__`` does: "memory" (it only indexes what the instance holds and
    # converts it to tensors), "disk" (it opens, reads or decodes files), None (anything else: unknown)
    item_source: Optional[str] = None
    # the class cuts part of its computation out of the graph (no_grad, inference_mode, .detach()): see freezing.py
    stops_gradient: bool = False

    @property
    def changes_in_eval(self) -> bool:
        """Does ``eval()`` change what this module computes (dropout, BatchNorm statistics, a ``self.training``
        branch)?"""
        return bool(self.features & MODE_FEATURES) or self.functional_dropout


@dataclass
class FileSummary:
    path: str
    classes: dict[str, ClassSummary] = field(default_factory=dict)
    # local name -> (module, imported name or None for ``import m``, relative level)
    imports: dict[str, tuple[str, Optional[str], int]] = field(default_factory=dict)
    star_imports: list[tuple[str, int]] = field(default_factory=list)
    module_layers: dict[str, Layer] = field(default_factory=dict)  # D = nn.Sequential(..., nn.Sigmoid())
    saved_names: set[str] = field(default_factory=set)  # file names given literally to torch.save
    # functions and classes that save a checkpoint into a folder they are handed: name -> the file names
    folder_savers: dict[str, frozenset[str]] = field(default_factory=dict)
    # what its checkpoints hold that weights_only=True refuses (a whole module, a Namespace, NumPy arrays)
    refused_payloads: set[Payload] = field(default_factory=set)
    # every torch.save, by the shape of its path and what it holds (analyzers/program/saves.py)
    checkpoint_saves: list[SavedCheckpoint] = field(default_factory=list)
    reads_data: bool = False  # reads a data set (files, a dataset library, a download): see READS_DATA
    # functions that leave a module they are given in eval mode: name -> (parameters, the eval()'d parameters)
    eval_helpers: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    # functions that clip gradients (see analyzers/program/clipping.py): name -> True
    clipping_functions: dict[str, bool] = field(default_factory=dict)
    # functions that replace the built-in print (see analyzers/program/ranks.py): name -> True
    print_replacing_functions: dict[str, bool] = field(default_factory=dict)
    # functions that freeze parameters, and whether the file's code freezes any (see analyzers/program/freezing.py)
    freezing_functions: dict[str, bool] = field(default_factory=dict)
    freezes: bool = False
    batchnorm_fixing_functions: dict[str, bool] = field(default_factory=dict)  # put BatchNorm modules in eval mode
    # functions that build and return an instance of a class: name -> the classes every ``return`` builds
    factories: dict[str, tuple[str, ...]] = field(default_factory=dict)


_VOCABULARY_WORDS = ("vocab", "ntoken", "n_token", "num_token", "ntokens")


def _names_vocabulary(call: ast.Call) -> bool:
    """``nn.Linear(hidden, vocab_size)``: the output size is named after a vocabulary."""
    candidates = call.args[1:2] + [k.value for k in call.keywords if k.arg == "out_features"]
    return any(any(word in (_dotted(c) or "").lower() for word in _VOCABULARY_WORDS) for c in candidates)


def _predicts_embedded_tokens(init: ast.FunctionDef) -> bool:
    """Does the class ``init`` builds have a head with one output per token it embeds: an ``nn.Linear`` whose output
    size is the number of rows of one of its ``nn.Embedding``s, or a count computed from them (``total = n_text +
    n_image``, ``self.total = total``)? The model reads token ids and predicts a distribution over them: a language
    model, whatever its sizes are called."""
    nodes = _walk(init)
    counts: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Call) and _last(node.func) == "Embedding":
            rows = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "num_embeddings"),
                                                       None)
            if rows is not None and _dotted(rows) is not None:
                counts.add(_dotted(rows))
    if not counts:
        return False
    assignments = [(node.targets[0], node.value) for node in nodes
                   if isinstance(node, ast.Assign) and len(node.targets) == 1]
    for _ in range(4):  # counts computed from counts, a few assignments deep
        grown = {_dotted(target) for target, value in assignments
                 if isinstance(value, (ast.Name, ast.Attribute, ast.BinOp)) and _dotted(target) is not None
                 and any(_dotted(part) in counts for part in ast.walk(value) if isinstance(part, (ast.Name,
                                                                                                   ast.Attribute)))}
        if grown <= counts:
            break
        counts |= grown
    counts |= {f"self.{name}" for name in counts if "." not in name} | \
        {name.split(".", 1)[1] for name in counts if name.startswith("self.")}
    for node in nodes:
        if isinstance(node, ast.Call) and _last(node.func) == "Linear":
            out = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "out_features"), None)
            if out is not None and _dotted(out) in counts:
                return True
    return False


def layer_of(call: ast.AST, extra: Optional[list[ast.AST]] = None) -> Optional[Layer]:
    """The layer a constructor call builds; ``extra`` holds layers appended to a Sequential later."""
    if not isinstance(call, ast.Call):
        return None
    name = _last(call.func)
    if name is None:
        return None
    layer = Layer()
    if name in _ACTIVATION_MODULES:
        layer.activation = _ACTIVATION_MODULES[name]
    elif name in _CONTAINERS:
        items = [a for a in call.args if not isinstance(a, ast.Starred)] + list(extra or [])
        for item in items:
            sub = layer_of(item)
            if sub is not None:
                layer.kinds |= sub.kinds
        last = layer_of(items[-1]) if items else None
        layer.activation = last.activation if last is not None else None
    elif name in ("ModuleList", "ModuleDict"):
        for arg in call.args:
            for node in _walk(arg):
                sub = layer_of(node) if isinstance(node, ast.Call) and node is not arg else None
                if sub is not None:
                    layer.kinds |= sub.kinds
    if name in MODE_DEPENDENT_LAYERS:
        layer.kinds.add("dropout")
    elif name in NORM_LAYERS_WITH_STATS or name in NORM_LAYERS_STATS_OPTIONAL:
        if norm_keeps_running_stats(name, _tracks_running_stats(call)):
            layer.kinds.add("batchnorm")
    elif name in _RECURRENT:
        layer.kinds.add("recurrent")
        if name in ("RNN", "RNNCell"):
            layer.kinds.add("vanilla-rnn")
        for keyword in call.keywords:
            if keyword.arg == "dropout" and not (isinstance(keyword.value, ast.Constant) and not keyword.value.value):
                layer.kinds.add("dropout")
    elif name in _TRANSFORMER:
        layer.kinds |= {"transformer", "dropout"}  # their dropout defaults to 0.1
    elif name == "Linear" and _names_vocabulary(call):
        layer.kinds.add("vocab-output")  # a language model's head: one logit per token of the vocabulary
    elif name not in _ACTIVATION_MODULES and name not in _CONTAINERS and name not in _FEATURES and \
            (_dotted(call.func) or "").split(".", 1)[0] not in _LIBRARY_PREFIXES:
        # maybe a project class, whatever its case (``double_conv(...)``): resolved through the index on demand,
        # and ignored there when no class of the repository has that name (a helper function, a builtin)
        layer.kinds.add(_dotted(call.func) or name)
    return layer


def _tracks_running_stats(call: ast.Call) -> Optional[bool]:
    """The ``track_running_stats`` a norm layer is built with: None when not given, True when not a constant."""
    for keyword in call.keywords:
        if keyword.arg == "track_running_stats":
            value = keyword.value
            return bool(value.value) if isinstance(value, ast.Constant) else True
    if len(call.args) >= 5:  # num_features, eps, momentum, affine, track_running_stats
        value = call.args[4]
        return bool(value.value) if isinstance(value, ast.Constant) else True
    return None


# Calls a ``__getitem__`` of items held in memory may make: conversions to tensors or arrays, and shape and type
# changes of what it indexed.
_IN_MEMORY_ITEM_CALLS = {"tensor", "as_tensor", "from_numpy", "LongTensor", "FloatTensor", "Tensor", "array",
                         "asarray", "long", "float", "int", "bool", "len", "dict", "tuple", "list", "range", "to",
                         "clone", "view", "reshape", "unsqueeze", "squeeze", "flatten", "type", "astype", "copy",
                         "get", "items", "keys", "values", "isinstance", "min", "max", "str", "zeros_like", "ones_like"}
# Calls that read or decode a file: an item costs disk reads or decoding, the work loader workers overlap.
_FILE_READS = {"open", "imread", "read", "read_csv", "read_image", "decode_image", "loadmat", "imdecode", "load",
               "loadtxt", "fromfile", "memmap", "File", "urlopen", "read_file", "listdir", "glob", "get_image",
               "VideoCapture", "load_image", "read_text", "read_bytes"}


def _item_source(getitem: ast.AST) -> Optional[str]:
    """"disk" when ``__getitem__`` reads or decodes a file; "memory" when its calls are only tensor conversions and
    it indexes something the instance holds (``self.x[index]``); None otherwise (a transform, a tokenizer, a helper:
    unknown)."""
    nodes = _walk(getitem)
    calls = [_last(node.func) for node in nodes if isinstance(node, ast.Call)]
    if any(name in _FILE_READS for name in calls):
        return "disk"
    indexes_held = any(isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and
                       isinstance(node.value.value, ast.Name) and node.value.value.id == "self" for node in nodes)
    if indexes_held and all(name in _IN_MEMORY_ITEM_CALLS for name in calls):
        return "memory"
    return None


_NO_GRAD_CALLS = ("no_grad", "inference_mode")
_OFF_GRAPH_METHODS = ("detach", "detach_", "item", "tolist", "numpy")


def _off_graph(value: ast.AST) -> bool:
    """``h.detach()``, ``x.item()``, a constant: a value that holds no autograd graph."""
    if isinstance(value, ast.Constant):
        return True
    return isinstance(value, ast.Call) and _last(value.func) in _OFF_GRAPH_METHODS


def carried_state(forward: ast.FunctionDef, methods: set[str]) -> list[str]:
    """The attributes ``forward`` keeps from one call to the next with their graph: it assigns ``self.x`` a value
    computed by one of the instance's submodules (``_, self.h = self.gru(inp, self.h)``), outside no-grad and not
    detached, and reads ``self.x`` before (or while) assigning it: what the previous call left. The next call's
    output then hangs on the previous call's graph. Not an attribute only read after it is set in the same call."""
    if any(_last(d.func if isinstance(d, ast.Call) else d) in _NO_GRAD_CALLS for d in forward.decorator_list):
        return []
    first_read: dict[str, int] = {}
    for node in _walk(forward):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            first_read[node.attr] = min(first_read.get(node.attr, node.lineno), node.lineno)
    kept: list[str] = []

    def submodule_call(value: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                   and n.func.value.id == "self" and n.func.attr not in methods for n in _walk(value))

    def visit(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.With, ast.AsyncWith)) and any(
                    isinstance(item.context_expr, ast.Call) and _last(item.context_expr.func) in _NO_GRAD_CALLS
                    for item in stmt.items):
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(stmt, ast.Assign) and not _off_graph(stmt.value) and submodule_call(stmt.value):
                for target in stmt.targets:
                    elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                    for element in elements:
                        if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name) and \
                                element.value.id == "self" and element.attr not in kept and \
                                first_read.get(element.attr, stmt.end_lineno + 1) <= stmt.end_lineno:
                            kept.append(element.attr)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, (ast.stmt, ast.excepthandler))])

    visit(forward.body)
    return kept


def _reads_training(method: ast.AST) -> bool:
    """Does ``method`` read ``self.training`` (``if self.training:``, ``F.dropout(x, training=self.training)``)?"""
    return any(isinstance(node, ast.Attribute) and node.attr == "training" and isinstance(node.ctx, ast.Load)
               and isinstance(node.value, ast.Name) and node.value.id == "self" for node in _walk(method))


# Fields whose nodes no question here asks about: expression contexts (``Load``, ``Store``: a third of a file's
# nodes) and operators (``Add``, ``Eq``); their parents are walked, and read them as attributes when they need to.
_UNWALKED_FIELDS = frozenset({"ctx", "op", "ops"})
_WALKED_FIELDS: dict[type, tuple[str, ...]] = {}


def _walk(tree: ast.AST) -> list[ast.AST]:
    """``list(ast.walk(tree))`` less the contexts and operators, the other nodes in the same (breadth-first)
    order, without its generators of fields per node: a file's summary asks several questions over all of its
    nodes, and reads them once."""
    found = [tree]
    node_type = ast.AST
    append = found.append
    walked = _WALKED_FIELDS
    for node in found:  # the list grows while it is read
        kind = type(node)
        names = walked.get(kind)
        if names is None:
            names = walked[kind] = tuple(name for name in kind._fields if name not in _UNWALKED_FIELDS)
        for name in names:
            value = getattr(node, name, None)
            if isinstance(value, node_type):
                append(value)
            elif type(value) is list:
                for item in value:
                    if isinstance(item, node_type):
                        append(item)
    return found


def _appended_layers(nodes: list[ast.AST]) -> dict[str, list[ast.AST]]:
    """``layers.append(nn.Sigmoid())`` / ``layers += [...]``: what is added to a list before ``Sequential(*layers)``,
    among ``nodes`` (a ``_walk`` of the statements before it)."""
    added: dict[str, list[ast.AST]] = {}
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append",
                                                                                                      "add_module"):
            target = _dotted(node.func.value)
            if target and node.args:
                added.setdefault(target, []).append(node.args[-1])
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.value, ast.List):
            target = _dotted(node.target)
            if target:
                added.setdefault(target, []).extend(node.value.elts)
    return added


class _ForwardReader:
    """What activation every return path of a forward ends in."""

    def __init__(self, cls: ClassSummary, fn: ast.FunctionDef) -> None:
        self.cls = cls
        # name -> [(line, value, assigned inside a branch)] in source order
        self.assignments: dict[str, list[tuple[int, ast.AST, bool]]] = {}
        self._collect(fn.body, False)
        self.returns = [(n.lineno, n.value) for n in _walk(fn) if isinstance(n, ast.Return) and n.value is not None]

    def _collect(self, body: list[ast.stmt], conditional: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        self.assignments.setdefault(target.id, []).append((stmt.lineno, stmt.value, conditional))
                    elif isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and \
                            len(target.elts) == len(stmt.value.elts):
                        for sub_target, sub_value in zip(target.elts, stmt.value.elts):
                            if isinstance(sub_target, ast.Name):
                                self.assignments.setdefault(sub_target.id, []).append(
                                    (stmt.lineno, sub_value, conditional))
            elif isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                for field_name in ("body", "orelse", "finalbody"):
                    self._collect(getattr(stmt, field_name, []) or [], conditional or not isinstance(stmt, ast.With))
                for handler in getattr(stmt, "handlers", []):
                    self._collect(handler.body, True)

    def activation(self) -> Optional[str]:
        kinds = {self.of(value, 0, frozenset(), line) for line, value in self.returns}
        return kinds.pop() if len(kinds) == 1 else None

    def _reaching(self, name: str, line: int) -> list[tuple[int, ast.AST]]:
        """The assignments that may give ``name`` its value at ``line``: the last unconditional one before it,
        and every branch assignment after that one."""
        reaching = []
        for assigned_line, value, conditional in reversed(self.assignments.get(name, [])):
            if assigned_line >= line:
                continue
            reaching.append((assigned_line, value))
            if not conditional:
                break
        return reaching

    def of(self, expr: ast.AST, depth: int, visiting: frozenset, line: int) -> Optional[str]:
        if depth > 12:
            return None
        if isinstance(expr, ast.Tuple) and expr.elts:
            return self.of(expr.elts[0], depth + 1, visiting, line)  # (output, hidden): what a loss gets
        if isinstance(expr, ast.Subscript):
            return self.of(expr.value, depth + 1, visiting, line)
        if isinstance(expr, ast.Name):
            kinds = {self.of(v, depth + 1, visiting, assigned) for assigned, v in self._reaching(expr.id, line)}
            return kinds.pop() if len(kinds) == 1 else None
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        name = _last(func)
        on_self = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        if name in _ACTIVATION_CALLS and not on_self:  # F.softmax(x), torch.sigmoid(x), x.softmax(-1)
            return _ACTIVATION_CALLS[name]
        if isinstance(func, ast.Attribute) and name in _SHAPE_METHODS:
            return self.of(func.value, depth + 1, visiting, line)
        if isinstance(func, ast.Call):  # nn.Sigmoid()(x)
            layer = layer_of(func)
            return layer.activation if layer is not None else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            layer = self.cls.layers.get(func.attr)
            return layer.activation if layer is not None else None
        if name == "data_parallel" and expr.args:  # nn.parallel.data_parallel(self.main, x, ...)
            module = expr.args[0]
            if isinstance(module, ast.Attribute) and isinstance(module.value, ast.Name) and module.value.id == "self":
                layer = self.cls.layers.get(module.attr)
                return layer.activation if layer is not None else None
        return None


# Where real training data comes from: files, dataset libraries, downloads, memory-mapped arrays.
READS_DATA = re.compile(
    r"\bdatasets\b|download=True|\bload_dataset\(|ImageFolder|DatasetFolder|\bopen\(|read_csv|read_parquet|np\.load\(|"
    r"numpy\.load\(|\bmemmap\(|torch\.load\(|Image\.open|\bh5py\b|json\.load|pickle\.load|\bglob\b|"
    r"listdir|scandir|\.read\(|torchtext|torchaudio\.load|\burlretrieve|requests\.get|load_from_disk|"
    r"webdataset|tfrecord|lmdb|\.npy\b|\.csv\b|\.txt\b|from_pretrained\(|tokeniz")
prepare((READS_DATA,))  # read once at import, not by the first file summarized


def _saved_names(nodes: list[ast.AST]) -> set[str]:
    """The file names (with an extension, folders dropped) given literally to ``torch.save`` among ``nodes``."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Call) and _dotted(node.func) in ("torch.save", "save") and len(node.args) > 1:
            for part in _walk(node.args[1]):
                if isinstance(part, ast.Constant) and isinstance(part.value, str) and "." in part.value:
                    names.add(part.value.rsplit("/", 1)[-1])
    return names


def _folder_savers(tree: ast.Module) -> dict[str, frozenset[str]]:
    """The module-level functions and classes of a file that ``torch.save`` into a folder they are handed: the save's
    path joins one of the function's (or one of the class's methods') parameters with a literal file name
    (``def keep_best(self, score, model, folder): torch.save(model.state_dict(), folder + '/best.pth')``). A caller
    that hands such a function, or an object of such a class, a folder has that file written there."""
    found: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions = [node]
        elif isinstance(node, ast.ClassDef):
            functions = [item for item in node.body if isinstance(item, ast.FunctionDef)]
        else:
            continue
        names: set[str] = set()
        for fn in functions:
            arguments = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            params = {a.arg for a in arguments} - {"self", "cls"}
            for call in _walk(fn):
                if not (isinstance(call, ast.Call) and _dotted(call.func) in ("torch.save", "save") and len(call.args) > 1):
                    continue
                parts = list(_walk(call.args[1]))
                if any(isinstance(part, ast.Name) and part.id in params for part in parts):
                    names |= {part.value.rsplit("/", 1)[-1] for part in parts if isinstance(part, ast.Constant)
                              and isinstance(part.value, str) and "." in part.value.rsplit("/", 1)[-1]}
        if names:
            found[node.name] = frozenset(names)
    return found


def notebook_saved_names(data: bytes) -> set[str]:
    """:func:`_saved_names` over the code cells of a notebook's JSON, each cell read as IPython runs it; a cell
    that does not parse says nothing, an unreadable notebook nothing at all."""
    from analyzers.notebook import NotebookError, cell_to_python, read_cells

    try:
        cells = read_cells(data)
    except NotebookError:
        return set()
    names: set[str] = set()
    for cell in cells:
        if cell.cell_type != "code" or "save" not in cell.source:
            continue
        python = cell_to_python(cell.source)
        try:
            tree = parse_ast(python.source) if python is not None else None
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if tree is not None:
            names |= _saved_names(_walk(tree))
    return names


def summarize(source: str, path: str) -> FileSummary:
    """A summary of one file; a file that does not parse summarizes to nothing."""
    summary = FileSummary(path, reads_data=search(READS_DATA, source))
    try:
        tree = parse_ast(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return summary
    for node in tree.body:
        _note_import(node, summary)
        if isinstance(node, (ast.If, ast.Try)):
            for inner in _walk(node):
                _note_import(inner, summary)
    nodes = _walk(tree)
    appended = _appended_layers(nodes)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            layer = layer_of(node.value)
            if layer is not None:
                summary.module_layers[node.targets[0].id] = layer
        elif isinstance(node, ast.ClassDef):
            summary.classes[node.name] = _summarize_class(node, path)
        elif isinstance(node, ast.FunctionDef):
            left = _leaves_in_eval(node)
            if left:
                summary.eval_helpers[node.name] = ([a.arg for a in node.args.posonlyargs + node.args.args], left)
            built = _built_classes(node)
            if built:
                summary.factories[node.name] = built
    from analyzers.program.clipping import clipping_functions  # clipping asks this module about other files
    summary.clipping_functions = dict.fromkeys(clipping_functions(tree), True)
    # each question below walks the file again: asked only of a file whose text holds what an answer needs (a gate,
    # as a rule's source_hint; the answer itself is read from the code)
    if "builtin" in source:
        from analyzers.program.ranks import print_replacing_functions  # ranks asks this module about other files
        summary.print_replacing_functions = dict.fromkeys(print_replacing_functions(tree), True)
    from analyzers.program.freezing import batchnorm_fixing_functions, file_freezes, freezing_functions, stops_gradient
    if "requires_grad" in source:
        summary.freezing_functions = dict.fromkeys(freezing_functions(tree), True)
        summary.freezes = file_freezes(tree)
    if "isinstance" in source and ("eval" in source or "train" in source):
        summary.batchnorm_fixing_functions = dict.fromkeys(batchnorm_fixing_functions(tree), True)
    if any(word in source for word in ("no_grad", "inference_mode", "set_grad_enabled", "detach")):
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in summary.classes:
                summary.classes[node.name].stops_gradient = stops_gradient(node)
    summary.saved_names = _saved_names(nodes)
    if summary.saved_names:
        summary.folder_savers = _folder_savers(tree)
    if "save" in source:
        summary.refused_payloads = _refused_payloads(nodes)
        summary.checkpoint_saves = checkpoint_saves(nodes)
    for name, extra in appended.items():
        if name in summary.module_layers:
            summary.module_layers[name].activation = (layer_of(extra[-1]) or Layer()).activation
    return summary


def _built_classes(fn: ast.FunctionDef) -> tuple[str, ...]:
    """The classes a factory function returns an instance of (``def build_net(size): ... return Net(size)``): every
    ``return`` with a value returns a call of a class name (a bare ``return`` or ``return None`` of an error path
    aside); () when one returns anything else, or none builds."""
    built: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) and node is not fn:
            return ()  # a nested scope's returns are not this function's: not read
        if not isinstance(node, ast.Return) or node.value is None or \
                isinstance(node.value, ast.Constant) and node.value.value is None:
            continue
        name = _dotted(node.value.func) if isinstance(node.value, ast.Call) else None
        if name is None or not name.rsplit(".", 1)[-1][:1].isupper():
            return ()
        built.append(name)
    return tuple(dict.fromkeys(built))


def _evaluates_itself(init: ast.FunctionDef) -> bool:
    """``self.eval()`` / ``self.model.eval()`` (or ``.train(False)``) in a constructor, and no other
    ``train(...)`` on ``self`` there."""
    evaluated = False
    for node in _walk(init):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = _dotted(node.func.value) or ""
        if target.split(".", 1)[0] != "self":
            continue
        mode = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "mode"), None)
        if node.func.attr == "eval" and not node.args and not node.keywords or (
                node.func.attr == "train" and isinstance(mode, ast.Constant) and mode.value is False):
            evaluated = True
        elif node.func.attr == "train":
            return False
    return evaluated


def _leaves_in_eval(fn: ast.FunctionDef) -> list[str]:
    """The parameters (or their attributes: ``model.encoder``) ``fn`` puts in eval mode (``.eval()``,
    ``.train(False)``) without switching them back: no other ``.train(...)`` call on them in ``fn``."""
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    evaluated: list[str] = []
    restored: set[str] = set()
    for node in _walk(fn):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = _dotted(node.func.value)
        if target is None or target.split(".", 1)[0] not in params:
            continue
        mode = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "mode"), None)
        if node.func.attr == "eval" and not node.args and not node.keywords or (
                node.func.attr == "train" and isinstance(mode, ast.Constant) and mode.value is False):
            evaluated.append(target)
        elif node.func.attr == "train":
            restored.add(target.split(".", 1)[0])  # train(), train(True), train(was_training)
    return [t for t in dict.fromkeys(evaluated) if t.split(".", 1)[0] not in restored]


def _refused_payloads(nodes: list[ast.AST]) -> set[Payload]:
    """What a file's checkpoints hold that ``weights_only=True`` refuses, for the other files of the repository
    (the file's own rules read :class:`analyzers.program.roles.CheckpointWrites`, which follows more): the first
    argument of ``torch.save`` / ``save_on_master``, a dict literal or a name assigned one (``to_save = {...,
    "args": args}``, ``ckpt["args"] = args``), or a name. ``nodes``: the file's, from ``_walk``."""
    dicts: dict[str, list[tuple[Optional[str], ast.AST]]] = {}
    assigned: dict[str, list[ast.AST]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                assigned.setdefault(target.id, []).append(node.value)
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                dicts.setdefault(target.id, []).extend(
                    (key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None, value)
                    for key, value in zip(node.value.keys, node.value.values))
            elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                key = target.slice.value if isinstance(target.slice, ast.Constant) else None
                dicts.setdefault(target.value.id, []).append((key if isinstance(key, str) else None, node.value))
    found: set[Payload] = set()
    for node in nodes:
        if not (isinstance(node, ast.Call) and node.args and writes_checkpoint(node)):
            continue
        obj = node.args[0]
        if isinstance(obj, ast.Dict):
            entries = [(k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None, v)
                       for k, v in zip(obj.keys, obj.values)]
        elif isinstance(obj, ast.Name) and obj.id in dicts:
            entries = dicts[obj.id]
        else:
            entries = [(None, obj)]
        for key, value in entries:
            found |= _refused_value(key, value, assigned)
    return found


# values that show they hold plain data (a dict, a list, a number...) whatever the name they are assigned to
_PLAIN_VALUES = (ast.Dict, ast.DictComp, ast.List, ast.ListComp, ast.Tuple, ast.Set, ast.SetComp, ast.Constant,
                 ast.JoinedStr, ast.Compare, ast.BinOp, ast.UnaryOp)
_PLAIN_CALLS = {"dict", "list", "tuple", "vars", "state_dict", "int", "float", "str", "len", "item"}


def _refused_value(key: Optional[str], value: ast.AST,
                   assigned: Optional[dict[str, list[ast.AST]]] = None) -> set[Payload]:
    if isinstance(value, ast.Call):
        called = _dotted(value.func) or ""
        if called.rsplit(".", 1)[-1] == "parse_args":
            return {Payload.NAMESPACE}
        return {Payload.NUMPY} if called.rsplit(".", 1)[-1] == "numpy" or called.startswith(("np.", "numpy.")) \
            else set()
    if isinstance(value, _PLAIN_VALUES):
        return set()
    if isinstance(value, ast.Name) and assigned and value.id in assigned:
        # what the name was assigned, before what it is called: ``config = {k: globals()[k] ...}`` is plain data
        values = assigned[value.id][:4]
        if all(isinstance(v, _PLAIN_VALUES) or isinstance(v, ast.Call) and (
                (_dotted(v.func) or "").rsplit(".", 1)[-1] in _PLAIN_CALLS | {"parse_args"}) for v in values):
            return set().union(*(_refused_value(None, v) for v in values))
    name = (_dotted(value) or "").rsplit(".", 1)[-1].lower()
    if names_configuration(name) or names_configuration(key):
        return {Payload.NAMESPACE}
    if name and name_is_model_like(name) and not name.endswith(("_state", "state_dict", "_sd")):
        return {Payload.MODULE}
    return set()


def _note_import(node: ast.AST, summary: FileSummary) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            local = alias.asname or alias.name.split(".")[0]
            summary.imports[local] = (alias.name if alias.asname else local, None, 0)
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                summary.star_imports.append((module, node.level))
            else:
                summary.imports[alias.asname or alias.name] = (module, alias.name, node.level)


def _summarize_class(node: ast.ClassDef, path: str) -> ClassSummary:
    cls = ClassSummary(node.name, path, [b for b in (_dotted(base) for base in node.bases) if b])
    methods = {item.name: item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    init = methods.get("__init__")
    if init is not None:
        cls.init_evaluates = _evaluates_itself(init)
        appended = _appended_layers(_walk(ast.Module(body=init.body, type_ignores=[])))
        local_layers: dict[str, ast.AST] = {}
        for stmt in _walk(init):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    local_layers[target.id] = stmt.value
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                        target.value.id == "self":
                    value = stmt.value
                    extra = None
                    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Starred):
                        listed = _dotted(value.args[0].value)  # nn.Sequential(*layers)
                        source = local_layers.get(listed or "")
                        extra = (list(source.elts) if isinstance(source, ast.List) else []) + appended.get(listed, [])
                    elif isinstance(value, ast.Name) and value.id in local_layers:
                        extra = appended.get(value.id)
                        value = local_layers[value.id]
                    layer = layer_of(value, extra)
                    if layer is not None:
                        layer_extra = appended.get(f"self.{target.attr}")
                        if layer_extra:  # self.main.add_module('sigmoid', nn.Sigmoid())
                            layer.activation = (layer_of(layer_extra[-1]) or Layer()).activation
                            for item in layer_extra:
                                layer.kinds |= (layer_of(item) or Layer()).kinds
                        cls.layers[target.attr] = layer
                        cls.features |= layer.kinds & _FEATURES
        if _predicts_embedded_tokens(init):
            cls.features.add("vocab-output")
    getitem = methods.get("__getitem__")
    if getitem is not None:
        cls.item_source = _item_source(getitem)
    if any(_reads_training(method) for name, method in methods.items() if name != "__init__"):
        cls.features.add("reads-training")
    forward = methods.get("forward")
    if isinstance(forward, ast.FunctionDef):
        cls.has_forward = True
        reader = _ForwardReader(cls, forward)
        cls.forward_activation = reader.activation()
        if cls.forward_activation is not None and reader.returns:
            cls.forward_return_line = reader.returns[0][0]
        for inner in _walk(forward):
            if isinstance(inner, ast.Call) and _last(inner.func) in ("dropout", "dropout2d", "dropout1d",
                                                                    "alpha_dropout"):
                cls.functional_dropout = True
        if carried_state(forward, set(methods)):
            cls.features.add("carries-state")
    return cls


# Summaries by content digest, shared across indexes (a worker reviews one repository push after push).
MAX_CACHED_SUMMARIES = 20_000
_SUMMARIES: dict[str, FileSummary] = {}


# The imports of a file whose modules refused_payloads_near reads (a script imports a few project modules).
MAX_IMPORTS_FOLLOWED = 50
# The folders above a file whose scripts checkpoint_saves_near reads (the file's own, then up to the root).
MAX_FOLDERS_UP = 4
LISTING_PROBE = ".torchreview-listing"  # a name no script has: python_siblings of it lists a whole folder


def summary_by_digest(digest: str, source: str, path: str) -> FileSummary:
    """The summary of ``source`` (whose digest is ``digest``) at ``path``, parsed once per process for a content:
    the analyzed file and the index's view of it share one."""
    found = _SUMMARIES.get(digest)
    if found is None:
        found = summarize(source, path)
        if len(_SUMMARIES) >= MAX_CACHED_SUMMARIES:
            _SUMMARIES.pop(next(iter(_SUMMARIES)))  # oldest first: a bounded cache
        _SUMMARIES[digest] = found
    elif found.path != path:  # the same content elsewhere (the next review's checkout): no re-parse
        found = replace(found, path=path, classes={name: replace(c, path=path) for name, c in found.classes.items()})
    return found


class RepositoryIndex:
    """Summaries of a repository's files, read on demand and cached by content."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._by_path: dict[Path, tuple[tuple[int, int], str, FileSummary]] = {}
        self._notebooks: dict[Path, tuple[tuple[int, int], Optional[str], set[str]]] = {}

    def summary(self, path: Path, source: Optional[str] = None) -> Optional[FileSummary]:
        try:
            stat = path.stat()
        except OSError:
            if source is None:
                _note_file(path, None)
                return None
            stat = None
        key = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
        cached = self._by_path.get(path)
        if cached is not None and key is not None and cached[0] == key and source is None:
            # None: summarized from a text given by the caller; dependencies are compared by bytes
            _note_file(path, cached[1] if cached[1] is not None else file_digest(path))
            return cached[2]
        given = source
        if source is None:
            data = _read_bounded(path)
            digest = _digest(data) if data is not None else None
            _note_file(path, digest)  # the analyzed file's own text (``source``) is in the cache key already
            if data is None:
                return None
            source = data.decode("utf-8-sig", "replace")  # a BOM is not Python: ast would refuse the file
        else:
            digest = _digest(source.encode("utf-8", "replace"))
        found = summary_by_digest(digest, source, str(path))
        if key is not None:
            self._by_path[path] = (key, digest if given is None else None, found)
        return found

    # ---- resolving names ---------------------------------------------------------------------------
    def _module_files(self, module: str, level: int, importer: Path) -> list[Path]:
        parts = [p for p in module.split(".") if p]
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        else:
            # a sibling module (scripts run from their own folder), then the repository root, then its src/
            bases = [importer.parent, self.root, self.root / "src"]
        found = []
        for base in bases:
            target = base.joinpath(*parts) if parts else base
            for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
                if candidate is not None and _note_probe(candidate, module_file_usable(candidate, self.root)):
                    found.append(candidate)
        return found

    def find_class(self, importer: Path, local_name: str, source: Optional[str] = None,
                   depth: int = 0) -> Optional[ClassSummary]:
        """The class ``local_name`` means in ``importer``: defined there, imported, or re-exported."""
        return self._find_defined(importer, local_name, lambda summary: summary.classes, source, depth)

    def find_eval_helper(self, importer: Path, local_name: str,
                         source: Optional[str] = None) -> Optional[tuple[list[str], list[str]]]:
        """(parameters, parameters left in eval mode) of the function ``local_name`` means in ``importer``, when
        it leaves a module it is given in eval mode."""
        return self._find_defined(importer, local_name, lambda summary: summary.eval_helpers, source, 0)

    def find_marked_function(self, importer: Path, local_name: str, marks: Callable[[FileSummary], dict],
                             source: Optional[str] = None) -> Optional[bool]:
        """True when the function ``local_name`` means in ``importer`` is one ``marks(summary)`` lists for the file
        that defines it (``FileSummary.clipping_functions``, ``freezing_functions``...)."""
        return self._find_defined(importer, local_name, marks, source, 0)

    def find_factory(self, importer: Path, local_name: str,
                     source: Optional[str] = None) -> Optional[tuple[str, tuple[str, ...]]]:
        """(the file that defines it, the classes it builds) of the factory function ``local_name`` means in
        ``importer`` (``FileSummary.factories``)."""
        return self._find_defined(importer, local_name, lambda summary: {
            name: (summary.path, built) for name, built in summary.factories.items()}, source, 0)

    def _find_defined(self, importer: Path, local_name: str, defined, source: Optional[str], depth: int):
        """What ``defined(summary)`` holds for ``local_name`` in ``importer``: defined there, imported, or
        re-exported."""
        if depth > 4:
            return None
        summary = self.summary(importer, source)
        if summary is None:
            return None
        head, _, rest = local_name.partition(".")
        if not rest and head in defined(summary):
            return defined(summary)[head]
        imported = summary.imports.get(head)
        if imported is not None:
            module, name, level = imported
            if name is None:  # import models as M; M.Net
                target_module, target_name = module, rest
            elif rest:  # from pkg import models; models.Net
                target_module, target_name = f"{module}.{name}" if module else name, rest
            else:
                target_module, target_name = module, name
            if not target_name:
                return None
            for path in self._module_files(target_module, level, importer):
                found = self._find_defined(path, target_name, defined, None, depth + 1)
                if found is not None:
                    return found
            if name is not None and not rest:  # from pkg import Net, where pkg/Net.py... or a submodule
                for path in self._module_files(f"{module}.{name}" if module else name, level, importer):
                    found = self._find_defined(path, name, defined, None, depth + 1)
                    if found is not None:
                        return found
            return None
        for module, level in summary.star_imports:
            for path in self._module_files(module, level, importer):
                found = self._find_defined(path, local_name, defined, None, depth + 1)
                if found is not None:
                    return found
        return None

    def star_names(self, importer: Path, source: Optional[str] = None,
                   depth: int = 0) -> dict[str, Optional[str]]:
        """Every name ``importer``'s ``from m import *`` of repository modules brings, with the qualified name it
        has: ``numpy`` for the ``np`` of ``import numpy as np`` in ``m``; None for a name the repository defines
        itself (a class, or an import from within the repository). Read once per file: a file that star-imports
        a package asks about many names."""
        table: dict[str, Optional[str]] = {}
        summary = self.summary(importer, source) if depth <= 4 else None
        if summary is None:
            return table
        for module, level in reversed(summary.star_imports):  # a later star import shadows an earlier one
            for path in self._module_files(module, level, importer):
                other = self.summary(path)
                if other is None:
                    continue
                brought: dict[str, Optional[str]] = dict.fromkeys(other.classes)
                for name, (origin, imported_name, origin_level) in other.imports.items():
                    if name not in brought:
                        brought[name] = None if origin_level else (
                            origin if imported_name is None else f"{origin}.{imported_name}")
                for name, meaning in self.star_names(path, depth=depth + 1).items():
                    brought.setdefault(name, meaning)
                for name, meaning in brought.items():
                    table.setdefault(name, meaning)
        return table

    def saved_beside(self, path: Path) -> set[str]:
        """File names the other scripts and notebooks of ``path``'s folder give literally to ``torch.save``: a
        companion notebook that trains and saves the checkpoint a script of its folder loads is the same
        program's."""
        names: set[str] = set()
        siblings = python_siblings(path)
        _note_listing(path, siblings)
        for sibling in siblings:
            summary = self.summary(sibling)
            if summary is not None:
                names |= summary.saved_names
        for notebook in notebook_siblings(path):
            names |= self._notebook_saves(notebook)
        return names

    def _notebook_saves(self, path: Path) -> set[str]:
        """:func:`notebook_saved_names` of one notebook, read once per content (by its size and time while it
        stays the same); one over ``MAX_SUMMARY_BYTES`` (images in its outputs) is not read."""
        try:
            stat = path.stat()
        except OSError:
            _note_file(path, None)
            return set()
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._notebooks.get(path)
        if cached is not None and cached[0] == key:
            _note_file(path, cached[1])
            return cached[2]
        data = _read_bounded(path)
        digest = _digest(data) if data is not None else None
        _note_file(path, digest)
        names = notebook_saved_names(data) if data is not None and b"save" in data else set()
        self._notebooks[path] = (key, digest, names)
        return names

    def refused_payloads_near(self, path: Path) -> dict[str, set[Payload]]:
        """What the scripts beside ``path`` and the repository modules it imports save into checkpoints that
        ``weights_only=True`` refuses, by file (relative to the root when inside it): a checkpoint this file
        loads may be one of theirs."""
        found: dict[str, set[Payload]] = {}
        siblings = python_siblings(path)
        _note_listing(path, siblings)
        others = list(siblings)
        summary = self.summary(path)
        for module, name, level in list(summary.imports.values())[:MAX_IMPORTS_FOLLOWED] if summary else ():
            others += self._module_files(module, level, path)
            if name is not None:
                others += self._module_files(f"{module}.{name}" if module else name, level, path)
        for other in dict.fromkeys(others):
            refused = self._refused_payloads_of(other)
            if refused:
                try:
                    shown = other.resolve().relative_to(self.root).as_posix()
                except ValueError:
                    shown = other.name
                found[shown] = set(refused)
        return found

    def checkpoint_saves_near(self, path: Path) -> dict[str, list[SavedCheckpoint]]:
        """The checkpoints the other scripts of the repository around ``path`` save, by file (relative to the root
        when inside it): the scripts of its folder and of each folder above it up to the root (``tools/eval.py``
        reads what ``train.py`` wrote; ``utils/checkpoint.py`` what the training script beside ``utils/`` wrote),
        and the repository modules it imports. Summaries are the index's, cached by content: asking for the files
        of one repository again parses nothing."""
        found: dict[str, list[SavedCheckpoint]] = {}
        others: list[Path] = []
        folder = path.resolve().parent
        probe = path
        for _ in range(MAX_FOLDERS_UP):
            siblings = python_siblings(probe)
            _note_listing(probe, siblings)
            others += siblings
            if folder == self.root or folder.parent == folder or self.root not in folder.parents:
                break
            folder = folder.parent
            probe = folder / LISTING_PROBE
        summary = self.summary(path)
        for module, name, level in list(summary.imports.values())[:MAX_IMPORTS_FOLLOWED] if summary else ():
            others += self._module_files(module, level, path)
            if name is not None:
                others += self._module_files(f"{module}.{name}" if module else name, level, path)
        resolved = path.resolve()
        for other in dict.fromkeys(others):
            if other.resolve() == resolved or not self._may_save(other):
                continue
            other_summary = self.summary(other)
            if other_summary is not None and other_summary.checkpoint_saves:
                try:
                    shown = other.resolve().relative_to(self.root).as_posix()
                except ValueError:
                    shown = other.name
                found[shown] = other_summary.checkpoint_saves
        return found

    def _may_save(self, path: Path) -> bool:
        """Can ``path`` hold a checkpoint save: summarized already, or its bytes say ``save`` (read, not parsed)."""
        if path in self._by_path:
            return True
        data = _read_bounded(path)
        if data is not None and b"save" not in data:
            _note_file(path, _digest(data))  # what summary() notes: the answer depends on these bytes
            return False
        return data is not None

    def _refused_payloads_of(self, path: Path) -> set[Payload]:
        """``summary(path).refused_payloads``. A file not summarized yet that never says ``save`` is read, not
        parsed: ``summarize`` looks for checkpoints only where it does (most of the files beside a loader)."""
        if path not in self._by_path:
            data = _read_bounded(path)
            if data is not None and b"save" not in data:  # ASCII: the same bytes in the text summarize reads
                _note_file(path, _digest(data))  # what summary() notes: the answer depends on these bytes
                return set()
        summary = self.summary(path)
        return summary.refused_payloads if summary is not None else set()

    def module_layer(self, importer: Path, local_name: str, source: Optional[str] = None) -> Optional[Layer]:
        """A module-level ``D = nn.Sequential(...)`` of ``importer`` (or imported into it)."""
        summary = self.summary(importer, source)
        if summary is None:
            return None
        return summary.module_layers.get(local_name)

    def features(self, cls: ClassSummary, seen: Optional[set[str]] = None) -> set[str]:
        """dropout / batchnorm / recurrent / transformer of a class, its submodules and bases, across files."""
        seen = seen if seen is not None else set()
        key = f"{cls.path}:{cls.name}"
        if key in seen:
            return set()
        seen.add(key)
        found = set(cls.features)
        if cls.functional_dropout:
            found.add("dropout")
        path = Path(cls.path)
        for layer in cls.layers.values():
            for kind in layer.classes:
                sub = self.find_class(path, kind)
                if sub is not None:
                    found |= self.features(sub, seen)
        for base in cls.bases:
            sub = self.find_class(path, base)
            if sub is not None:
                found |= self.features(sub, seen)
        return found

    def forward_activation(self, cls: ClassSummary) -> Optional[str]:
        if cls.has_forward:
            return cls.forward_activation
        for base in cls.bases:  # an inherited forward
            sub = self.find_class(Path(cls.path), base)
            if sub is not None:
                return self.forward_activation(sub)
        return None


_INDEXES: dict[Path, RepositoryIndex] = {}


def index_for(path: Path) -> RepositoryIndex:
    """The process-wide index of the repository holding ``path`` (one per root, kept for later files)."""
    root = repository_root(path)
    index = _INDEXES.get(root)
    if index is None:
        index = _INDEXES[root] = RepositoryIndex(root)
    return index


def file_in_repository(ctx) -> Path:
    """The analyzed file's path on disk: as given, or under the index's root for a repository-relative
    path (the App analyzes ``train.py`` of a pull request with the head's tree as context)."""
    path = Path(ctx.path)
    index = ctx.repository
    if index is not None and not path.is_absolute() and not path.exists():
        return index.root / path
    return path


class ModuleFacts:
    """The module questions a rule asks about its file, answered from the repository when there is one."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._local: Optional[FileSummary] = None
        self._star_names: Optional[dict[str, Optional[str]]] = None

    def _summary(self) -> FileSummary:
        if self._local is None:
            self._local = summary_by_digest(_digest(self.ctx.source.encode("utf-8", "replace")), self.ctx.source,
                                            str(self.ctx.path))
        return self._local

    def checkpoint_saves(self) -> list[SavedCheckpoint]:
        """The file's own ``torch.save`` calls, as the repository index records them for the other files."""
        return self._summary().checkpoint_saves

    def eval_helper(self, name: str) -> Optional[tuple[list[str], list[str]]]:
        """(parameters, parameters left in eval mode) of a function this file imports from the repository that
        puts a module it is given in eval mode and never back; None otherwise, or without a repository."""
        index = self.ctx.repository
        if index is None:
            return None
        return index.find_eval_helper(file_in_repository(self.ctx), name, self.ctx.source)

    def marked_function(self, name: str, marks: Callable[[FileSummary], dict]) -> Optional[bool]:
        """Is the function ``name`` this file calls (its own, or one it imports from the repository) one
        ``marks(summary)`` lists for the file that defines it? None when it cannot be found (no repository, or a
        module the index does not resolve)."""
        index = self.ctx.repository
        if index is None:
            return None
        return index.find_marked_function(file_in_repository(self.ctx), name, marks, self.ctx.source)

    def star_imported(self, name: str) -> Optional[str]:
        """What a name this file neither defines nor imports means through its star imports (see
        :meth:`RepositoryIndex.star_names`); None without a repository, or for a name of the repository."""
        if self._star_names is None:
            index = self.ctx.repository
            self._star_names = {} if index is None or not self._summary().star_imports else \
                index.star_names(file_in_repository(self.ctx), self.ctx.source)
        return self._star_names.get(name)

    def find_class(self, name: str) -> Optional[ClassSummary]:
        index = self.ctx.repository
        if index is not None:
            return index.find_class(file_in_repository(self.ctx), name, self.ctx.source)
        return self._summary().classes.get(name)

    def forward_activation(self, name: str) -> Optional[str]:
        cls = self.find_class(name)
        if cls is None:
            return None
        index = self.ctx.repository
        if index is not None:
            return index.forward_activation(cls)
        if cls.has_forward:
            return cls.forward_activation
        for base in cls.bases:
            parent = self._summary().classes.get(base)
            if parent is not None and parent.has_forward:
                return parent.forward_activation
        return None

    def forward_site(self, name: str) -> Optional[int]:
        """The line of ``name.forward``'s activation return, when the class is defined in this file."""
        cls = self._summary().classes.get(name)
        return cls.forward_return_line if cls is not None else None

    def is_module_class(self, name: str) -> bool:
        """Is the class ``name`` (defined here or in another file of the repository) an ``nn.Module``: it
        defines ``forward`` or derives from ``Module``, directly or through its project bases?"""
        index = self.ctx.repository
        cls = self.find_class(name)
        seen: set[str] = set()
        while cls is not None and f"{cls.path}:{cls.name}" not in seen and len(seen) < 6:
            seen.add(f"{cls.path}:{cls.name}")
            if cls.has_forward or any(b.rsplit(".", 1)[-1] in ("Module", "LightningModule") for b in cls.bases):
                return True
            parents = [index.find_class(Path(cls.path), b) if index is not None else self._summary().classes.get(b)
                       for b in cls.bases]
            cls = next((p for p in parents if p is not None), None)
        return False

    def reads_data(self, class_names: Iterable[str]) -> bool:
        """Does this file, or the file of any of these classes (its Dataset), read real data?"""
        if search(READS_DATA, self.ctx.source):
            return True
        index = self.ctx.repository
        for name in class_names:
            cls = self.find_class(name)
            if cls is None:
                continue
            summary = index.summary(Path(cls.path)) if index is not None else self._summary()
            if summary is not None and summary.reads_data:
                return True
        return False

    def item_source(self, name: str) -> Optional[str]:
        """Where the data set class ``name`` (of this repository) takes its items from: "memory", "disk", or None
        (unknown: not found, or ``__getitem__`` does something else); an inherited ``__getitem__`` counts."""
        cls = self.find_class(name)
        index = self.ctx.repository
        seen: set[str] = set()
        while cls is not None and f"{cls.path}:{cls.name}" not in seen and len(seen) < 6:
            seen.add(f"{cls.path}:{cls.name}")
            if cls.item_source is not None:
                return cls.item_source
            parents = [index.find_class(Path(cls.path), b) if index is not None else self._summary().classes.get(b)
                       for b in cls.bases]
            cls = next((p for p in parents if p is not None), None)
        return None

    def features(self, name: str) -> Optional[set[str]]:
        """None when the class is unknown (imported from outside the repository, or no repository)."""
        cls = self.find_class(name)
        if cls is None:
            return None
        index = self.ctx.repository
        if index is not None:
            return index.features(cls)
        return self._local_features(cls, set())

    def built_features(self, name: str) -> Optional[set[str]]:
        """The features of what the factory function ``name`` (this file's, or one it imports from the repository)
        returns: every class it builds, found in the file that defines the function; None when not known."""
        index = self.ctx.repository
        if index is None:
            summary = self._summary()
            built = summary.factories.get(name)
            classes = [summary.classes.get(kind) for kind in built] if built else []
            if not classes or any(cls is None for cls in classes):
                return None
            return set().union(*(self._local_features(cls, set()) for cls in classes))
        found = index.find_factory(file_in_repository(self.ctx), name, self.ctx.source)
        if found is None:
            return None
        where, built = found
        classes = [index.find_class(Path(where), kind) for kind in built]
        if not classes or any(cls is None for cls in classes):
            return None
        return set().union(*(index.features(cls) for cls in classes))

    def _local_features(self, cls: ClassSummary, seen: set[str]) -> set[str]:
        """Without a repository: the features of a class, its submodules and bases defined in this file."""
        if cls.name in seen:
            return set()
        seen.add(cls.name)
        found = set(cls.features) | ({"dropout"} if cls.functional_dropout else set())
        classes = self._summary().classes
        for name in [kind for layer in cls.layers.values() for kind in layer.classes] + cls.bases:
            sub = classes.get(name)
            if sub is not None:
                found |= self._local_features(sub, seen)
        return found


_ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "README.md", "LICENSE")


def calls_marked_function(ctx: "FileContext", marks: Callable[[FileSummary], dict], own: Iterable[str] = (),
                          handed: bool = False) -> bool:
    """Does the file call a function ``marks(summary)`` lists: one of ``own`` (this file's, found without a
    repository), or one the repository's summaries mark where it is defined? With ``handed``, a function handed to a
    call counts too (``model.apply(set_bn_eval)``)."""
    nodes = ctx.facts(ModuleNodes)
    facts = ctx.facts(ModuleFacts)
    own = set(own)
    if handed:
        named_nodes = [node for node in nodes.of_type(cst.Name, cst.Attribute)
                       if isinstance(nodes.parents.get(id(node)), (cst.Call, cst.Arg))]
    else:
        named_nodes = [call.func for call in nodes.of_type(cst.Call)]
    asked: set[str] = set()
    for node in named_nodes:
        named = dotted_name(node)
        if named is None or named in asked or named.startswith("self."):
            continue
        asked.add(named)
        if named in own or facts.marked_function(named, marks):
            return True
    return False


def repository_root(path: Path) -> Path:
    """The repository a file belongs to: the nearest folder with ``.git`` (or, for a plain copy, a project
    file such as ``pyproject.toml`` or ``README.md``), else the file's own folder."""
    path = path.resolve()
    folders = [str(path.parent)]  # as strings: asked for every file analyzed, and pathlib's objects cost more
    while (parent := os.path.dirname(folders[-1])) != folders[-1]:
        folders.append(parent)
    for marker in (_ROOT_MARKERS[:1], _ROOT_MARKERS[1:]):
        for folder in folders:
            if any(os.path.exists(os.path.join(folder, name)) and not _module_of_a_package(folder, name)
                   for name in marker):
                return Path(folder)
    return path.parent


def _module_of_a_package(folder: str, name: str) -> bool:
    """``setup.py`` in a folder with ``__init__.py`` is one of the package's modules (``pkg/eval/setup.py`` that
    builds the evaluation's model), not the project's packaging script: it marks no root."""
    return name.endswith(".py") and os.path.exists(os.path.join(folder, "__init__.py"))


# ---- what one analysis read, for the results cache ------------------------------------------------
# A file's findings can depend on other files (the model class in model.py, the checkpoints sibling
# scripts save). The index is the only code that looks at other files, so it notes here everything
# it looked at; the cache re-checks exactly that before reusing a result.

MAX_SUMMARY_BYTES = 2_000_000


@dataclass
class Dependencies:
    """What an analysis consulted besides its own text, each with what it found."""

    files: dict[str, Optional[str]] = field(default_factory=dict)  # absolute path -> content digest (None: unread)
    probes: dict[str, bool] = field(default_factory=dict)  # candidate module file -> was it a usable file
    listings: dict[str, list[str]] = field(default_factory=dict)  # file -> the sibling scripts it looked at
    # folder -> the requirement files in it whose pins were read (their contents are in ``files``)
    pin_files: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"files": self.files, "probes": self.probes, "listings": self.listings, "pin_files": self.pin_files}

    @classmethod
    def from_dict(cls, data: dict) -> "Dependencies":
        return cls(dict(data.get("files", {})), dict(data.get("probes", {})), dict(data.get("listings", {})),
                   dict(data.get("pin_files", {})))

    def relative_to(self, root: Path) -> "Dependencies":
        """The same, with paths relative to ``root`` (a checkout that is extracted anew for every run)."""
        def rel(path: str) -> str:
            try:
                return str(Path(path).relative_to(root))
            except ValueError:
                return path  # outside the repository: kept absolute

        return Dependencies({rel(p): d for p, d in self.files.items()}, {rel(p): u for p, u in self.probes.items()},
                            {rel(p): [rel(x) for x in xs] for p, xs in self.listings.items()},
                            {rel(p): names for p, names in self.pin_files.items()})

    def under(self, root: Path) -> "Dependencies":
        """:meth:`relative_to` undone against this run's checkout."""
        def absolute(path: str) -> str:
            return path if os.path.isabs(path) else str(root / path)

        return Dependencies({absolute(p): d for p, d in self.files.items()},
                            {absolute(p): u for p, u in self.probes.items()},
                            {absolute(p): [absolute(x) for x in xs] for p, xs in self.listings.items()},
                            {absolute(p): names for p, names in self.pin_files.items()})

    def unchanged(self, root: Path, digest_of=None) -> bool:
        """Would the index find the same things now? ``digest_of`` may memoize :func:`file_digest`."""
        digest_of = digest_of or file_digest
        from analyzers.program.versions import pin_file_names

        for path, usable in self.probes.items():
            if module_file_usable(Path(path), root) != usable:
                return False
        for folder, names in self.pin_files.items():
            if pin_file_names(Path(folder)) != names:  # one added or removed; the contents are in ``files``
                return False
        for path, siblings in self.listings.items():
            if [str(p) for p in python_siblings(Path(path)) + notebook_siblings(Path(path))] != siblings:
                return False
        return all(digest_of(Path(path)) == digest for path, digest in self.files.items())


_RECORDING: ContextVar[Optional[Dependencies]] = ContextVar("torchreview_dependencies", default=None)


@contextmanager
def recording() -> Iterator[Dependencies]:
    """Note what the index consults (in this thread / context) until the block ends."""
    deps = Dependencies()
    token = _RECORDING.set(deps)
    try:
        yield deps
    finally:
        _RECORDING.reset(token)


def _note_file(path: Path, digest: Optional[str]) -> None:
    deps = _RECORDING.get()
    if deps is not None:
        deps.files.setdefault(os.path.abspath(path), digest)


def _note_probe(path: Path, usable: bool) -> bool:
    deps = _RECORDING.get()
    if deps is not None:
        deps.probes.setdefault(os.path.abspath(path), usable)
    return usable


def note_pin_folder(folder: Path, pin_files: list[Path]) -> None:
    """The requirement files of ``folder`` were read for its pins (versions.py)."""
    deps = _RECORDING.get()
    if deps is not None and os.path.abspath(folder) not in deps.pin_files:
        deps.pin_files[os.path.abspath(folder)] = [p.name for p in pin_files]
        for path in pin_files:
            _note_file(path, file_digest(path))


def _note_listing(path: Path, siblings: list[Path]) -> None:
    """The scripts of ``path``'s folder (``siblings``) were read, and its notebooks may be: both are noted."""
    deps = _RECORDING.get()
    if deps is not None and os.path.abspath(path) not in deps.listings:
        deps.listings[os.path.abspath(path)] = [str(p) for p in siblings + notebook_siblings(path)]


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _read_bounded(path: Path) -> Optional[bytes]:
    """A file's bytes as the index reads them; None when it cannot or will not (too large)."""
    try:
        if path.stat().st_size > MAX_SUMMARY_BYTES:
            return None
        return path.read_bytes()
    except OSError:
        return None


def file_digest(path: Path) -> Optional[str]:
    data = _read_bounded(path)
    return _digest(data) if data is not None else None


def module_file_usable(candidate: Path, root: Path) -> bool:
    """An import may resolve to ``candidate``: a file inside the repository."""
    try:
        if not candidate.is_file():
            return False
        candidate.resolve().relative_to(root)
        return True
    except (ValueError, OSError):
        return False


def python_siblings(path: Path) -> list[Path]:
    """The other scripts of ``path``'s folder (at most 200), as :meth:`RepositoryIndex.saved_beside` reads them."""
    return _siblings(path, "*.py", 200)


def notebook_siblings(path: Path) -> list[Path]:
    """The notebooks of ``path``'s folder other than itself (at most 50), as
    :meth:`RepositoryIndex.saved_beside` reads them."""
    return _siblings(path, "*.ipynb", 50)


def _siblings(path: Path, pattern: str, most: int) -> list[Path]:
    try:
        resolved = path.resolve()
        # the folder is resolved already: a sibling is itself unless it is a link (one lstat, not a resolve per file)
        return sorted(p for p in resolved.parent.glob(pattern)
                      if p != resolved and not (p.is_symlink() and p.resolve() == resolved))[:most]
    except OSError:
        return []


def torch_layer_features(ctx: "FileContext", call: cst.Call) -> Optional[set[str]]:
    """dropout / batchnorm of a model built straight from torch.nn (``nn.Linear(...)``, ``nn.Sequential(...)``),
    or None when it holds anything else (a project class, a torchvision model)."""
    if not (ctx.qualified_name(call.func) or "").startswith("torch.nn."):
        return None
    layer = layer_of(ast.parse(ctx.module.code_for_node(call), mode="eval").body)
    if layer is None or layer.classes:
        return None
    return layer.kinds
