"""What role code plays: compatibility fallbacks, and the checkpoints a program writes before loading them."""
from __future__ import annotations

import ast
import enum
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Iterable, Optional

import libcst as cst

from analyzers.context import all_children, argument, dotted_name, string_value
from analyzers.program.builds import built_module
from analyzers.program.flow import ModuleNodes, assignment_before, call_site_values, parameter, subtree
from analyzers.program.library import (CHECKPOINT_CALLBACK_ATTRIBUTES, WRITTEN_CHECKPOINT_ATTRIBUTES, Does, does,
                                       method_returns_same_module)
from analyzers.program.names import last_segment, name_is_model_like, names_configuration

if TYPE_CHECKING:
    from analyzers.context import FileContext

# An ``except`` for one of these around a call means "this is the fallback for another library version".
_COMPAT_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "TypeError", "AttributeError", "NameError"}
# The torchvision references' ``utils.save_on_master`` (copied into DETR, DINO, MAE and many more) is torch.save
# on the main process: ``save_on_master(*args, **kwargs)``.
SAVE_ON_MASTER = "save_on_master"


def _handler_types(handler: cst.ExceptHandler) -> set[str]:
    if handler.type is None:
        return set()
    elements = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    names = set()
    for element in elements:
        value = element.value if isinstance(element, cst.Element) else element
        dotted = dotted_name(value)
        if dotted:
            names.add(dotted.rsplit(".", 1)[-1])
    return names


def in_compat_fallback(ctx: "FileContext", node: cst.CSTNode) -> bool:
    """``node`` runs only when an import, a keyword or an attribute is missing (an older library): inside an
    ``except ImportError/AttributeError/TypeError`` handler, or as the default a name gets before the code
    replaces it where the newer API exists (``f = old; if hasattr(mod, "new"): f = mod.new``)."""
    return any(isinstance(a, cst.ExceptHandler) and _handler_types(a) & _COMPAT_EXCEPTIONS
               for a in ctx.ancestors(node)) or _default_replaced_when_available(ctx, node)


def _default_replaced_when_available(ctx: "FileContext", node: cst.CSTNode) -> bool:
    statement = ctx.statement_of(node)
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1 or \
            not isinstance(statement.targets[0].target, cst.Name):
        return False
    name = statement.targets[0].target.value
    line = ctx.parent(statement)
    block = ctx.parent(line) if line is not None else None
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or line not in body:
        return False
    for later in body[body.index(line) + 1:]:
        if isinstance(later, cst.If) and _tests_availability(later.test) and _assigns(later.body, name):
            return True
    return False


def _tests_availability(test: cst.BaseExpression) -> bool:
    """``hasattr(torch.nn.utils, "x")``, or a comparison with a ``__version__``: the code asks what it runs on."""
    for node in subtree(test):
        if isinstance(node, cst.Call) and dotted_name(node.func) in ("hasattr", "getattr"):
            return True
        if isinstance(node, cst.Attribute) and node.attr.value == "__version__":
            return True
    return False


def _assigns(block: cst.BaseSuite, name: str) -> bool:
    return any(isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name) and node.target.value == name
               for node in subtree(block))


class Payload(enum.Enum):
    """What a checkpoint holds, as far as ``weights_only=True`` is concerned."""

    TENSORS = "tensors, state dicts and plain values"
    MODULE = "a whole nn.Module"
    NAMESPACE = "an argparse.Namespace / config object"
    NUMPY = "NumPy arrays"

    @property
    def loads_weights_only(self) -> bool:
        return self is Payload.TENSORS


# calls that build a configuration object, which weights_only=True refuses to unpickle
_NAMESPACE_CONSTRUCTORS = {"argparse.Namespace", "types.SimpleNamespace", "omegaconf.OmegaConf.create",
                           "omegaconf.OmegaConf.load", "easydict.EasyDict"}
_MODEL_WORDS = ("model", "net", "module", "generator", "discriminator", "encoder", "decoder", "backbone", "ema")


def constructs_module(ctx: "FileContext", value: cst.Call, name: str) -> bool:
    """Does ``name = value`` hold an ``nn.Module``: what :func:`~analyzers.program.values.built_module` can tell,
    else an unknown class (imported from the project) assigned to a model-like name."""
    if built_module(ctx, value) is not None:
        return True
    origin: Optional[cst.BaseExpression] = value
    while (isinstance(origin, cst.Call) and isinstance(origin.func, cst.Attribute)
           and method_returns_same_module(origin.func.attr.value)):
        origin = ctx.origin(origin.func.value)
    if not isinstance(origin, cst.Call):
        return name_is_model_like(name)
    called = ctx.call_name(origin) or dotted_name(origin.func) or ""
    return called.rsplit(".", 1)[-1][:1].isupper() and name_is_model_like(name)


def holds_module(ctx: "FileContext", expr: cst.BaseExpression) -> bool:
    """Does ``expr`` (a name or attribute about to be saved) hold an ``nn.Module``: what built it says so, or,
    when nothing built it here, its name does, unless the function also hands it to an API that takes a dict of
    tensors (``save_file(model, path)`` of safetensors: a state dict, whatever it is called)."""
    origin = ctx.origin(expr)
    name = dotted_name(expr) or ""
    if isinstance(origin, cst.Call):
        return constructs_module(ctx, origin, name)
    if not name_is_model_like(name):
        return False
    scope = next((a for a in ctx.ancestors(expr) if isinstance(a, cst.FunctionDef)), ctx.module)
    return not any(isinstance(node, cst.Call) and node.args and dotted_name(node.args[0].value) == name
                   and does(ctx.call_name(node), Does.TAKES_TENSOR_DICT) for node in subtree(scope))


@dataclass
class CheckpointWrite:
    call: cst.Call
    path: Optional[cst.BaseExpression]
    payloads: set[Payload]
    path_literals: set[str] = field(default_factory=set)
    path_text: str = ""


class CheckpointWrites:
    """Every ``torch.save`` in a file: where it writes and what it puts there. Built on first use."""

    def __init__(self, ctx: "FileContext") -> None:
        self.ctx = ctx

    @cached_property
    def _assignments(self) -> dict[str, list[cst.BaseExpression]]:
        found: dict[str, list[cst.BaseExpression]] = {}
        for node in self.ctx.facts(ModuleNodes).of_type(cst.Assign, cst.Param):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    name = dotted_name(target.target)
                    if name:
                        found.setdefault(name, []).append(node.value)
            elif isinstance(node, cst.Param) and node.default is not None:
                found.setdefault(node.name.value, []).append(node.default)
        return found

    @cached_property
    def _subscript_stores(self) -> dict[str, list[tuple[Optional[str], cst.BaseExpression]]]:
        """``ckpt["args"] = args`` → {"ckpt": [("args", <args>)]}."""
        found: dict[str, list[tuple[Optional[str], cst.BaseExpression]]] = {}
        for node in self.ctx.facts(ModuleNodes).of_type(cst.Assign):
            for target in node.targets:
                sub = target.target
                if isinstance(sub, cst.Subscript) and len(sub.slice) == 1:
                    container = dotted_name(sub.value)
                    index = sub.slice[0].slice
                    key = string_value(index.value) if isinstance(index, cst.Index) else None
                    if container:
                        found.setdefault(container, []).append((key, node.value))
        return found

    @cached_property
    def writes(self) -> list[CheckpointWrite]:
        ctx = self.ctx
        result = []
        for node in ctx.facts(ModuleNodes).of_type(cst.Call):
            if does(ctx.qualified_name(node.func), Does.WRITES_TORCH_CHECKPOINT) or \
                    (dotted_name(node.func) or "").rsplit(".", 1)[-1] == SAVE_ON_MASTER:
                path = self.opened_path(node, argument(node, 1, "f"))
                obj = argument(node, 0, "obj")
                write = CheckpointWrite(node, path, self.payloads(obj) if obj is not None else set())
                if path is not None:
                    write.path_text = _normalized(ctx, path)
                    write.path_literals = self.literals(path) | self._passed_literals(node, path)
                result.append(write)
        return result

    def opened_path(self, call: cst.Call, target: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
        """The path of ``with open(path, "wb") as f: torch.save(obj, f)`` (or ``"rb"`` around a load): the file the
        handle ``target`` of ``call`` reads or writes; ``target`` itself when it is not such a handle."""
        if not isinstance(target, cst.Name):
            return target
        for node in self._ancestry(call):
            if isinstance(node, cst.With):
                for item in node.items:
                    handle = item.asname.name if item.asname is not None else None
                    if isinstance(handle, cst.Name) and handle.value == target.value and \
                            isinstance(item.item, cst.Call) and dotted_name(item.item.func) == "open" and item.item.args:
                        return item.item.args[0].value
            if isinstance(node, (cst.FunctionDef, cst.Lambda)):
                break
        return target

    def _passed_literals(self, call: cst.Call, path: cst.BaseExpression) -> set[str]:
        """``def train(..., save_path): torch.save(..., save_path)`` called as ``train(..., 'model.pt')``."""
        if not isinstance(path, cst.Name):
            return set()
        fn = next((a for a in self.ctx.ancestors(call) if isinstance(a, cst.FunctionDef)), None)
        if fn is None:
            return set()
        values = call_site_values(self.ctx, fn, path.value) or []
        found: set[str] = set()
        for value in values:
            found |= self.literals(value)
        return found

    def literals(self, expr: cst.BaseExpression, depth: int = 2) -> set[str]:
        """File names spelled in a path expression, following simple assignments of the names in it."""
        found = set()
        for node in subtree(expr):
            value = string_value(node) if isinstance(node, cst.SimpleString) else None
            if value and "." in value.rsplit("/", 1)[-1]:
                found.add(value.rsplit("/", 1)[-1])
            elif isinstance(node, cst.FormattedStringText) and "." in node.value:
                found.add(node.value.rsplit("/", 1)[-1])
            if depth and isinstance(node, (cst.Name, cst.Attribute)):
                name = dotted_name(node)
                for value_expr in self._assignments.get(name or "", ())[:4]:
                    found |= self.literals(value_expr, depth - 1)
        return found

    def payloads(self, obj: cst.BaseExpression, depth: int = 2) -> set[Payload]:
        if isinstance(obj, cst.Dict):
            kinds: set[Payload] = set()
            for element in obj.elements:
                if isinstance(element, cst.DictElement):
                    kinds |= self._value_payload(element.value, string_value(element.key), depth)
                elif isinstance(element, cst.StarredDictElement):
                    kinds |= self.payloads(element.value, depth - 1) if depth else set()
            return kinds or {Payload.TENSORS}
        name = dotted_name(obj)
        if name and depth and name in self._assignments:
            kinds = set()
            for value in self._assignments[name][:4]:
                if isinstance(value, cst.Call) and constructs_module(self.ctx, value, name):
                    kinds.add(Payload.MODULE)  # model = SNLIClassifier(config); torch.save(model, path)
                else:
                    kinds |= self.payloads(value, depth - 1)
            for key, value in self._subscript_stores.get(name, ()):
                kinds |= self._value_payload(value, key, depth - 1)
            return kinds or {Payload.TENSORS}
        return self._value_payload(obj, None, depth)

    def _value_payload(self, value: cst.BaseExpression, key: Optional[str], depth: int) -> set[Payload]:
        if isinstance(value, cst.Dict):
            return self.payloads(value, depth)
        if isinstance(value, (cst.List, cst.Tuple, cst.Set)) and value.elements:
            # ``torch.save([encoder, decoder], path)``: what each element puts in the file
            return set().union(*(self.payloads(e.value, depth) for e in value.elements))
        if isinstance(value, cst.Call):
            called = dotted_name(value.func) or ""
            method = called.rsplit(".", 1)[-1]
            qualified = self.ctx.qualified_name(value.func) or ""
            if method in ("state_dict", "item", "tolist", "detach", "cpu", "clone", "vars", "dict", "int", "float",
                          "str", "len"):
                return {Payload.TENSORS}
            if method == "numpy" or qualified.startswith("numpy."):
                return {Payload.NUMPY}
            if method in ("deepcopy", "half", "float", "to") and value.args:
                inner = value.args[0].value if method == "deepcopy" else value.func.value \
                    if isinstance(value.func, cst.Attribute) else value.args[0].value
                return self._value_payload(inner, key, depth)
            return {Payload.TENSORS}
        name = dotted_name(value)
        if name and depth and self._assignments.get(name) and all(
                isinstance(v, cst.Dict) for v in self._assignments[name]):
            return self.payloads(value, depth)  # ``converted = {}`` filled key by key: judged by what goes in
        if name and self._assignments.get(name):
            # what the name was assigned, before what it is called: ``config = {k: globals()[k] ...}`` and
            # ``model_args = dict(n_layer=...)`` hold plain values whatever their names say
            assigned = [self._assigned_payload(v, name) for v in self._assignments[name][:4]]
            if all(kinds is not None for kinds in assigned):
                return set().union(*assigned)
        if name:
            last = last_segment(name).lower()
            if names_configuration(last) or names_configuration(key):
                return {Payload.NAMESPACE}
            if any(word in last for word in _MODEL_WORDS) and not last.endswith(("_state", "state_dict", "_sd")):
                return {Payload.MODULE}
        return {Payload.TENSORS}

    def _assigned_payload(self, value: cst.BaseExpression, name: str) -> Optional[set[Payload]]:
        """What a value assigned to ``name`` puts in a checkpoint, when its expression shows it; None when only the
        name can tell (a parameter's default, an unknown call)."""
        if isinstance(value, (cst.Dict, cst.DictComp, cst.List, cst.ListComp, cst.Tuple, cst.Set, cst.SetComp,
                              cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.Integer, cst.Float,
                              cst.Comparison, cst.BinaryOperation, cst.UnaryOperation)):
            return {Payload.TENSORS}  # containers and plain values (their elements judged as plain too)
        if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
            return {Payload.TENSORS}
        if isinstance(value, cst.Call):
            qualified = self.ctx.qualified_name(value.func) or dotted_name(value.func) or ""
            method = qualified.rsplit(".", 1)[-1]
            if method in ("dict", "list", "tuple", "vars", "state_dict", "int", "float", "str", "len", "item"):
                return {Payload.TENSORS}
            if method == "parse_args" or qualified in _NAMESPACE_CONSTRUCTORS:
                return {Payload.NAMESPACE}
            if constructs_module(self.ctx, value, name):
                return {Payload.MODULE}
        return None

    def written_before_loaded(self, path: cst.BaseExpression, origin: Optional[cst.BaseExpression],
                              same_expression_only: bool = False) -> bool:
        """Does this program save to the path it loads from, before it loads it: the same expression, or the
        same file name in the same directory expression (``os.path.join(out_dir, "best.pt")`` both times), or a
        literal file name that a script beside this one writes (``generate_data.py`` saves ``traindata.pt``)?
        ``same_expression_only`` accepts only the first (a path from outside the program).

        A save that runs only after the load (a resume at the top of a script whose training loop saves
        there later) does not count: that file comes from an earlier run, from wherever the path points."""
        if self.names_a_file_training_wrote(path) or (origin is not None and self.names_a_file_training_wrote(origin)):
            return True
        if any(self.handed_to_a_saver(expr, path) for expr in (path, origin) if expr is not None):
            return True  # the very folder it reads was handed to the helper that wrote the file there
        candidates = [path] + ([origin] if origin is not None else [])
        for expr in candidates:
            text = _normalized(self.ctx, expr)
            literals: Optional[set[str]] = None  # the file names the path spells: read when a question needs them
            names = self._names(expr)
            spelled = self._spelled_out(expr, path)
            for write in self.writes:
                if write.path is not None and self._handed_by_caller(write, expr) and self._saved_first(write.call, path):
                    return True  # a saving helper that the function reading ``expr`` hands this very path
                if write.path is not None and not self._one_value(write.call, write.path, path, expr):
                    continue  # the same spelling in two functions, each handed its value by its own callers
                if write.path_text == text and self._saved_first(write.call, path):
                    return True
                if write.path is not None and spelled is not None and self._saved_first(write.call, path) \
                        and spelled == self._spelled_out(write.path, write.call):
                    return True
                if same_expression_only:
                    continue
                if literals is None:
                    literals = self.literals(expr)
                if write.path is not None and self._saved_first(write.call, path) and (
                        (literals & write.path_literals and names <= self._names(write.path))
                        or self._same_file_name_family(expr, write.path)):
                    return True
            if same_expression_only or names:
                continue
            if literals is None:
                literals = self.literals(expr)
            if literals and literals & self._written_beside():
                return True
            if literals and literals & self._save_parameter_literals:
                return True
        return False

    def _spelled_out(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 3) -> Optional[str]:
        """A path expression with each local name replaced by the value last assigned to it where ``at`` runs
        (``os.path.join(args.out, 'best', 'model.bin')`` for ``path`` after ``folder = os.path.join(args.out,
        'best')`` and ``path = os.path.join(folder, 'model.bin')``): two functions that each build the path
        from the same parts name the same file. None unless it spells a file name, or when a part is a folder or
        a name the function is handed (``def load(folder): torch.load(os.path.join(folder, 'x.pt'))``): its
        callers choose where it reads, and the file there may be anyone's."""
        text = self._spell(expr, at, depth)
        return text if text is not None and _FILE_LITERAL.search(text) else None

    def _spell(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> Optional[str]:
        if isinstance(expr, cst.Name):
            value = assignment_before(self.ctx, at, expr.value) if depth else None
            if value is not None and value is not expr:
                return self._spell(value, value, depth - 1)
            fn = _function_of(self._ancestry(at))
            if isinstance(fn, cst.FunctionDef) and parameter(fn, expr.value) is not None:
                return None
        if isinstance(expr, cst.Call) and not any(arg.star for arg in expr.args):
            parts = []
            for arg in expr.args:
                spelled = self._spell(arg.value, at, depth)
                if spelled is None:
                    return None
                parts.append((f"{arg.keyword.value}=" if arg.keyword is not None else "") + spelled)
            if isinstance(expr.func, cst.Attribute) and self._spell(expr.func.value, at, depth) is None:
                return None  # ``(folder / key).with_suffix('.pt')`` of a folder the function is handed
            return f"{_normalized(self.ctx, expr.func)}({','.join(parts)})"
        if isinstance(expr, cst.BinaryOperation):
            left, right = self._spell(expr.left, at, depth), self._spell(expr.right, at, depth)
            return None if left is None or right is None else f"{left}{_normalized(self.ctx, expr.operator)}{right}"
        return _normalized(self.ctx, expr)

    def handed_to_a_saver(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Does ``path`` name a file that a function of the repository wrote into a folder this function handed it
        before the load at ``at``? The path joins one folder name and a file name (``folder + '/best.pth'``,
        ``os.path.join(folder, 'best.pth')``), and a call before it in the same function (or in a loop around both)
        hands that folder to a function, a class or an object built from a class, that saves that file name into
        a folder it is handed (``FileSummary.folder_savers``): an early-stopping helper that keeps the best
        weights, reloaded once training ends."""
        if isinstance(path, cst.Name):
            value = assignment_before(self.ctx, at, path.value)
            if value is None:
                return False
            path = value
        folders = _value_names(path)
        files = self.literals(path, depth=0)
        if len(folders) != 1 or not files:
            return False
        [folder] = folders
        fn = _function_of(self._ancestry(at))
        if not isinstance(fn, cst.FunctionDef):
            return False
        from analyzers.program.modules import ModuleFacts  # modules needs this module

        facts = self.ctx.facts(ModuleFacts)
        for call in subtree(fn):
            if not isinstance(call, cst.Call) or not any(dotted_name(arg.value) == folder for arg in call.args):
                continue
            callee = dotted_name(call.func)
            if callee is None or callee.startswith("self."):
                continue
            built = assignment_before(self.ctx, call, callee) if "." not in callee else None
            if isinstance(built, cst.Call) and dotted_name(built.func) is not None:
                callee = dotted_name(built.func)  # an object built from a class: what the class's methods save
            saved = facts.marked_function(callee, lambda summary: summary.folder_savers)
            if saved and files & saved and self._saved_first(call, at):
                return True
        return False

    def saved_by_the_instance(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Does a method of the class whose method loads ``path`` save that same file, built from the same parts: a
        file name spelled in the code, and a folder from the instance's own settings (``self.args.checkpoints``) or
        spelled in the code, with the parameters both methods take (the run's ``setting``)? An experiment class
        whose ``test(setting)`` rereads what its ``train(setting)`` wrote (itself, or through a helper handed that
        folder: an early-stopping helper keeping the best weights) reads the program's own checkpoint. A path that
        is wholly a parameter (``def restore(self, path)``) has no such anchor: its callers choose the file."""
        load_fn = _function_of(self._ancestry(at))
        cls = self._method_class(load_fn)
        if cls is None:
            return False
        loaded = self._instance_parts(path, at, load_fn)
        if loaded is None or not loaded.files or not (loaded.attributes or loaded.folders):
            return False
        from analyzers.program.modules import ModuleFacts  # modules needs this module

        facts = self.ctx.facts(ModuleFacts)
        for method in cls.body.body:
            if not isinstance(method, cst.FunctionDef) or method is load_fn:
                continue
            for node in subtree(method):
                if not isinstance(node, cst.Call) or _function_of(self._ancestry(node)) is not method:
                    continue
                for saved in self._instance_saves(node, method, facts):
                    if loaded.files & saved.files and loaded.parameters <= saved.parameters and \
                            loaded.attributes <= saved.attributes and \
                            (not saved.folders or loaded.folders <= saved.folders):
                        return True
        return False

    def _instance_saves(self, call: cst.Call, method: cst.FunctionDef, facts) -> list["_PathParts"]:
        """The files a call in a method saves, by the parts of their paths: a ``torch.save`` there, or a folder
        handed to a function or class of the repository that saves file names into a folder it is handed."""
        write = next((w for w in self.writes if w.call is call), None)
        if write is not None:
            parts = self._instance_parts(write.path, call, method) if write.path is not None else None
            return [parts] if parts is not None and parts.files else []
        callee = dotted_name(call.func)
        if callee is None or callee.startswith("self."):
            return []
        built = assignment_before(self.ctx, call, callee) if "." not in callee else None
        if isinstance(built, cst.Call) and dotted_name(built.func) is not None:
            callee = dotted_name(built.func)  # an object built from a class: what the class's methods save
        saved_names: frozenset[str] = frozenset()
        found = []
        for arg in call.args:
            if not isinstance(arg.value, (cst.Name, cst.Attribute)):
                continue
            if not saved_names:
                saved_names = facts.marked_function(callee, lambda summary: summary.folder_savers) or frozenset()
                if not saved_names:
                    return []
            folder = self._instance_parts(arg.value, call, method)
            if folder is not None and (folder.attributes or folder.folders):
                found.append(_PathParts(folder.parameters, folder.attributes, folder.folders,
                                        frozenset(saved_names) | folder.files))
        return found

    def _method_class(self, fn: Optional[cst.CSTNode]) -> Optional[cst.ClassDef]:
        if not isinstance(fn, cst.FunctionDef):
            return None
        block = self._parents.get(id(fn))
        cls = self._parents.get(id(block)) if block is not None else None
        return cls if isinstance(cls, cst.ClassDef) else None

    def _instance_parts(self, expr: cst.BaseExpression, at: cst.CSTNode, fn: cst.FunctionDef,
                        depth: int = 4) -> Optional["_PathParts"]:
        """What a path in a method is built from: parameters of the method, attributes of ``self``, folder and file
        names spelled in the code; None when a part is anything else (a call that computes it, a global)."""
        params: set[str] = set()
        attributes: set[str] = set()
        folders: set[str] = set()
        files: set[str] = set()
        stack: list[tuple[cst.BaseExpression, cst.CSTNode, int]] = [(expr, at, depth)]
        while stack:
            node, where, left = stack.pop()
            if isinstance(node, (cst.SimpleString, cst.FormattedStringText)):
                text = string_value(node) if isinstance(node, cst.SimpleString) else node.value
                if text is None:
                    return None
                for segment in text.replace("\\", "/").split("/"):
                    if segment in ("", "."):
                        continue
                    (files if _FILE_NAME.fullmatch(segment) else folders).add(segment)
            elif isinstance(node, cst.FormattedString):
                stack.extend((part.expression if isinstance(part, cst.FormattedStringExpression) else part, where,
                              left) for part in node.parts)
            elif isinstance(node, cst.Name):
                if node.value == "self":
                    return None
                if parameter(fn, node.value) is not None:
                    params.add(node.value)
                    continue
                value = assignment_before(self.ctx, where, node.value) if left else None
                if value is None or _function_of(self._ancestry(value)) is not fn:
                    return None
                stack.append((value, value, left - 1))
            elif isinstance(node, cst.Attribute):
                name = dotted_name(node)
                if name is None or not name.startswith("self."):
                    return None
                attributes.add(name)
            elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Divide,
                                                                                           cst.Modulo)):
                stack.extend([(node.left, where, left), (node.right, where, left)])
            elif isinstance(node, cst.Call) and not any(arg.star or arg.keyword is not None for arg in node.args):
                qualified = self.ctx.qualified_name(node.func) or dotted_name(node.func) or ""
                if qualified == "str" or does(qualified, Does.BUILDS_PATH):
                    pass
                elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "format" and \
                        isinstance(node.func.value, cst.SimpleString):
                    stack.append((node.func.value, where, left))
                else:
                    return None
                stack.extend((arg.value, where, left) for arg in node.args)
            else:
                return None
        return _PathParts(frozenset(params), frozenset(attributes), frozenset(folders), frozenset(files))

    def writes_fixed_path(self, path: cst.BaseExpression) -> bool:
        """Is ``path`` one fixed file of this program's own: a constant string (no name, option or template slot
        in it) that a save of this program writes to, spelled the same, wherever that save runs? A notebook that
        restores ``'./model/net.pkl'`` when it is there and trains on, saving to ``'./model/net.pkl'`` as it goes,
        reads back what its own earlier run wrote: nothing but this program chooses that file. A resume whose
        path holds a name (``os.path.join(out_dir, 'ckpt.pt')``, ``args.resume``) is not one: the run's
        configuration picks where it reads."""
        constant = _constant_path(path)
        return constant is not None and any(
            write.path is not None and _constant_path(write.path) == constant for write in self.writes)

    def saved_objects(self, load: cst.Call) -> Optional[set[str]]:
        """What a ``torch.load`` of a file this program writes gives back: the names of the objects every save to
        that same path puts there (``torch.save(model, './net.pkl')`` then ``model = torch.load('./net.pkl')``
        gives {"model"}: the same model, of the same class). None when no save writes there, or one saves
        something other than a name."""
        path = argument(load, 0, "f")
        if path is None:
            return None
        text = _normalized(self.ctx, path)
        found: set[str] = set()
        for write in self.writes:
            if write.path is None or write.path_text != text:
                continue
            saved = argument(write.call, 0, "obj")
            name = dotted_name(saved) if isinstance(saved, (cst.Name, cst.Attribute)) else None
            if name is None:
                return None
            found.add(name)
        return found or None

    def names_a_file_training_wrote(self, path: cst.BaseExpression) -> bool:
        """``checkpoint.best_model_path`` after ``checkpoint = ModelCheckpoint(...)`` (or
        ``trainer.checkpoint_callback.best_model_path``): a file the library's training loop wrote for this
        program, which it reads back (the library table says which objects report such paths)."""
        if not isinstance(path, cst.Attribute) or path.attr.value not in WRITTEN_CHECKPOINT_ATTRIBUTES:
            return False
        holder: Optional[cst.BaseExpression] = path.value
        if isinstance(holder, cst.Attribute) and holder.attr.value in CHECKPOINT_CALLBACK_ATTRIBUTES:
            holder = holder.value
        # the walk may not have reached the path yet (a rule asks from the load call): ask from the nearest
        # ancestor it has
        use: Optional[cst.CSTNode] = path
        while use is not None and id(use) not in self.ctx.parents and use is not self.ctx.module:
            use = self._parents.get(id(use))
        for _ in range(3):
            if not isinstance(holder, (cst.Name, cst.Attribute)) or use is None:
                break
            holder = assignment_before(self.ctx, use, dotted_name(holder) or "")
        return isinstance(holder, cst.Call) and does(self.ctx.qualified_name(holder.func),
                                                     Does.REPORTS_WRITTEN_CHECKPOINTS)

    def _same_file_name_family(self, load: cst.BaseExpression, save: cst.BaseExpression) -> bool:
        """One file-name template, filled with different values, in the same place: ``'{}.pkl'.format(best_epoch)``
        reads one of the files ``'{}.pkl'.format(epoch)`` wrote (the best epoch's), and so does
        ``'net_20_%s.pt' % device`` of ``'net_%d_%s.pt' % (epoch, device)`` (a slot filled in the text). The values fill only the last
        path segment, and whatever builds the rest of the path (a directory variable) is the same on both sides;
        a template with a slot in its directory (``'%s/model.pt' % args.dir``) is not a family."""
        load_template, save_template = _file_name_template(load), _file_name_template(save)
        if load_template is None or save_template is None or not _fills_template(load_template[0], save_template[0]):
            return False
        return load_template[1] <= save_template[1] | self._names(save)


    @cached_property
    def _save_parameter_literals(self) -> set[str]:
        """File names this file passes to a parameter named for where its function saves (``def train(...,
        save_path)`` called as ``train(..., 'model_scratch.pt')``): that function writes there, even when its
        saving is an exercise's ``## TODO: save the model`` or goes through a helper. A function this file does not
        define is read from the keyword it is called with (``fit(model, best_model_save_path='best.pt')`` of an
        imported training helper): the keyword is that function's parameter."""
        found: set[str] = set()
        nodes = self.ctx.facts(ModuleNodes)
        for fn in nodes.of_type(cst.FunctionDef):
            for param in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]:
                if "save" in param.name.value.lower():
                    for value in call_site_values(self.ctx, fn, param.name.value) or ():
                        found |= self.literals(value)
        for call in nodes.of_type(cst.Call):
            for arg in call.args:
                if arg.keyword is not None and "save" in arg.keyword.value.lower():
                    found |= self.literals(arg.value)
        return found

    @cached_property
    def _parents(self) -> dict[int, cst.CSTNode]:
        """id(node) -> parent for the whole file (the engine's map only covers what it has walked so far)."""
        return self.ctx.facts(ModuleNodes).parents

    def _ancestry(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """``node`` and its ancestors, innermost first."""
        chain = [node]
        while (parent := self._parents.get(id(chain[-1]))) is not None:
            chain.append(parent)
        return chain

    def _one_value(self, save: cst.Call, saved: cst.BaseExpression, load: cst.CSTNode,
                   loaded: cst.BaseExpression) -> bool:
        """Can a path the save writes and one the load reads, built from the same names, hold the same value? Not
        when they sit in different functions and one of them is built from a parameter of its function: a
        parameter holds whatever that function's callers pass, so ``def save(self, path)`` and ``def load(cls,
        path)`` share a spelling, not a file (the load reads what its own callers name)."""
        save_fn, load_fn = _function_of(self._ancestry(save)), _function_of(self._ancestry(load))
        if save_fn is load_fn:
            return True
        if isinstance(load_fn, cst.FunctionDef) and self._from_parameter(load_fn, loaded, saved):
            return False
        return not (isinstance(save_fn, cst.FunctionDef) and self._from_parameter(save_fn, saved, loaded))

    def _handed_by_caller(self, write: CheckpointWrite, loaded: cst.BaseExpression) -> bool:
        """Does a saving helper write where the load reads because a caller, in the function that loads (or hands
        the path on), passes it the very path the load reads (``fit(net, target)`` then ``score(net, target)``)?"""
        save_fn = _function_of(self._ancestry(write.call))
        if not isinstance(save_fn, cst.FunctionDef) or not isinstance(write.path, cst.Name) or \
                parameter(save_fn, write.path.value) is None:
            return False
        load_fn = _function_of(self._ancestry(loaded))
        text = _normalized(self.ctx, loaded)
        return any(_normalized(self.ctx, value) == text and _function_of(self._ancestry(value)) is load_fn
                   for value in call_site_values(self.ctx, save_fn, write.path.value) or ())

    def _from_parameter(self, fn: cst.FunctionDef, expr: cst.BaseExpression, other: cst.BaseExpression) -> bool:
        """Is ``expr`` built from a parameter of ``fn`` whose callers may pass anything: not one that every call in
        the file fills with the value the instance keeps in the attribute ``other`` is (``self._restore(path)``
        beside ``self.path = path``, where the save writes ``self.path``)."""
        kept = dotted_name(other)
        return any("." not in name and parameter(fn, name) is not None and not (
            kept is not None and kept.startswith("self.") and self._always_the_kept_value(fn, name, kept))
            for name in _value_names(expr))

    def _always_the_kept_value(self, fn: cst.FunctionDef, name: str, kept: str) -> bool:
        """Does every call of ``fn`` in the file pass, for ``name``, a variable that its own function also stores
        in ``kept`` (``self.path = path`` ... ``self._restore(path)``)?"""
        values = call_site_values(self.ctx, fn, name)
        if not values:
            return False
        for value in values:
            caller = _function_of(self._ancestry(value))
            if not isinstance(value, cst.Name) or not isinstance(caller, cst.FunctionDef) or not any(
                    isinstance(node, cst.Assign) and len(node.targets) == 1
                    and dotted_name(node.targets[0].target) == kept and isinstance(node.value, cst.Name)
                    and node.value.value == value.value for node in subtree(caller)):
                return False
        return True

    def _saved_first(self, save: cst.Call, load: cst.CSTNode) -> bool:
        """Can this save have run before this load, in one run of the program?

        Yes when they are in different functions (the call order is not known here), in one loop (the next
        iteration loads what this one saved), or in alternative branches of one ``if`` / ``try`` (a cache:
        load it when it exists, else build and save it); otherwise when the save comes first in the code."""
        saves, loads = self._ancestry(save), self._ancestry(load)
        if _function_of(saves) is not _function_of(loads):
            return True
        save_ids = {id(node): index for index, node in enumerate(saves)}
        at = next(index for index, node in enumerate(loads) if id(node) in save_ids)
        common = loads[at]
        if at == 0 or save_ids[id(common)] == 0:
            return True  # one holds the other: the load's argument is the save call itself
        for node in loads[at:]:
            if isinstance(node, (cst.FunctionDef, cst.Lambda)):
                break
            if isinstance(node, (cst.For, cst.While)):
                return True
        if isinstance(common, (cst.If, cst.Try, cst.TryStar)):
            return True
        children = all_children(common)
        return _index_of(children, saves[save_ids[id(common)] - 1]) < _index_of(children, loads[at - 1])

    def _written_beside(self) -> set[str]:
        index = self.ctx.repository
        if index is None:
            return set()
        from analyzers.program.modules import file_in_repository

        return index.saved_beside(file_in_repository(self.ctx))

    def _names(self, expr: cst.BaseExpression) -> set[str]:
        """The variables a path is built from (one assignment deep), not the functions that join it."""
        names = _value_names(expr)
        for name in list(names):
            for value in self._assignments.get(name, ())[:2]:
                names |= _value_names(value)
        return names

    def refused_nearby(self) -> dict[str, set[Payload]]:
        """The other files of the repository whose checkpoints this file may load (the scripts beside it, the
        modules it imports) and what they save there that ``weights_only=True`` refuses; {} without an index."""
        index = self.ctx.repository
        if index is None:
            return {}
        from analyzers.program.modules import file_in_repository

        return index.refused_payloads_near(file_in_repository(self.ctx))

    def saved_elsewhere(self, path: cst.BaseExpression, at: cst.CSTNode) -> dict[str, Optional[frozenset[Payload]]]:
        """The other files of the repository that save the checkpoint a load of ``path`` (at ``at``) reads, with what
        they put there (None: their code does not show it): a ``torch.save`` in the scripts around this file or the
        modules it imports (``RepositoryIndex.checkpoint_saves_near``) whose path is built from the same parts. The
        load's file names spelled in the code are among the save's, and the option or configuration keys its path
        is built from among the save's (``os.path.join(args.save_dir, 'best.pth')`` in ``eval.py`` and in
        ``train.py``); a path with no file name matches a save built from exactly the same keys
        (``cfg['ckpt_path']`` both times). {} when none matches, or the load's path is a parameter no call in the
        file fills: its callers choose the file."""
        index = self.ctx.repository
        if index is None:
            return {}
        shape = self._load_shape(path, at)
        if shape is None or not (shape[0] or shape[1]):
            return {}
        files, keys = shape

        def matches(save) -> bool:
            return _save_matches(files, keys, save)

        own, near = self._saves_near
        # this file writes that file too (a resume of its own checkpoint): the other modules' saves add to what its
        # own say only when both hold tensors and plain values; its own pickled objects, or saves that disagree, are
        # judged as before (by this file's saves)
        mine = [save.kinds for save in own if matches(save)]
        if any(kinds is None or not all(kind.loads_weights_only for kind in kinds) for kinds in mine):
            return {}
        found: dict[str, Optional[frozenset[Payload]]] = {}
        for other, saves in near.items():
            for save in saves:
                if not matches(save):
                    continue
                if other in found and (found[other] is None or save.kinds is None):
                    found[other] = None
                elif save.kinds is not None:
                    found[other] = found.get(other, frozenset()) | save.kinds
                else:
                    found[other] = None
        if mine and any(kinds is None or not all(kind.loads_weights_only for kind in kinds)
                        for kinds in found.values()):
            return {}
        return found

    def saved_here_holding_weights(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Does this file itself save the checkpoint a load of ``path`` (at ``at``) reads, matched as
        :meth:`saved_elsewhere` matches another file's saves, and does every such save show tensors and plain values
        only: a resume of the program's own checkpoint, which ``weights_only=True`` loads."""
        from analyzers.program.modules import ModuleFacts  # modules needs this module

        shape = self._load_shape(path, at)
        if shape is None or not (shape[0] or shape[1]):
            return False
        files, keys = shape
        mine = [save.kinds for save in self.ctx.facts(ModuleFacts).checkpoint_saves() if _save_matches(files, keys, save)]
        return bool(mine) and all(kinds is not None and kinds and all(kind.loads_weights_only for kind in kinds)
                                  for kinds in mine)

    @cached_property
    def _saves_near(self) -> tuple[list, dict]:
        """This file's own saves (its summary's) and ``RepositoryIndex.checkpoint_saves_near``, asked once for all its
        loads."""
        from analyzers.program.modules import ModuleFacts, file_in_repository  # modules needs this module

        return self.ctx.facts(ModuleFacts).checkpoint_saves(), \
            self.ctx.repository.checkpoint_saves_near(file_in_repository(self.ctx))

    def _load_shape(self, path: cst.BaseExpression, at: cst.CSTNode):
        """:func:`analyzers.program.saves.path_shape` of a path in this file (its names read here, with libcst)."""
        from analyzers.program.saves import path_shape

        def as_ast(expr: cst.BaseExpression) -> Optional[ast.AST]:
            try:
                return ast.parse("(" + self.ctx.module.code_for_node(expr) + ")", mode="eval").body
            except (SyntaxError, ValueError, RecursionError):
                return None

        def resolver(where: cst.CSTNode):
            fn = _function_of(self._ancestry(where))

            def resolve(name: str):
                if isinstance(fn, cst.FunctionDef) and parameter(fn, name) is not None:
                    values = call_site_values(self.ctx, fn, name)
                    if not values:
                        return None  # the callers of the function choose it
                else:
                    value = assignment_before(self.ctx, where, name)
                    values = [value] if value is not None else self._assignments.get(name, [])[:2]
                return [(tree, resolver(value)) for value in values[:4] if (tree := as_ast(value)) is not None]
            return resolve

        tree = as_ast(path)
        return path_shape(tree, resolver(at)) if tree is not None else None

    def payload_kinds(self) -> set[Payload]:
        kinds: set[Payload] = set()
        for write in self.writes:
            kinds |= write.payloads
        return kinds


@dataclass(frozen=True)
class _PathParts:
    """What a path in a method is built from (see ``CheckpointWrites.saved_by_the_instance``)."""
    parameters: frozenset[str]
    attributes: frozenset[str]
    folders: frozenset[str]
    files: frozenset[str]


_FILE_NAME = re.compile(r"[^/]*\.[A-Za-z]\w*")  # 'checkpoint.pth'


def _save_matches(files: frozenset[str], keys: frozenset[str], save) -> bool:
    """A load whose path spells ``files`` and is built from ``keys`` reads what ``save`` writes: a file name in
    common and the load's keys among the save's, or, with no file name, exactly the same keys."""
    return bool(files & save.files and keys <= save.keys) if files else not save.files and keys == save.keys


def _value_names(expr: cst.BaseExpression) -> set[str]:
    """Dotted names whose values an expression is built from: ``os.path.join(a.b, c)`` → {"a.b", "c"}."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            stack.extend(arg.value for arg in node.args)
        elif isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node):
            found.add(dotted_name(node))
        else:
            stack.extend(all_children(node))
    return found


def _file_name_template(expr: cst.BaseExpression) -> Optional[tuple[str, set[str]]]:
    """``'ckpt/{}.pkl'.format(epoch)`` → ("ckpt/{}.pkl", names outside the slots): a path whose only string is a
    template with slots in its last segment (``str.format``, ``%``, an f-string), the values of the slots left out;
    the names of the rest of the path (``os.path.join(out_dir, f'{epoch}.pt')``) kept. None for anything else."""
    templates: list[str] = []
    outside: set[str] = set()
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format" \
                and isinstance(node.func.value, cst.SimpleString):
            templates.append(string_value(node.func.value) or "")
        elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo) and \
                isinstance(node.left, cst.SimpleString):
            templates.append(string_value(node.left) or "")
        elif isinstance(node, cst.FormattedString):
            templates.append("".join(part.value if isinstance(part, cst.FormattedStringText) else "{}"
                                     for part in node.parts))
        elif isinstance(node, cst.SimpleString):
            return None  # a second string (a folder name) beside the template: judged the usual way
        elif isinstance(node, cst.Call):
            stack.extend(arg.value for arg in node.args)
        elif isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node):
            outside.add(dotted_name(node) or "")
        else:
            stack.extend(all_children(node))
    if len(templates) != 1:
        return None
    folder, _, name = templates[0].rpartition("/")
    slots = ("{", "%")
    if not any(slot in name for slot in slots) or any(slot in folder for slot in slots) or "." not in name:
        return None
    return templates[0], outside


_FILE_LITERAL = re.compile(r"""['"][^'"]*\.\w+['"]""")  # a string that spells a file name: 'model.bin'
_SLOT = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdifgeExr]|\{[^{}]*\}")  # %d, %s, {}, {epoch}


def _fills_template(load: str, save: str) -> bool:
    """Does the file-name template ``load`` name one of the files ``save`` names: the same text, each slot of
    ``save`` filled by any text (``net_20_%s.pt`` of ``net_%d_%s.pt``)? A template without slots is not one."""
    if load == save:
        return True
    pieces = _SLOT.split(save)
    if len(pieces) < 2:
        return False
    pattern = ".+".join(re.escape(piece) for piece in pieces)
    return re.fullmatch(pattern, load) is not None


def _function_of(chain: list[cst.CSTNode]) -> Optional[cst.CSTNode]:
    return next((node for node in chain if isinstance(node, (cst.FunctionDef, cst.Lambda))), None)


def _index_of(nodes: list[cst.CSTNode], node: cst.CSTNode) -> int:
    return next(index for index, child in enumerate(nodes) if child is node)


def _constant_path(expr: cst.BaseExpression) -> Optional[str]:
    """The file a path expression names when it is spelled whole in the code (``'./model/net.pkl'``,
    ``os.path.join('model', 'net.pkl')``), normalized; None when any part of it is computed."""
    if isinstance(expr, cst.Call) and dotted_name(expr.func) in ("os.path.join", "path.join"):
        if not expr.args or any(arg.star or arg.keyword is not None for arg in expr.args):
            return None
        values = [_constant_text(arg.value) for arg in expr.args]
    else:
        values = [_constant_text(expr)]
    if not all(values):
        return None
    return os.path.normpath(os.path.join(*values))


def _constant_text(expr: cst.BaseExpression) -> Optional[str]:
    """The text of a string spelled whole: a plain literal, or an f-string with no placeholder in it
    (``f"./net.pth"`` names the same file as ``"net.pth"``)."""
    if isinstance(expr, cst.FormattedString):
        text = "".join(part.value for part in expr.parts if isinstance(part, cst.FormattedStringText))
        whole = all(isinstance(part, cst.FormattedStringText) for part in expr.parts) and "{" not in text
        return text if whole else None
    return string_value(expr)


def _normalized(ctx: "FileContext", expr: cst.CSTNode) -> str:
    return "".join(ctx.module.code_for_node(expr).split())


def describe(kinds: Iterable[Payload]) -> str:
    return ", ".join(sorted(k.value for k in kinds))


# Folders whose modules are tests or test support (``tests/``, pytorch's ``test/``, ``torch/testing/``).
_TEST_FOLDERS = {"tests", "test", "testing"}


class _TestModule:
    """Whether a file is test code: it says so by its name or folder, or by what it holds (a pytest import,
    ``unittest.TestCase`` classes). A ``def test_x()`` alone does not count: pytest collects it only from files
    named as tests, and scripts keep quick self-checks next to real code.

    ``collects_tests`` is the narrower fact read from what the file does, not where it is: it holds tests that
    pytest or unittest would collect (test functions or classes in a file named as tests or importing the
    framework, ``TestCase`` subclasses, pytest fixtures). A ``test_eval.py`` evaluation script holds none."""

    _FRAMEWORKS = ("pytest", "unittest")
    _CASES = {"unittest.TestCase", "unittest.case.TestCase", "unittest.IsolatedAsyncioTestCase"}

    def __init__(self, ctx: "FileContext") -> None:
        parts = ctx.path.replace("\\", "/").split("/")
        base = parts[-1]
        self.named_as_tests = base.startswith("test_") or base.endswith("_test.py")
        named = base == "conftest.py" or self.named_as_tests or bool(_TEST_FOLDERS & set(parts[:-1]))
        self.collects_tests = self._collects(ctx)
        self.is_test = named or ctx.imports.imports_root("pytest") or self.collects_tests

    def _collects(self, ctx: "FileContext") -> bool:
        framework = any(ctx.imports.imports_root(root) for root in self._FRAMEWORKS)
        collected = framework or self.named_as_tests
        for statement in ctx.module.body:
            if isinstance(statement, cst.FunctionDef):
                if statement.name.value.startswith("test") and collected:
                    return True
                if framework and any(_is_pytest_fixture(ctx, d.decorator) for d in statement.decorators):
                    return True
            if isinstance(statement, cst.ClassDef):
                if {ctx.qualified_name(arg.value) for arg in statement.bases} & self._CASES:
                    return True
                if statement.name.value.startswith("Test") and collected and any(
                        isinstance(s, cst.FunctionDef) and s.name.value.startswith("test")
                        for s in statement.body.body):
                    return True
        return False


def _is_pytest_fixture(ctx: "FileContext", decorator: cst.BaseExpression) -> bool:
    target = decorator.func if isinstance(decorator, cst.Call) else decorator
    return ctx.qualified_name(target) == "pytest.fixture"


def collects_tests(ctx: "FileContext") -> bool:
    """The file holds tests a test runner would collect (what it does, not where it is)."""
    return ctx.facts(_TestModule).collects_tests


def is_test_code(ctx: "FileContext") -> bool:
    """The file is a test (or test support): findings about training hygiene do not apply to it."""
    return ctx.facts(_TestModule).is_test


def runs_in_interactive_kernel(ctx: "FileContext") -> bool:
    """The file is a notebook: its cells run in one interactive kernel process, which no launcher (``torchrun``,
    ``mp.spawn`` of functions the kernel defined) turns into one process per GPU. Advice that needs the code to run
    as several processes of a script does not apply to it."""
    return ctx.path.endswith(".ipynb")


class LightningClasses:
    """The classes of a file that derive from ``LightningModule`` (directly or through another such class of the
    file): the Trainer runs their steps. Known once per file (``ctx.facts(LightningClasses).names``)."""

    def __init__(self, ctx: "FileContext") -> None:
        self.names: set[str] = set()
        for statement in ctx.module.body:
            if isinstance(statement, cst.ClassDef):
                for base in statement.bases:
                    name = ctx.qualified_name(base.value) or dotted_name(base.value) or ""
                    if last_segment(name) == "LightningModule" or name in self.names:
                        self.names.add(statement.name.value)
                        break


def in_lightning_module(ctx: "FileContext") -> bool:
    """The code being walked sits in a class deriving from ``LightningModule``: the Trainer runs its steps."""
    if not ctx.classes:
        return False
    lightning = ctx.facts(LightningClasses).names
    for cls in ctx.classes:
        if cls.name.value in lightning:
            return True
        if any(last_segment(base) == "LightningModule" for base in ctx.class_bases(cls)):
            return True
    return False


def direct_method_class(node: cst.FunctionDef, ctx: FileContext) -> Optional[cst.ClassDef]:
    """The class whose body defines ``node`` directly, or None (functions, nested defs)."""
    cls = ctx.class_def
    if cls is None:
        return None
    block = ctx.parent(node)
    return cls if block is not None and ctx.parent(block) is cls else None


# What a model checkpoint's path or variable is called.
CHECKPOINT_WORDS = ("ckpt", "checkpoint", "resume", "model", "weight", "state", "snapshot", "pretrained", ".pth",
                    "best", "last")


def loads_model_checkpoint(node: cst.Call, ctx: FileContext) -> bool:
    """A ``torch.load`` call that reads a model checkpoint (tensors saved from a GPU), not a cached vocabulary or a
    CPU feature file: what its path or target is called, or a ``load_state_dict`` of a module or optimizer it feeds."""
    from analyzers.program.values import is_scheduler  # values needs modules, which needs this module

    parent = ctx.parent(node)
    if isinstance(parent, cst.Arg):
        call = ctx.parent(parent)
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
                call.func.attr.value == "load_state_dict":
            # a scheduler's state is plain numbers: nothing in it has a device
            return not is_scheduler(call.func.value, ctx)
    texts = [ctx.module.code_for_node(node.args[0].value) if node.args else ""]
    if isinstance(parent, cst.Assign):
        texts.append(ctx.module.code_for_node(parent.targets[0].target))
    text = " ".join(texts).lower()
    return any(word in text for word in CHECKPOINT_WORDS)


class ImportBindings:
    """Every import statement of the file, at any depth (the compatibility imports that matter here sit in
    ``try`` blocks inside functions), by the local name it binds; built once per file, on first use."""

    def __init__(self, ctx: FileContext) -> None:
        self.statements: dict[str, list[cst.CSTNode]] = {}
        self.from_pairs: set[tuple[str, str]] = set()  # (qualified, local) of every ``from M import N [as local]``
        for node in subtree(ctx.module):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    local = alias.asname.name.value if alias.asname is not None and \
                        isinstance(alias.asname.name, cst.Name) else (dotted_name(alias.name) or "").split(".")[0]
                    self.statements.setdefault(local, []).append(node)
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar) \
                    and node.module is not None and not node.relative:
                module = dotted_name(node.module)
                for alias in node.names:
                    name = dotted_name(alias.name)
                    local = alias.asname.name.value if alias.asname is not None and \
                        isinstance(alias.asname.name, cst.Name) else name
                    self.from_pairs.add((f"{module}.{name}", local))
                    self.statements.setdefault(local, []).append(node)

    def imported_before(self, local: str, node: cst.CSTNode, ctx: FileContext) -> bool:
        """Some import binding ``local`` starts on a line before ``node``'s."""
        statements = self.statements.get(local, [])
        if not statements:
            return False
        where = ctx.positions([node, *statements])
        return any(where[s].start.line < where[node].start.line for s in statements)


def handles_other_versions(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Inside ``try:`` with an ImportError handler, under an ``if`` on a version, or a compatibility fallback
    (:func:`in_compat_fallback`): the author handles the library versions on both sides of a change."""
    previous: cst.CSTNode = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.Try) and previous is ancestor.body and ancestor.handlers:
            for handler in ancestor.handlers:
                if handler.type is None:
                    return True
                text = ctx.module.code_for_node(handler.type)
                if any(word in text for word in ("ImportError", "ModuleNotFoundError", "Exception")):
                    return True
        if isinstance(ancestor, cst.If) and "version" in ctx.module.code_for_node(ancestor.test).lower():
            return True
        previous = ancestor
    return in_compat_fallback(ctx, node)


def main_block(ctx: "FileContext", node: cst.CSTNode) -> Optional[cst.If]:
    """The module-level ``if __name__ == "__main__":`` block ``node`` runs in (the script's entry point), if any."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(ancestor, cst.If) and isinstance(ctx.parent(ancestor), cst.Module) and \
                isinstance(ancestor.test, cst.Comparison) and dotted_name(ancestor.test.left) == "__name__":
            return ancestor
    return None


def unrestricted_load_beside(ctx: "FileContext", load: cst.Call) -> bool:
    """Another ``torch.load`` in the same function reads the same source with an explicit ``weights_only=False``
    (``if torch.__version__ < "2.6": torch.load(f) else: torch.load(f, weights_only=False)``): the author decided
    the payload needs full unpickling on every torch, so the implicit load is that same decision, said there."""
    source = argument(load, 0, "f")
    if source is None:
        return False
    text = ctx.module.code_for_node(source)
    scope = next((a for a in ctx.ancestors(load) if isinstance(a, cst.FunctionDef)), ctx.module)
    for node in subtree(scope):
        if node is load or not isinstance(node, cst.Call) or not does(ctx.call_name(node), Does.READS_TORCH_CHECKPOINT):
            continue
        other = argument(node, 0, "f")
        flag = next((arg.value for arg in node.args if arg.keyword is not None and arg.keyword.value == "weights_only"),
                    None)
        if other is not None and ctx.module.code_for_node(other) == text and isinstance(flag, cst.Name) and \
                flag.value == "False":
            return True
    return False
