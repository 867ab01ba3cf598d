"""Where the repository itself builds a model, and with what: its construction sites, evaluated statically.

A class the runner cannot build from its signature alone (``Tagger(alphabet, breadth)``) is usually built
somewhere: a training script (``Tagger(args.alphabet, args.breadth)`` after ``parser.add_argument("--breadth",
default=48)``), a factory (``build_model(cfg)`` called with ``cfg = yaml.safe_load(open("configs/base.yaml"))``),
a Hydra entry point (``@hydra.main(config_path="conf", config_name="train")``), a test or a ``__main__``
block. This module finds those calls in the code tree and evaluates their arguments without running the
repository: literals, names assigned before the call (in the function, the module or a module it imports
from), argparse defaults, YAML / JSON files opened by a path it can evaluate, a factory's parameters through the
callers of the factory, a method's parameters through their defaults, a class or function of torch named by an
import (``BatchNorm=nn.BatchNorm2d``: a ``LibraryRef`` the builder imports). What it cannot evaluate is left out
(the builder guesses it). The model's call sites give its input the same way: ``model(torch.randn(8, 3, 32, 32))``.

Runs inside the sandboxed child, on the standard library only (the sandbox binds gpu_runner, not analyzers).
"""
from __future__ import annotations

import ast
import json
import math
import operator
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from gpu_runner.targets import _dotted

MAX_FILES = 3000  # Python files looked at per code tree (only those whose text names what is looked for are parsed)
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 24  # nested evaluations (a name, its assignment, a factory's caller...)
MAX_SITES = 6
MAX_MARKDOWN_FILES = 200
_PYTHON_BLOCK = re.compile(r"^```(?:python|py|python3)[ \t]*\n(.*?)^```", re.M | re.S)
MAX_EVALUATIONS = 5000  # expressions evaluated per call site: factories called from many places stay cheap
_SKIPPED_FOLDERS = {".git", "node_modules", "site-packages", "dist-packages", "__pycache__", ".venv", "venv", "env",
                    "build", "dist", ".tox", ".eggs"}


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class AttrDict(dict):
    """A configuration read from YAML/JSON or an argparse namespace: ``cfg.model.dim`` and ``cfg["model"]``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


@dataclass(frozen=True)
class TensorShape:
    """A tensor the repository makes where it calls the model (``torch.randn(8, 3, 32, 32)``), batch included."""

    shape: tuple
    dtype: str = "float"
    high: int = 2


@dataclass
class Construction:
    """One call of the class: the arguments that could be evaluated (UNKNOWN where not), and how."""

    where: str  # "train.py:42"
    positional: list = field(default_factory=list)
    keywords: dict = field(default_factory=dict)
    origins: list[str] = field(default_factory=list)  # "argparse defaults of train.py", "configs/base.yaml"
    inputs: list[tuple[list, dict]] = field(default_factory=list)  # the model's call sites: (args, kwargs)

    @property
    def known(self) -> int:
        return sum(v is not UNKNOWN for v in [*self.positional, *self.keywords.values()])


@dataclass(frozen=True)
class _OpenFile:
    path: Path


@dataclass(frozen=True)
class _ModuleRef:
    path: Path


@dataclass(frozen=True)
class ClassRef:
    """A class defined at module level in the tree (``block=Bottleneck``): the builder imports it."""

    path: str  # relative to the code root
    name: str


@dataclass(frozen=True)
class LibraryRef:
    """A class or function of a library the runner's environment has, named where the repository passes it
    (``BatchNorm=nn.BatchNorm2d``, ``act=F.gelu``): the builder imports it. Only the libraries of
    ``IMPORTABLE_LIBRARIES``: importing them runs no repository code."""

    dotted: str  # "torch.nn.BatchNorm2d"


IMPORTABLE_LIBRARIES = ("torch", "einops")


@dataclass(frozen=True)
class Typed:
    """A number computed at run time whose type the code says: ``max_action = float(env.action_space.high[0])``."""

    kind: str  # "int" | "float" | "count" (``len(vocab)``: a positive int)


@dataclass
class Instance:
    """An object the repository builds from one of its own classes (``DDPM(eps_model=NaiveUnet(3, 3))``, ``bert =
    BERT(len(vocab), hidden=256)``): the builder constructs it with these arguments (UNKNOWN where not evaluated)."""

    cls: ClassRef
    positional: list = field(default_factory=list)
    keywords: dict = field(default_factory=dict)


def _to_attr(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, AttrDict):
        return AttrDict({k: _to_attr(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_to_attr(v) for v in value]
    return value


_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


def _resolve_interpolations(root: Any, value: Any = None, depth: int = 0) -> Any:
    """OmegaConf's ``${model.dim}`` references, when they name a value of the same file."""
    value = root if value is None else value
    if isinstance(value, dict):
        for key, item in list(value.items()):
            value[key] = _resolve_interpolations(root, item, depth)
    elif isinstance(value, list):
        return [_resolve_interpolations(root, item, depth) for item in value]
    elif isinstance(value, str) and depth < 5:
        match = _INTERPOLATION.match(value)
        if match:
            found: Any = root
            for part in match.group(1).split("."):
                found = found.get(part, UNKNOWN) if isinstance(found, dict) else UNKNOWN
            return value if found is UNKNOWN else _resolve_interpolations(root, found, depth + 1)
    return value


MAX_CONFIGURATIONS_COMPARED = 50
MAX_COMPREHENSION_ITEMS = 64
_STRING_METHODS = frozenset({"split", "strip", "lower", "upper", "replace", "rsplit", "lstrip", "rstrip"})


def _configuration_size(path: Path) -> float:
    """How large a configuration file's numbers are, as the log of their product: the sum of log2 of every
    positive integer in it (a list's items included). An image side of 256 against 32, six resolution levels
    against four, weigh more than a batch size of 64 against 128; a file that does not parse is the largest."""
    data = _load_data_file(path)
    if data is UNKNOWN:
        return float("inf")
    return _numbers_size(data)


def _numbers_size(data: Any) -> float:
    total, stack = 0.0, [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total += math.log2(value)
    return total


def _load_data_file(path: Path) -> Any:
    if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
        return UNKNOWN
    text = path.read_text(errors="replace")
    try:
        if path.suffix == ".json":
            return _to_attr(json.loads(text))
        if path.suffix == ".toml":
            import tomllib

            return _to_attr(tomllib.loads(text))
        import yaml

        return _to_attr(_resolve_interpolations(yaml.safe_load(text)))
    except Exception:  # noqa: BLE001 - a file that does not parse is not a value
        return UNKNOWN


class _File:
    def __init__(self, relative: str, source: str):
        self.relative = relative
        self.tree = ast.parse(source)
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        self.imports: dict[str, str] = {}  # local name -> dotted origin ("yaml.safe_load", ".net.Net")
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = "." * node.level + (node.module or "") + \
                        ("." if node.module else "") + alias.name
        self._argparse: Optional[AttrDict] = None
        self.synthetic: list[ast.Call] = []  # calls made of other calls' arguments (a partial and its call)

    def enclosing_function(self, node: ast.AST) -> Optional[ast.FunctionDef]:
        current = self.parents.get(id(node))
        while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
            current = self.parents.get(id(current))
        return current

    def enclosing_class(self, node: ast.AST) -> Optional[ast.ClassDef]:
        current = self.parents.get(id(node))
        while current is not None and not isinstance(current, ast.ClassDef):
            current = self.parents.get(id(current))
        return current

    def qualified(self, node: ast.AST) -> Optional[str]:
        """``yaml.safe_load`` for ``yaml.safe_load`` / ``from yaml import safe_load``; local names as they are."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        origin = self.imports.get(head)
        if origin is None:
            return dotted
        return origin + ("." + rest if rest else "")


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}
_PURE_BUILTINS = {"int": int, "float": float, "str": str, "bool": bool, "tuple": tuple, "list": list, "len": len,
                  "min": min, "max": max, "abs": abs, "round": round, "sum": sum, "sorted": sorted, "dict": dict}
# Calls that wrap a mapping as an object with attributes (``SimpleNamespace(**cfg)``, ``EasyDict(cfg)``).
_NAMESPACE_MAKERS = {"types.SimpleNamespace", "argparse.Namespace", "easydict.EasyDict", "edict",
                     "omegaconf.OmegaConf.create", "addict.Dict", "munch.Munch", "munch.munchify",
                     "ml_collections.ConfigDict", "dotmap.DotMap"}
_DATA_LOADERS = {"yaml.safe_load", "yaml.load", "yaml.full_load", "yaml.unsafe_load", "json.load",
                 "omegaconf.OmegaConf.load", "tomllib.load", "toml.load"}
_TENSOR_MAKERS = {"torch.randn": "float", "torch.rand": "float", "torch.zeros": "float", "torch.ones": "float",
                  "torch.empty": "float", "torch.randint": "long", "torch.full": "float"}
_DTYPE_NAMES = {"long": "long", "int64": "long", "int": "long", "int32": "long", "bool": "bool"}


class Repository:
    """The Python files of one code tree, parsed on demand."""

    def __init__(self, code_root: Path):
        self.root = Path(code_root).resolve()
        self._paths: Optional[list[Path]] = None
        self._texts: dict[Path, Optional[str]] = {}
        self._files: dict[Path, Optional[_File]] = {}
        self._namespaces: Optional[list[tuple[str, dict]]] = None
        self._doc_examples: dict[Path, list[_File]] = {}
        self._markdown: Optional[list[Path]] = None
        self._code_blocks: dict[Path, Optional[_File]] = {}
        self._indirect: dict[tuple[Path, str], list] = {}
        self._data: Optional[list[Path]] = None

    def python_files(self) -> list[Path]:
        if self._paths is None:
            found: list[Path] = []
            for folder, folders, files in os.walk(self.root):
                folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
                found += [Path(folder) / name for name in sorted(files) if name.endswith(".py")]
                if len(found) >= MAX_FILES:
                    break
            self._paths = found[:MAX_FILES]
        return self._paths

    def text(self, path: Path) -> Optional[str]:
        if path not in self._texts:
            try:
                self._texts[path] = None if path.stat().st_size > MAX_FILE_BYTES else path.read_text(errors="replace")
            except OSError:
                self._texts[path] = None
        return self._texts[path]

    def file(self, path: Path) -> Optional[_File]:
        if path not in self._files:
            text = self.text(path)
            try:
                self._files[path] = None if text is None else _File(path.relative_to(self.root).as_posix(), text)
            except (SyntaxError, ValueError, RecursionError):
                self._files[path] = None
        return self._files[path]

    def module_path(self, importer: Path, dotted: str) -> Optional[Path]:
        """The file of module ``dotted`` (``.config``, ``utils.config``) as ``importer`` imports it."""
        level = len(dotted) - len(dotted.lstrip("."))
        parts = [p for p in dotted.lstrip(".").split(".") if p]
        if level > len(importer.parents):
            return None
        bases = [importer.parents[level - 1]] if level else [self.root, self.root / "src", importer.parent]
        for base in bases:
            candidate = base.joinpath(*parts)
            for path in (candidate.with_suffix(".py"), candidate / "__init__.py"):
                if path.is_file() and path.resolve().is_relative_to(self.root):
                    return path.resolve()
        return None

    def calls_of(self, defining: Path, name: str) -> Iterator[tuple[Path, _File, ast.Call]]:
        """Calls of ``name`` (a module-level class or function of ``defining``) anywhere in the tree: by its name
        in its own file or where imported, or as ``module.name(...)`` of a module of the tree."""
        for path, parsed in self._files_naming(name):
            local_names = {name} if path.resolve() == defining else {
                local for local, origin in parsed.imports.items() if origin.rsplit(".", 1)[-1] == name
                and self._provides(self.module_path(path, origin.rsplit(".", 1)[0] or "."), defining)}
            for node in ast.walk(parsed.tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if isinstance(func, ast.Name) and func.id in local_names:
                    yield path, parsed, node
                elif isinstance(func, ast.Attribute) and func.attr == name:
                    module = parsed.qualified(func.value)
                    if module is not None and self._provides(self.module_path(path, module), defining):
                        yield path, parsed, node
        defining_file = self.file(defining)
        for example in (self._examples(defining, defining_file) if defining_file is not None else []):
            for node in ast.walk(example.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    yield defining, example, node

    def _files_naming(self, name: str) -> Iterator[tuple[Path, _File]]:
        """The parsed Python files whose text names ``name``, then the Python code blocks of the tree's Markdown
        files (a README's usage, each file's blocks as one program: they share names as its readers run them)."""
        for path in self.python_files():
            text = self.text(path)
            if text is None or name not in text:
                continue
            parsed = self.file(path)
            if parsed is not None:
                yield path, parsed
        for path in self.markdown_files():
            text = self.text(path)
            if text is None or name not in text:
                continue
            if path not in self._code_blocks:
                blocks = "\n".join(m.group(1) for m in _PYTHON_BLOCK.finditer(text))
                try:
                    self._code_blocks[path] = _File(f"{path.relative_to(self.root).as_posix()} (code blocks)", blocks) \
                        if blocks else None
                except (SyntaxError, ValueError, RecursionError):
                    self._code_blocks[path] = None
            if self._code_blocks[path] is not None:
                yield path, self._code_blocks[path]

    def data_files(self) -> list[Path]:
        """The tree's YAML and JSON files (configs), at most MAX_DATA_FILES."""
        if self._data is None:
            found: list[Path] = []
            for folder, folders, files in os.walk(self.root):
                folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
                found += [Path(folder) / n for n in sorted(files) if n.endswith((".yaml", ".yml", ".json"))]
                if len(found) >= MAX_DATA_FILES:
                    break
            self._data = found[:MAX_DATA_FILES]
        return self._data

    def markdown_files(self) -> list[Path]:
        if self._markdown is None:
            found: list[Path] = []
            for folder, folders, files in os.walk(self.root):
                folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
                found += [Path(folder) / n for n in sorted(files) if n.lower().endswith((".md", ".markdown"))]
                if len(found) >= MAX_MARKDOWN_FILES:
                    break
            self._markdown = found[:MAX_MARKDOWN_FILES]
        return self._markdown

    def _examples(self, path: Path, parsed: _File) -> list[_File]:
        """The doctest examples in the docstrings of ``path`` (``>>> m = Net(d_in=4)`` then ``>>> m(x)``), each
        docstring's as one file that sees the module's imports and names, as doctest runs them."""
        if path not in self._doc_examples:
            import doctest

            found = []
            for node in ast.walk(parsed.tree):
                if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                docstring = ast.get_docstring(node, clean=True)
                if not docstring or ">>>" not in docstring:
                    continue
                try:
                    examples = doctest.DocTestParser().get_examples(docstring)
                    owner = getattr(node, "name", "the module")
                    example = _File(f"{parsed.relative} (docstring example of {owner})",
                                    "\n".join(e.source for e in examples))
                except (ValueError, SyntaxError, RecursionError):
                    continue
                example.imports = {**parsed.imports, **example.imports}
                found.append(example)
            self._doc_examples[path] = found
        return self._doc_examples[path]

    # -- calls that build the class without naming it ----------------------------------------------------------

    def construction_calls(self, defining: Path, name: str) -> Iterator[tuple[Path, _File, ast.Call]]:
        """Every call that builds ``name`` of ``defining``: by its name (``calls_of``), then the calls that reach it
        another way (``indirect_calls_of``)."""
        yield from self.calls_of(defining, name)
        yield from self.indirect_calls_of(defining, name)

    def local_names_of(self, path: Path, parsed: _File, defining: Path, name: str) -> set[str]:
        """The names under which file ``path`` sees ``name`` of ``defining`` (its own, or imported)."""
        if path.resolve() == defining:
            return {name}
        return {local for local, origin in parsed.imports.items() if origin.rsplit(".", 1)[-1] == name
                and self._provides(self.module_path(path, origin.rsplit(".", 1)[0] or "."), defining)}

    def _refers(self, path: Path, parsed: _File, node: ast.AST, defining: Path, name: str, local: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in local
        if isinstance(node, ast.Attribute) and node.attr == name:
            module = parsed.qualified(node.value)
            return module is not None and self._provides(self.module_path(path, module), defining)
        return False

    def method_calls_of(self, defining: Path, class_name: str, method: str) -> Iterator[tuple[Path, _File, ast.Call]]:
        """Calls ``Class.method(...)`` of a class of ``defining`` (a classmethod such as ``from_config``)."""
        for path, parsed in self._files_naming(method):
            local = self.local_names_of(path, parsed, defining, class_name)
            for node in ast.walk(parsed.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method \
                        and self._refers(path, parsed, node.func.value, defining, class_name, local):
                    yield path, parsed, node

    def indirect_calls_of(self, defining: Path, name: str) -> list[tuple[Path, _File, ast.Call]]:
        key = (defining, name)
        if key not in self._indirect:
            self._indirect[key] = []  # a lookup that reaches itself (a registry's own callers) finds nothing more
            self._indirect[key] = list(self._indirect_calls(defining, name))
        return self._indirect[key]

    def _indirect_calls(self, defining: Path, name: str) -> Iterator[tuple[Path, _File, ast.Call]]:
        """Calls that build the class without naming it, each as a call of the class (its arguments are what the
        class receives): ``cls(...)`` in its own classmethods (``Net.from_config(cfg)``); ``super().__init__(...)``
        in the constructors of its subclasses; ``partial(Net, dim=8)`` (with the arguments of the partial's
        calls); a name bound to it (``net_class = Net``, ``for net_class in (Net, Other)``); and a registry that
        holds it (``MODELS = {"net": Net}`` or ``@MODELS.register``, then ``MODELS[args.arch](...)``,
        ``MODELS.get(name)(...)``), unless the key evaluates to another entry."""
        defining_file = self.file(defining)
        if defining_file is not None:
            yield from self._classmethod_calls(defining, defining_file, name)
        registries: list[tuple[Path, str, dict]] = []  # (file binding it, its name, {key: names its entries})
        for path, parsed in self._files_naming(name):
            local = self.local_names_of(path, parsed, defining, name)
            if not local and not any(isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(parsed.tree)):
                continue
            yield from self._subclass_constructor_calls(path, parsed, defining, name, local)
            yield from self._partial_calls(path, parsed, defining, name, local)
            holders = _names_holding(parsed.tree, lambda n: self._refers(path, parsed, n, defining, name, local))
            for node in ast.walk(parsed.tree):
                if isinstance(node, ast.Call) and (isinstance(node.func, ast.Subscript) or isinstance(
                        node.func, ast.Name) and node.func.id in holders and node.func.id not in local) \
                        and self._denotes(path, parsed, node.func, defining, name, local, node.lineno, 0):
                    yield path, parsed, node
            registries += self._registries(path, parsed, defining, name, local)
        seen: set[tuple[Path, str]] = set()
        for registry_path, registry, keys in registries:
            if (registry_path, registry) in seen:
                continue
            seen.add((registry_path, registry))
            yield from self._registry_calls(registry_path, registry, keys, name)

    def _classmethod_calls(self, defining: Path, parsed: _File, name: str) -> Iterator[tuple[Path, _File, ast.Call]]:
        for node in parsed.tree.body:
            if not (isinstance(node, ast.ClassDef) and node.name == name):
                continue
            for method in node.body:
                if not isinstance(method, ast.FunctionDef) or not method.args.args or not any(
                        isinstance(d, ast.Name) and d.id == "classmethod" for d in method.decorator_list):
                    continue
                own = method.args.args[0].arg
                for call in ast.walk(method):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == own:
                        yield defining, parsed, call

    def _subclass_constructor_calls(self, path: Path, parsed: _File, defining: Path, name: str,
                                    local: set[str]) -> Iterator[tuple[Path, _File, ast.Call]]:
        """A subclass's ``super().__init__(...)`` as a call of the class, keeping only what it passes to parameters
        without a default: the subclass's choice of a defaulted value (``drop=0.0``) is the subclass's, while a
        value the class cannot do without is how the repository builds it (and ``**options`` its callers')."""
        defining_file = self.file(defining)
        base = next((n for n in defining_file.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) \
            if defining_file is not None else None
        base_init = next((m for m in base.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None) \
            if base is not None else None
        for path_, parsed_, call in self._subclass_init_calls(path, parsed, defining, name, local):
            if base_init is None:
                yield path_, parsed_, call
                continue
            names = [a.arg for a in [*base_init.args.posonlyargs, *base_init.args.args]][1:]
            required = {n for n in names + [a.arg for a in base_init.args.kwonlyargs]
                        if _parameter_default(base_init, n) is None}
            keywords = [k for k in call.keywords if k.arg is None or k.arg in required]
            for index, argument in enumerate(call.args):
                if isinstance(argument, ast.Starred) or index >= len(names):
                    break
                if names[index] in required:
                    keywords.append(ast.keyword(arg=names[index], value=argument))
            if keywords:
                yield path_, parsed_, self._synthetic(parsed_, call, [], keywords)

    def _subclass_init_calls(self, path: Path, parsed: _File, defining: Path, name: str,
                             local: set[str]) -> Iterator[tuple[Path, _File, ast.Call]]:
        for node in parsed.tree.body:
            if not isinstance(node, ast.ClassDef) or node.name == name and path.resolve() == defining \
                    or not any(self._refers(path, parsed, base, defining, name, local) for base in node.bases):
                continue
            init = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
            for call in ast.walk(init) if init is not None else []:
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "__init__"):
                    continue
                owner = call.func.value
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    yield path, parsed, call
                elif self._refers(path, parsed, owner, defining, name, local) and call.args:
                    yield path, parsed, self._synthetic(parsed, call, call.args[1:], call.keywords)  # Base.__init__(self, ...)

    def _partial_calls(self, path: Path, parsed: _File, defining: Path, name: str,
                       local: set[str]) -> Iterator[tuple[Path, _File, ast.Call]]:
        for node in ast.walk(parsed.tree):
            if not (isinstance(node, ast.Call) and parsed.qualified(node.func) in ("functools.partial", "partial")
                    and node.args and self._refers(path, parsed, node.args[0], defining, name, local)):
                continue
            statement = parsed.parents.get(id(node))
            later = []
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name):
                scope = parsed.enclosing_function(node) or parsed.tree
                held = statement.targets[0].id
                later = [c for c in ast.walk(scope) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                         and c.func.id == held and c.lineno > statement.lineno]
            for call in later or [None]:
                yield path, parsed, self._synthetic(
                    parsed, call or node, node.args[1:] + (call.args if call else []),
                    node.keywords + (call.keywords if call else []))

    @staticmethod
    def _synthetic(parsed: _File, like: ast.Call, args: list, keywords: list) -> ast.Call:
        """A call of the class made of another call's arguments, placed where ``like`` is."""
        call = ast.Call(func=like.func, args=list(args), keywords=list(keywords))
        ast.copy_location(call, like)
        parsed.parents[id(call)] = parsed.parents.get(id(like), parsed.tree)
        parsed.synthetic.append(call)  # kept alive: parents is keyed by id
        return call

    def _denotes(self, path: Path, parsed: _File, node: ast.AST, defining: Path, name: str, local: set[str],
                 line: int, depth: int) -> bool:
        """Whether a callee expression is the class: a name bound to it (``net_class = Net``), a loop variable
        over a sequence holding it, a subscript of a literal container holding it."""
        if depth > 2:
            return False
        if self._refers(path, parsed, node, defining, name, local):
            return depth > 0
        if isinstance(node, ast.Subscript):
            return self._holds(path, parsed, node.value, defining, name, local, line, depth + 1, node.slice)
        if not isinstance(node, ast.Name):
            return False
        scope = parsed.enclosing_function(node) or parsed.tree if depth == 0 else parsed.tree
        binding = _last_binding(scope, node.id, line)
        if isinstance(binding, ast.Assign) and len(binding.targets) == 1 and isinstance(binding.targets[0], ast.Name):
            return self._denotes(path, parsed, binding.value, defining, name, local, binding.lineno, depth + 1)
        for loop in ast.walk(scope):
            if isinstance(loop, (ast.For, ast.comprehension)) and isinstance(loop.target, ast.Name) \
                    and loop.target.id == node.id and self._holds(path, parsed, loop.iter, defining, name, local,
                                                                  line, depth + 1, None):
                return True
        return False

    def _holds(self, path: Path, parsed: _File, node: ast.AST, defining: Path, name: str, local: set[str],
               line: int, depth: int, key: Optional[ast.AST]) -> bool:
        """Whether a container expression (a literal, or a name bound to one) holds the class; with ``key``, the
        entry that key selects is the class unless the key evaluates to another entry."""
        if isinstance(node, ast.Name):
            binding = _last_binding(parsed.enclosing_function(node) or parsed.tree, node.id, line) \
                or _last_binding(parsed.tree, node.id, 10 ** 9)
            if isinstance(binding, ast.Assign) and len(binding.targets) == 1:
                return self._holds(path, parsed, binding.value, defining, name, local, line, depth + 1, key)
            return False
        if isinstance(node, ast.Dict):
            entries = dict(zip(node.keys, node.values))
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            entries = dict(enumerate(node.elts))
        else:
            return False
        mine = [k for k, v in entries.items() if self._refers(path, parsed, v, defining, name, local)]
        if not mine:
            return False
        if key is None:
            return True
        chosen = _Evaluator(self).value(path, parsed, key)
        if chosen is UNKNOWN:
            return True
        return any((k.value if isinstance(k, ast.Constant) else k) == chosen for k in mine)

    def _registries(self, path: Path, parsed: _File, defining: Path, name: str,
                    local: set[str]) -> list[tuple[Path, str, dict]]:
        """Module-level mappings the class is put in by this file: ``MODELS = {"net": Net}``, ``MODELS["net"] =
        Net``, a ``@MODELS.register(...)`` decorator on the class; each with the keys known to hold it."""
        found = []
        for node in parsed.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                    keys = {k.value for k, v in zip(node.value.keys, node.value.values) if isinstance(k, ast.Constant)
                            and self._refers(path, parsed, v, defining, name, local)}
                    if keys:
                        found.append((path.resolve(), target.id, keys))
                elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                        and self._refers(path, parsed, node.value, defining, name, local):
                    key = target.slice.value if isinstance(target.slice, ast.Constant) else None
                    found.append((self._binding_file(path, parsed, target.value.id), target.value.id, {key, name}))
            elif isinstance(node, ast.ClassDef) and node.name == name and path.resolve() == defining:
                for decorator in node.decorator_list:
                    call = decorator if isinstance(decorator, ast.Call) else None
                    func = call.func if call is not None else decorator
                    if isinstance(func, ast.Attribute) and func.attr.startswith("register") \
                            and isinstance(func.value, ast.Name):
                        keys = {name}
                        for argument in ([*call.args, *(k.value for k in call.keywords if k.arg == "name")]
                                         if call is not None else []):
                            if isinstance(argument, ast.Constant):
                                keys.add(argument.value)
                        found.append((self._binding_file(path, parsed, func.value.id), func.value.id, keys))
        return found

    def _binding_file(self, path: Path, parsed: _File, local: str) -> Path:
        origin = parsed.imports.get(local)
        if origin is None:
            return path.resolve()
        module = self.module_path(path, origin.rsplit(".", 1)[0] or ".")
        return module if module is not None else path.resolve()

    def _registry_calls(self, registry_path: Path, registry: str, keys: set,
                        name: str) -> Iterator[tuple[Path, _File, ast.Call]]:
        """``MODELS[key](...)`` / ``MODELS.get(key)(...)`` / ``builder = MODELS[key]; builder(...)`` anywhere,
        unless ``key`` evaluates to a key that is not the class's."""
        for path, parsed in self._files_naming(registry):
            local = self.local_names_of(path, parsed, registry_path, registry) if path.resolve() != registry_path \
                else {registry}
            if not local:
                continue
            holders = _names_holding(parsed.tree, lambda n: isinstance(n, ast.Name) and n.id in local)
            for node in ast.walk(parsed.tree):
                if not isinstance(node, ast.Call) or isinstance(node.func, ast.Name) and node.func.id not in holders:
                    continue
                key = self._registry_key(parsed, node.func, local, node.lineno, 0)
                if key is None:
                    continue
                chosen = _Evaluator(self).value(path, parsed, key) if isinstance(key, ast.AST) else UNKNOWN
                if chosen is UNKNOWN or chosen in keys or (isinstance(chosen, str) and chosen.lower() == name.lower()):
                    yield path, parsed, node

    def _registry_key(self, parsed: _File, func: ast.AST, local: set[str], line: int, depth: int) -> Any:
        """The key expression when ``func`` looks an entry up in the registry (``REG[key]``, ``REG.get(key)``),
        UNKNOWN for a lookup whose key is not an expression, None when it is no lookup."""
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in local:
            return func.slice
        if isinstance(func, ast.Call) and isinstance(func.func, ast.Attribute) and func.func.attr in ("get", "build") \
                and isinstance(func.func.value, ast.Name) and func.func.value.id in local:
            return func.args[0] if func.args else UNKNOWN
        if isinstance(func, ast.Name) and depth == 0:
            binding = _last_binding(parsed.enclosing_function(func) or parsed.tree, func.id, line)
            if isinstance(binding, ast.Assign) and len(binding.targets) == 1:
                return self._registry_key(parsed, binding.value, local, binding.lineno, depth + 1)
        return None


    @staticmethod
    def _provides(module: Optional[Path], defining: Path) -> bool:
        """Whether importing ``name`` from ``module`` can be the class of ``defining``: that file, or a package
        ``__init__.py`` (which may re-export it); another module's class of the same name is not."""
        return module is not None and (module == defining or module.name == "__init__.py")


class _Evaluator:
    def __init__(self, repository: Repository):
        self.repository = repository
        self.origins: list[str] = []
        self.budget = [MAX_EVALUATIONS]  # shared with the evaluators of called functions (_Bound)
        self.visiting: set[int] = set()  # nodes being evaluated: a cycle (f(x) passing f's own x) has no value
        self.comprehended: list[tuple[ast.AST, str, Any]] = []  # (comprehension, its loop's name, the item now)

    def value(self, path: Path, parsed: _File, node: Optional[ast.AST], depth: int = 0) -> Any:
        if node is None or depth > MAX_DEPTH or self.budget[0] <= 0 or id(node) in self.visiting:
            return UNKNOWN
        self.budget[0] -= 1
        self.visiting.add(id(node))
        try:
            return self._value(path, parsed, node, depth)
        except RecursionError:
            return UNKNOWN
        except Exception:  # noqa: BLE001 - an operation on evaluated values that raises has no value here
            return UNKNOWN
        finally:
            self.visiting.discard(id(node))

    def _value(self, path: Path, parsed: _File, node: ast.AST, depth: int) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.value(path, parsed, e, depth + 1) for e in node.elts]
            if any(i is UNKNOWN for i in items):
                return UNKNOWN
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            result = AttrDict()
            for key, item in zip(node.keys, node.values):
                value = self.value(path, parsed, item, depth + 1)
                if key is None:
                    if not isinstance(value, dict):
                        return UNKNOWN
                    result.update(value)
                    continue
                result[self.value(path, parsed, key, depth + 1)] = value
            return result
        if isinstance(node, ast.Name):
            return self._name(path, parsed, node, depth)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                held = self._instance_attribute(path, parsed, node, depth)
                if held is not None:
                    return held[0]
            base = self.value(path, parsed, node.value, depth + 1)
            if isinstance(base, _ModuleRef):
                target = self.repository.file(base.path)
                return UNKNOWN if target is None else self._module_level(base.path, target, node.attr, depth + 1)
            if isinstance(base, dict):
                return base.get(node.attr, UNKNOWN)
            if isinstance(base, LibraryRef):
                return LibraryRef(f"{base.dotted}.{node.attr}")
            if isinstance(base, TensorShape) and node.attr == "shape":
                return base.shape
            return UNKNOWN
        if isinstance(node, ast.Subscript):
            base = self.value(path, parsed, node.value, depth + 1)
            key = self.value(path, parsed, node.slice, depth + 1)
            if base is UNKNOWN and type(key) is int and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "shape":
                return Typed("count")  # ``labels.shape[1]`` of data the script loads when it runs: a size
            if base is UNKNOWN or key is UNKNOWN or isinstance(base, (_ModuleRef, _OpenFile, TensorShape)):
                return UNKNOWN
            return base[key]
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.value(path, parsed, p, depth + 1)
                     for p in (node.lower, node.upper, node.step)]
            return UNKNOWN if UNKNOWN in parts else slice(*parts)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.value(path, parsed, node.left, depth + 1), self.value(path, parsed, node.right, depth + 1)
            if left is UNKNOWN or right is UNKNOWN:
                return UNKNOWN
            if isinstance(node.op, ast.Div) and isinstance(left, str):  # Path("configs") / "base.yaml"
                return os.path.join(left, str(right))
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            operand = self.value(path, parsed, node.operand, depth + 1)
            if operand is UNKNOWN:
                return UNKNOWN
            return {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
                    ast.Invert: operator.invert}[type(node.op)](operand)
        if isinstance(node, ast.BoolOp):
            values = [self.value(path, parsed, v, depth + 1) for v in node.values]
            if UNKNOWN in values:
                return UNKNOWN
            result = values[0]
            for value in values[1:]:
                result = (result and value) if isinstance(node.op, ast.And) else (result or value)
            return result
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            left = self.value(path, parsed, node.left, depth + 1)
            right = self.value(path, parsed, node.comparators[0], depth + 1)
            return UNKNOWN if UNKNOWN in (left, right) else _COMPARE[type(node.ops[0])](left, right)
        if isinstance(node, ast.IfExp):
            test = self.value(path, parsed, node.test, depth + 1)
            if test is UNKNOWN:
                return UNKNOWN
            return self.value(path, parsed, node.body if test else node.orelse, depth + 1)
        if isinstance(node, ast.Call):
            return self._call(path, parsed, node, depth)
        if isinstance(node, (ast.ListComp, ast.SetComp)) and len(node.generators) == 1:
            return self._comprehension(path, parsed, node, depth)
        return UNKNOWN

    def _comprehension(self, path: Path, parsed: _File, node: ast.AST, depth: int) -> Any:
        """``[int(k) for k in sizes.split(",")]``: one loop over a known sequence, its filters and items evaluated
        with the loop's name bound to each element; UNKNOWN as soon as one does not evaluate."""
        loop = node.generators[0]
        items = self.value(path, parsed, loop.iter, depth + 1)
        if not isinstance(loop.target, ast.Name) or loop.is_async or not isinstance(items, (list, tuple, str, range)) \
                or len(items) > MAX_COMPREHENSION_ITEMS:
            return UNKNOWN
        result = []
        for item in items:
            self.comprehended.append((node, loop.target.id, item))
            try:
                tests = [self.value(path, parsed, test, depth + 1) for test in loop.ifs]
                if UNKNOWN in tests:
                    return UNKNOWN
                if not all(tests):
                    continue
                element = self.value(path, parsed, node.elt, depth + 1)
            finally:
                self.comprehended.pop()
            if element is UNKNOWN:
                return UNKNOWN
            result.append(element)
        return result if isinstance(node, ast.ListComp) else set(result)

    # -- names ---------------------------------------------------------------------------------------------

    def _name(self, path: Path, parsed: _File, node: ast.Name, depth: int) -> Any:
        for comprehension, name, item in reversed(self.comprehended):
            if name == node.id and _inside(parsed, node, comprehension):
                return item
        function = parsed.enclosing_function(node)
        while function is not None:
            found = self._local(path, parsed, function, node.id, node.lineno, depth)
            if found is not None:
                return found[0]
            function = parsed.enclosing_function(function)
        return self._module_level(path, parsed, node.id, depth, before=node.lineno
                                  if parsed.enclosing_function(node) is None else None)

    def _local(self, path: Path, parsed: _File, function: ast.FunctionDef, name: str, line: int,
               depth: int) -> Optional[tuple[Any]]:
        """(value,) when ``name`` is bound in ``function`` (an assignment before ``line``, or a parameter)."""
        binding = _last_binding(function, name, line)
        if binding is not None:
            return (self._with_attribute_writes(path, parsed, function, binding, name, line,
                                                self._bound_value(path, parsed, binding, name, depth), depth),)
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        parameters = positional + arguments.kwonlyargs
        if not any(a.arg == name for a in parameters):
            if arguments.kwarg is not None and arguments.kwarg.arg == name:
                return (self._forwarded_keywords(path, parsed, function, depth),)
            return None
        hydra = self._hydra_config(path, parsed, function)
        if hydra is not UNKNOWN and parameters and parameters[0].arg == name:
            return (hydra,)
        owner = parsed.parents.get(id(function))
        if owner is parsed.tree or (function.name == "__init__" and isinstance(owner, ast.ClassDef)
                                    and parsed.parents.get(id(owner)) is parsed.tree):
            # a function's callers pass it; a constructor's, the calls of its class (GAT(alpha=args.alpha) for the
            # alpha that GAT.__init__ hands to its layers)
            called = function.name if owner is parsed.tree else owner.name
            for caller_path, caller, call in self.repository.construction_calls(path.resolve(), called):
                expression = _argument_for(function, call, name, method=owner is not parsed.tree)
                value = self.value(caller_path, caller, expression, depth + 1) if expression is not None else \
                    self._unpacked_keyword(caller_path, caller, call, name, depth)
                if value is not UNKNOWN:
                    return (value,)
        elif isinstance(owner, ast.ClassDef) and parsed.parents.get(id(owner)) is parsed.tree and any(
                isinstance(d, ast.Name) and d.id in ("classmethod", "staticmethod") for d in function.decorator_list):
            # Net.from_config(cfg): the method's callers pass it (its cls / nothing in place of self)
            bound = any(isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list)
            for caller_path, caller, call in self.repository.method_calls_of(path.resolve(), owner.name, function.name):
                expression = _argument_for(function, call, name, method=bound)
                value = self.value(caller_path, caller, expression, depth + 1) if expression is not None else \
                    self._unpacked_keyword(caller_path, caller, call, name, depth)
                if value is not UNKNOWN:
                    return (value,)
        default = _parameter_default(function, name)
        return (UNKNOWN if default is None else self.value(path, parsed, default, depth + 1),)

    def _forwarded_keywords(self, path: Path, parsed: _File, function: ast.FunctionDef, depth: int) -> Any:
        """A constructor's ``**kwargs``: the keywords its class's first call site passes that no named parameter
        takes (``Small(rounds=2)`` for ``Small.__init__(self, **kw)`` handing ``kw`` on); {} when it passes none."""
        owner = parsed.parents.get(id(function))
        if function.name != "__init__" or not isinstance(owner, ast.ClassDef):
            return UNKNOWN
        named = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]}
        for caller_path, caller, call in self.repository.calls_of(path.resolve(), owner.name):
            rest = {k.arg: self.value(caller_path, caller, k.value, depth + 1) for k in call.keywords
                    if k.arg is not None and k.arg not in named}
            if not any(k.arg is None for k in call.keywords):
                return AttrDict(rest)
        return UNKNOWN

    def _unpacked_keyword(self, path: Path, parsed: _File, call: ast.Call, name: str, depth: int) -> Any:
        """What ``f(**kwargs)`` passes as ``name``, when ``kwargs`` evaluates to a mapping that has it."""
        for keyword in call.keywords:
            if keyword.arg is None:
                mapping = self.value(path, parsed, keyword.value, depth + 1)
                if isinstance(mapping, dict) and name in mapping:
                    return mapping[name]
        return UNKNOWN

    def _bound_value(self, path: Path, parsed: _File, binding: ast.AST, name: str, depth: int) -> Any:
        if isinstance(binding, ast.withitem):
            return self.value(path, parsed, binding.context_expr, depth + 1)
        if isinstance(binding, (ast.Import, ast.ImportFrom)):
            return self._imported(path, parsed, name, depth)
        if isinstance(binding, ast.ClassDef) and parsed.parents.get(id(binding)) is parsed.tree:
            return ClassRef(parsed.relative, binding.name)
        if isinstance(binding, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return UNKNOWN
        target = binding.target if isinstance(binding, (ast.AnnAssign, ast.AugAssign)) else None
        if isinstance(binding, ast.AugAssign):
            return UNKNOWN
        value = self.value(path, parsed, binding.value, depth + 1)
        targets = [target] if target is not None else binding.targets
        for item in targets:
            if isinstance(item, ast.Name) and item.id == name:
                return value
            if isinstance(item, (ast.Tuple, ast.List)) and value is not UNKNOWN:
                names = [e.id if isinstance(e, ast.Name) else None for e in item.elts]
                if name in names and isinstance(value, (tuple, list)) and len(value) == len(names):
                    return value[names.index(name)]
        return UNKNOWN

    def _module_level(self, path: Path, parsed: _File, name: str, depth: int, before: Optional[int] = None) -> Any:
        line = before if before is not None else 10 ** 9
        binding = _last_binding(parsed.tree, name, line)
        if binding is not None:
            return self._with_attribute_writes(path, parsed, parsed.tree, binding, name, line,
                                               self._bound_value(path, parsed, binding, name, depth), depth)
        return UNKNOWN

    def _with_attribute_writes(self, path: Path, parsed: _File, scope: ast.AST, binding: ast.AST, name: str,
                               line: int, value: Any, depth: int) -> Any:
        """A namespace or configuration (``args = parser.parse_args()``) as the scope has changed it before ``line``:
        ``args.vocab_size = len(vocab)``, ``args.sizes = [int(k) for k in args.sizes.split(",")]``, ``del
        args.flag``, in the order the statements come, each value evaluated where it is written. Only the writes
        that run whenever the use does: one inside a branch, a loop or a ``try`` that does not also hold the use is
        left out, and so is a value that does not evaluate (the value before it stays). Anything but an AttrDict as
        it is."""
        if not isinstance(value, AttrDict):
            return value
        start = getattr(binding, "lineno", getattr(getattr(binding, "context_expr", None), "lineno", 0))
        writes = []
        for node in _own_nodes(scope):
            if not start < getattr(node, "lineno", -1) < line or _runs_conditionally(parsed, node, scope, line):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == name:
                        writes.append((node.lineno, target.attr, node.value))
            elif isinstance(node, ast.Delete):
                writes += [(node.lineno, t.attr, None) for t in node.targets if isinstance(t, ast.Attribute)
                           and isinstance(t.value, ast.Name) and t.value.id == name]
        if not writes:
            return value
        changed = AttrDict(value)
        for _, attribute, expression in sorted(writes, key=lambda w: w[0]):
            if expression is None:
                changed.pop(attribute, None)
                continue
            written = self.value(path, parsed, expression, depth + 1)
            if written is not UNKNOWN:
                changed[attribute] = written
        return changed

    def _imported(self, path: Path, parsed: _File, name: str, depth: int) -> Any:
        origin = parsed.imports.get(name)
        if origin is None:
            return UNKNOWN
        module_path = self.repository.module_path(path, origin)
        if module_path is not None:
            return _ModuleRef(module_path)  # import config as C / from . import config
        module, _, attribute = origin.rpartition(".")
        module_path = self.repository.module_path(path, module or ".")
        target = self.repository.file(module_path) if module_path is not None else None
        if target is None:  # import torch.nn as nn / from torch.nn import BatchNorm2d: the library's, not the tree's
            return LibraryRef(origin) if origin.split(".")[0] in IMPORTABLE_LIBRARIES else UNKNOWN
        return self._module_level(module_path, target, attribute, depth + 1)

    # -- attributes of the instance a method runs on ------------------------------------------------------

    def _instance_attribute(self, path: Path, parsed: _File, node: ast.Attribute, depth: int) -> Optional[tuple[Any]]:
        """(value,) of ``self.args`` read in a method of a module-level class: what the method assigned to it
        before, else what the class's constructor assigns (``self.args = args``, the argument from the calls of the
        class), else what a base class's constructor assigns, its parameters bound to the ``super().__init__(...)``
        call that reaches it (or to the class's own calls when the class has no constructor). None when ``node`` is
        not an attribute of the method's instance."""
        function = parsed.enclosing_function(node)
        owner = parsed.parents.get(id(function)) if function is not None else None
        if not isinstance(owner, ast.ClassDef) or parsed.parents.get(id(owner)) is not parsed.tree \
                or not function.args.args or function.args.args[0].arg != node.value.id \
                or any(isinstance(d, ast.Name) and d.id in ("classmethod", "staticmethod") for d in function.decorator_list):
            return None
        assigned = _attribute_assignment(function, node.value.id, node.attr, node.lineno)
        if assigned is not None:
            return (self.value(path, parsed, assigned, depth + 1),)
        return (self._constructor_attribute(self, path, parsed, owner, node.attr, depth, None),)

    def _constructor_attribute(self, evaluator: "_Evaluator", path: Path, parsed: _File, cls: ast.ClassDef,
                               attribute: str, depth: int, reached: Optional[tuple]) -> Any:
        """What ``cls``'s constructor (or its bases', up the chain) assigns to ``self.<attribute>``, evaluated by
        ``evaluator`` (which binds the constructor's parameters); ``reached`` is how the constructor is called when
        it runs for a subclass: (call, its file's path, its file, whether ``self`` is implicit)."""
        if depth > MAX_DEPTH:
            return UNKNOWN
        init = next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
        if init is not None and init.args.args:
            if reached is not None:
                evaluator = _Bound(evaluator, init, reached[0], reached[1], reached[2], method=reached[3])
            assigned = _attribute_assignment(init, init.args.args[0].arg, attribute, 10 ** 9)
            if assigned is not None:
                return evaluator.value(path, parsed, assigned, depth + 1)
        for base_node in cls.bases[:1]:
            base = self.value(path, parsed, base_node, depth + 1)
            if not isinstance(base, ClassRef):
                return UNKNOWN
            base_path = (self.repository.root / base.path).resolve()
            base_file = self.repository.file(base_path)
            base_cls = next((n for n in base_file.tree.body if isinstance(n, ast.ClassDef) and n.name == base.name),
                            None) if base_file is not None else None
            if base_cls is None:
                return UNKNOWN
            if init is None:  # the base's constructor runs with the arguments of this class's calls
                if reached is not None:
                    return self._constructor_attribute(evaluator, base_path, base_file, base_cls, attribute,
                                                       depth + 1, reached)
                for caller_path, caller, call in self.repository.construction_calls(path.resolve(), cls.name):
                    value = self._constructor_attribute(evaluator, base_path, base_file, base_cls, attribute,
                                                        depth + 1, (call, caller_path, caller, True))
                    if value is not UNKNOWN:
                        return value
                return UNKNOWN
            for call in ast.walk(init):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "__init__"):
                    continue
                through_super = isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name) \
                    and call.func.value.func.id == "super"
                if through_super or isinstance(call.func.value, ast.Name) and call.func.value.id == _base_name(base_node):
                    return self._constructor_attribute(evaluator, base_path, base_file, base_cls, attribute,
                                                       depth + 1, (call, path, parsed, through_super))
            return UNKNOWN
        return UNKNOWN

    # -- calls ---------------------------------------------------------------------------------------------

    def _call(self, path: Path, parsed: _File, node: ast.Call, depth: int) -> Any:
        qualified = parsed.qualified(node.func) or ""
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method in ("parse_args", "parse_known_args"):
            namespace = self._argparse(path, parsed, depth)
            return (namespace, []) if method == "parse_known_args" else namespace
        args = [self.value(path, parsed, a, depth + 1) for a in node.args if not isinstance(a, ast.Starred)]
        keywords = {}
        for keyword in node.keywords:
            value = self.value(path, parsed, keyword.value, depth + 1)
            if keyword.arg is None:
                if not isinstance(value, dict):
                    return UNKNOWN
                keywords.update(value)
            else:
                keywords[keyword.arg] = value
        if qualified in ("open", "io.open") and args and isinstance(args[0], str):
            return _OpenFile(self._data_path(path, args[0]))
        if method == "open" and isinstance(node.func, ast.Attribute):  # Path(p).open()
            base = self.value(path, parsed, node.func.value, depth + 1)
            return _OpenFile(self._data_path(path, base)) if isinstance(base, str) else UNKNOWN
        if qualified in ("pathlib.Path", "Path", "os.path.join") and args and all(isinstance(a, str) for a in args):
            return os.path.join(*args)
        if qualified in ("pathlib.Path", "Path", "os.path.join") and len(args) >= 2 and args[-1] is UNKNOWN and \
                all(isinstance(a, str) for a in args[:-1]):
            # ``os.path.join("configs", args.config)`` with the file named on the command line: one of the
            # repository's own configuration files in that folder stands for it (said in the origins)
            return self._one_configuration_in(path, os.path.join(*args[:-1]))
        if qualified in _DATA_LOADERS and args:
            source = args[0]
            data_path = source.path if isinstance(source, _OpenFile) else \
                self._data_path(path, source) if isinstance(source, str) and qualified.endswith("OmegaConf.load") else None
            if data_path is None:
                return UNKNOWN
            loaded = _load_data_file(data_path)
            if loaded is not UNKNOWN:
                self._note(data_path.relative_to(self.repository.root).as_posix()
                           if data_path.is_relative_to(self.repository.root) else str(data_path))
            return loaded
        if qualified in ("yaml.safe_load_all",):
            return UNKNOWN
        if qualified == "vars" and len(args) == 1 and isinstance(args[0], dict):
            return AttrDict(args[0])
        if qualified == "getattr" and len(args) >= 2 and isinstance(args[0], dict):
            return args[0].get(args[1], args[2] if len(args) > 2 else UNKNOWN)
        if method in _STRING_METHODS and isinstance(node.func, ast.Attribute) and UNKNOWN not in args \
                and all(v is not UNKNOWN for v in keywords.values()):
            base = self.value(path, parsed, node.func.value, depth + 1)  # "3,4,5".split(",")
            if isinstance(base, str):
                return getattr(base, method)(*args, **keywords)
        if method == "get" and isinstance(node.func, ast.Attribute):
            base = self.value(path, parsed, node.func.value, depth + 1)
            if isinstance(base, dict) and args:
                return base.get(args[0], args[1] if len(args) > 1 else keywords.get("default"))
            return UNKNOWN
        if qualified in _NAMESPACE_MAKERS or qualified.rsplit(".", 1)[-1] in ("SimpleNamespace", "Namespace", "EasyDict"):
            mapping = args[0] if len(args) == 1 and isinstance(args[0], dict) else {}
            if args and not mapping or any(v is UNKNOWN for v in keywords.values()):
                return UNKNOWN
            return _to_attr({**mapping, **keywords})
        if qualified in _TENSOR_MAKERS:
            return _tensor_shape(qualified, args, keywords)
        if qualified in _PURE_BUILTINS and qualified not in parsed.imports:
            if UNKNOWN in args or any(v is UNKNOWN for v in keywords.values()):
                if qualified == "len" and len(args) == 1 and not keywords:
                    return Typed("count")  # the size of what the script loads when it runs (a vocabulary, a label set)
                return Typed(qualified) if qualified in ("int", "float") and len(args) == 1 else UNKNOWN
            return _PURE_BUILTINS[qualified](*args, **keywords)
        if isinstance(node.func, (ast.Name, ast.Attribute)):
            called = self._module_level_callee(path, parsed, node.func, depth)
            if isinstance(called, ClassRef):
                positional = args if not any(isinstance(a, ast.Starred) for a in node.args) else \
                    args[:next(i for i, a in enumerate(node.args) if isinstance(a, ast.Starred))]
                given = [*positional, *keywords.values()]
                if given and all(v is UNKNOWN for v in given):
                    return UNKNOWN  # nothing of it evaluated: no more known than an unknown value
                return Instance(called, positional, keywords)
        return self._repository_function(path, parsed, node, depth)

    def _module_level_callee(self, path: Path, parsed: _File, func: ast.AST, depth: int) -> Any:
        """What a called ``Name`` / ``module.Name`` is when the name is bound at module level (a class, an
        import), or assigned a class of the tree in the function (``Attn = Sparse if kind == "sparse" else
        Dense``, the branch its condition takes); a parameter (``layer(x)``) is not looked up: its callers are not
        worth a search."""
        if isinstance(func, ast.Name):
            function = parsed.enclosing_function(func)
            while function is not None:
                arguments = function.args
                binding = _last_binding(function, func.id, func.lineno)
                if isinstance(binding, ast.Assign) and isinstance(binding.value, (ast.Name, ast.Attribute, ast.IfExp)):
                    value = self._bound_value(path, parsed, binding, func.id, depth + 1)
                    return value if isinstance(value, ClassRef) else UNKNOWN
                if binding is not None or func.id in {
                        a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}:
                    return UNKNOWN
                function = parsed.enclosing_function(function)
            return self._module_level(path, parsed, func.id, depth + 1)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in parsed.imports:
            module = self._imported(path, parsed, func.value.id, depth + 1)
            target = self.repository.file(module.path) if isinstance(module, _ModuleRef) else None
            return UNKNOWN if target is None else self._module_level(module.path, target, func.attr, depth + 1)
        return UNKNOWN

    def _repository_function(self, path: Path, parsed: _File, node: ast.Call, depth: int) -> Any:
        """``load_config("configs/base.yaml")``: a function of the tree whose last statement returns a value,
        evaluated with its parameters bound to the call's arguments."""
        if not isinstance(node.func, ast.Name):
            return UNKNOWN
        name = node.func.id
        definition_path, definition_file = path, parsed
        if name in parsed.imports:
            module, _, name = parsed.imports[name].rpartition(".")
            definition_path = self.repository.module_path(path, module or ".")
            definition_file = self.repository.file(definition_path) if definition_path is not None else None
        if definition_file is None:
            return UNKNOWN
        function = next((n for n in definition_file.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.name == name), None)
        if function is None:
            return UNKNOWN
        returned = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None]
        if len(returned) != 1:
            return UNKNOWN
        if _copies_keys_to_attributes(function, returned[0]) and node.args:
            # ``dict2namespace(config)``: the mapping, read by attribute (``config.model.ch``)
            given = self.value(path, parsed, node.args[0], depth + 1)
            return _to_attr(given) if isinstance(given, dict) else UNKNOWN
        bound = _Bound(self, function, node, path, parsed)
        return bound.value(definition_path, definition_file, returned[0].value, depth + 1)

    def _one_configuration_in(self, path: Path, folder_text: str) -> Any:
        """The path of one YAML / JSON file in the repository folder ``folder_text``, for a file the command line
        names there: any of them is one the repository runs with, so the one with the smallest sizes (the cheapest
        to check: ``_configuration_size``), the first by name among equals; UNKNOWN when that is no folder of the
        repository or holds none."""
        folder = self._data_path(path, folder_text)
        if not folder.is_dir() or not folder.is_relative_to(self.repository.root):
            return UNKNOWN
        try:
            candidates = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in (".yaml", ".yml", ".json"))
        except OSError:
            return UNKNOWN
        if not candidates:
            return UNKNOWN
        chosen = min(candidates[:MAX_CONFIGURATIONS_COMPARED], key=_configuration_size)
        relative = chosen.relative_to(self.repository.root).as_posix()
        self._note(f"{relative}, one of the configuration files in {folder_text}/ (the command line names which; "
                   f"the one with the smallest sizes)" if len(candidates) > 1 else
                   f"{relative}, one of the configuration files in {folder_text}/ (the command line names which)")
        return str(chosen)

    def _data_path(self, path: Path, text: str) -> Path:
        relative = Path(text)
        if relative.is_absolute():
            return relative
        for base in (self.repository.root, path.parent):
            if (base / relative).exists():
                return (base / relative).resolve()
        return (self.repository.root / relative).resolve()

    def _argparse(self, path: Path, parsed: _File, depth: int) -> AttrDict:
        """Every ``add_argument`` default of the file (one parser or several: their names rarely collide)."""
        if parsed._argparse is not None:
            return parsed._argparse
        namespace = AttrDict()
        parsed._argparse = namespace  # a default that reads the namespace sees what is known so far
        for node in ast.walk(parsed.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            if node.func.attr == "set_defaults":
                for key, expression in keywords.items():
                    namespace[key] = self.value(path, parsed, expression, depth + 1)
                continue
            if node.func.attr != "add_argument":
                continue
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            dest = self.value(path, parsed, keywords["dest"], depth + 1) if "dest" in keywords else None
            if not isinstance(dest, str):
                long = next((f for f in flags if f.startswith("--")), None)
                flag = long or (flags[0] if flags else None)
                if flag is None:
                    continue
                dest = flag.lstrip("-").replace("-", "_")
            action = keywords.get("action")
            action = action.value if isinstance(action, ast.Constant) else None
            required = keywords.get("required")
            if isinstance(required, ast.Constant) and required.value is True:
                value = UNKNOWN  # the command line must give it: argparse never uses its default
            elif "default" in keywords:
                value = self.value(path, parsed, keywords["default"], depth + 1)
                kind = keywords.get("type")
                if isinstance(value, str) and isinstance(kind, ast.Name) and kind.id in ("int", "float"):
                    try:
                        value = {"int": int, "float": float}[kind.id](value)
                    except ValueError:
                        value = UNKNOWN
            elif action == "store_true":
                value = False
            elif action == "store_false":
                value = True
            else:
                value = UNKNOWN  # no default: None at run time, or required
            namespace.setdefault(dest, value)
        if namespace:
            self._note(f"argparse defaults of {parsed.relative}")
        return namespace

    def _hydra_config(self, path: Path, parsed: _File, function: ast.FunctionDef) -> Any:
        """The composed config of a ``@hydra.main(config_path=..., config_name=...)`` entry point: its file,
        and the files its ``defaults`` list names per group."""
        for decorator in function.decorator_list:
            if not (isinstance(decorator, ast.Call) and (parsed.qualified(decorator.func) or "").endswith("hydra.main")):
                continue
            keywords = {k.arg: k.value.value for k in decorator.keywords if isinstance(k.value, ast.Constant)}
            folder = (path.parent / (keywords.get("config_path") or ".")).resolve()
            name = keywords.get("config_name")
            if not isinstance(name, str):
                return UNKNOWN
            config = _load_data_file(folder / (name if name.endswith(".yaml") else name + ".yaml"))
            if not isinstance(config, dict):
                return UNKNOWN
            for entry in config.pop("defaults", None) or []:
                if isinstance(entry, dict):
                    for group, option in entry.items():
                        part = _load_data_file(folder / str(group) / f"{option}.yaml")
                        if isinstance(part, dict):
                            merged = AttrDict(part)
                            merged.update(config.get(group) or {})
                            config[str(group).split("@")[0]] = merged
            config = _to_attr(_resolve_interpolations(config))
            self._note(f"the Hydra config {folder.relative_to(self.repository.root).as_posix()}/{name}"
                       if folder.is_relative_to(self.repository.root) else f"the Hydra config {name}")
            return config
        return UNKNOWN

    def _note(self, origin: str) -> None:
        if origin not in self.origins:
            self.origins.append(origin)


class _Bound(_Evaluator):
    """Evaluates inside one called function, its parameters bound to one call's arguments."""

    def __init__(self, outer: _Evaluator, function: ast.FunctionDef, call: ast.Call, caller_path: Path,
                 caller: _File, method: bool = False):
        super().__init__(outer.repository)
        self.origins, self.budget, self.visiting = outer.origins, outer.budget, outer.visiting
        self.comprehended = outer.comprehended
        self.outer, self.function, self.call, self.caller_path, self.caller = outer, function, call, caller_path, caller
        self.method = method  # a constructor called through its class or super(): ``self`` is not in the call

    def _local(self, path, parsed, function, name, line, depth):
        if function is self.function and _last_binding(function, name, line) is None:
            expression = _argument_for(function, self.call, name, method=self.method)
            if expression is not None:
                return (self.outer.value(self.caller_path, self.caller, expression, depth + 1),)
        return super()._local(path, parsed, function, name, line, depth)


def _tensor_shape(qualified: str, args: list, keywords: dict) -> Any:
    dtype = _TENSOR_MAKERS[qualified]
    high = 2
    if qualified == "torch.randint":
        if len(args) >= 3:
            high, shape = args[1], args[2]
        elif len(args) == 2:
            high, shape = args[0], args[1]
        else:
            return UNKNOWN
    elif qualified == "torch.full":
        shape = args[0] if args else keywords.get("size", UNKNOWN)
    else:
        shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)
        shape = keywords.get("size", shape)
    dtype_name = keywords.get("dtype")
    if isinstance(shape, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape) \
            and shape and isinstance(high, int):
        return TensorShape(tuple(shape), _DTYPE_NAMES.get(str(dtype_name), dtype), high)
    return UNKNOWN


def _copies_keys_to_attributes(function: ast.FunctionDef, returned: ast.Return) -> bool:
    """A function that copies a mapping's items onto an object by attribute and returns it: ``for key, value in
    config.items(): ... setattr(namespace, key, ...)`` then ``return namespace``, with the mapping its first
    parameter (a nested mapping converted the same way, by calling itself)."""
    parameters = function.args.posonlyargs + function.args.args
    if not parameters or not isinstance(returned.value, ast.Name):
        return False
    mapping, result = parameters[0].arg, returned.value.id
    for loop in ast.walk(function):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Attribute)
                and loop.iter.func.attr == "items" and isinstance(loop.iter.func.value, ast.Name)
                and loop.iter.func.value.id == mapping and isinstance(loop.target, ast.Tuple) and loop.target.elts
                and isinstance(loop.target.elts[0], ast.Name)):
            continue
        key = loop.target.elts[0].id
        for call in ast.walk(loop):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "setattr" and \
                    len(call.args) >= 2 and isinstance(call.args[0], ast.Name) and call.args[0].id == result and \
                    isinstance(call.args[1], ast.Name) and call.args[1].id == key:
                return True
    return False


_CONDITIONAL_STATEMENTS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith, ast.Match) \
    if hasattr(ast, "Match") else (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith)


def _runs_conditionally(parsed: _File, node: ast.AST, scope: ast.AST, line: int) -> bool:
    """Whether ``node`` sits in a branch, loop, ``try`` or ``with`` of ``scope`` that does not span ``line``."""
    current = parsed.parents.get(id(node))
    while current is not None and current is not scope:
        if isinstance(current, _CONDITIONAL_STATEMENTS) and not current.lineno <= line <= (current.end_lineno or 0):
            return True
        current = parsed.parents.get(id(current))
    return False


def _inside(parsed: _File, node: ast.AST, ancestor: ast.AST) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = parsed.parents.get(id(node))
    return False


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope``, with the functions, classes and lambdas nested in it but not their bodies."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _last_binding(scope: ast.AST, name: str, line: int) -> Optional[ast.AST]:
    """The last statement of ``scope`` (not of functions or classes nested in it) before ``line`` that binds
    ``name``: an assignment, a ``with ... as name``, an import, a def."""
    found: Optional[ast.AST] = None
    found_line = -1
    for node in _own_nodes(scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if getattr(node, "name", None) == name and node.lineno < line and node.lineno > found_line:
                found, found_line = node, node.lineno
            continue
        if getattr(node, "lineno", line) >= line:
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {name for t in targets for name in _bound_names(t)}
            if name in names and node.lineno > found_line and (not isinstance(node, ast.AnnAssign) or node.value):
                found, found_line = node, node.lineno
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if isinstance(item.optional_vars, ast.Name) and item.optional_vars.id == name and node.lineno > found_line:
                    found, found_line = item, node.lineno
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = {a.asname or (a.name if isinstance(node, ast.ImportFrom) else a.name.split(".")[0])
                     for a in node.names}
            if name in bound and node.lineno > found_line:
                found, found_line = node, node.lineno
    return found


def _attribute_assignment(function: ast.FunctionDef, owner: str, attribute: str, line: int) -> Optional[ast.AST]:
    """The value last assigned to ``owner.attribute`` in ``function`` (not in functions nested in it) before
    ``line``: ``self.args = args``; None when it assigns none (or only as part of an unpacking)."""
    found: Optional[ast.AST] = None
    found_line = -1
    for node in _own_nodes(function):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.lineno >= line or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Attribute) and t.attr == attribute and isinstance(t.value, ast.Name)
               and t.value.id == owner for t in targets) and node.lineno > found_line:
            found, found_line = node.value, node.lineno
    return found


def _base_name(node: ast.AST) -> Optional[str]:
    """The name a class statement gives its base (``Base`` of ``class Net(Base)`` or ``lib.Base``)."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _names_holding(tree: ast.AST, wanted) -> set[str]:
    """Names assigned (or looped over) from an expression with a node ``wanted`` accepts, or with such a name:
    the only callees worth following to what they are bound to."""
    bindings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            bindings.append(([n for t in node.targets for n in _bound_names(t)], node.value))
        elif isinstance(node, (ast.For, ast.comprehension)):
            bindings.append((list(_bound_names(node.target)), node.iter))
    found: set[str] = set()
    for _ in range(2):
        for names, value in bindings:
            if not set(names) <= found and any(wanted(n) or isinstance(n, ast.Name) and n.id in found
                                               for n in ast.walk(value)):
                found.update(names)
    return found


def _bound_names(target: ast.AST) -> Iterator[str]:
    """The names an assignment target rebinds: ``a`` and ``b`` of ``a, *b = ...``; none for ``args.cuda = ...``
    or ``cfg["x"] = ...`` (they change an object the name keeps)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _bound_names(element)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


def _argument_for(function: ast.FunctionDef, call: ast.Call, name: str, method: bool = False) -> Optional[ast.AST]:
    """The expression ``call`` passes to parameter ``name`` of ``function`` (a module-level function, or with
    ``method`` a constructor called through its class: ``self`` is not passed)."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]][1 if method else 0:]
    if name in positional:
        index = positional.index(name)
        plain = [a for a in call.args if not isinstance(a, ast.Starred)]
        if len(plain) == len(call.args) and index < len(plain):
            return plain[index]
    return None


def _parameter_default(function: ast.FunctionDef, name: str) -> Optional[ast.AST]:
    positional = [*function.args.posonlyargs, *function.args.args]
    defaults = function.args.defaults
    offset = len(positional) - len(defaults)
    for index, argument in enumerate(positional):
        if argument.arg == name and index >= offset:
            return defaults[index - offset]
    for argument, default in zip(function.args.kwonlyargs, function.args.kw_defaults):
        if argument.arg == name:
            return default
    return None


MAX_DATA_FILES = 400  # YAML / JSON files looked at per code tree for instantiation configs
_TARGET_KEYS = (("_target_", None), ("class_path", "init_args"))  # Hydra's instantiate; Lightning's CLI
_HYDRA_FLAGS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def _config_constructions(repository: Repository, defining: Path, name: str) -> list[Construction]:
    """The entries of the tree's YAML / JSON configs that instantiate the class: ``_target_: nets.mixer.Mixer``
    beside its arguments (Hydra), ``class_path:`` with ``init_args:`` (Lightning's CLI); a nested entry that
    names another class of the tree is that class, built the same way."""
    found: list[Construction] = []
    for path in repository.data_files():
        text = repository.text(path)
        if text is None or name not in text or not any(key in text for key, _ in _TARGET_KEYS):
            continue
        data = _load_data_file(path)
        relative = path.relative_to(repository.root).as_posix()
        stack = [data]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
                continue
            if not isinstance(node, dict):
                continue
            stack.extend(node.values())
            made = _instantiated(repository, node)
            if made is not None and made.cls.name == name and (repository.root / made.cls.path).resolve() == defining:
                found.append(Construction(relative, list(made.positional), dict(made.keywords), [relative]))
    return found


def _instantiated(repository: Repository, node: dict) -> Optional[Instance]:
    """The class of the tree a config entry instantiates, with its arguments (nested entries made the same
    way; an unresolved ``${...}`` interpolation is unknown); None when it names none."""
    for key, arguments_key in _TARGET_KEYS:
        dotted = node.get(key)
        if not isinstance(dotted, str) or "." not in dotted:
            continue
        module, _, cls_name = dotted.rpartition(".")
        module_path = repository.module_path(repository.root / "__init__.py", module)
        if module_path is None:
            return None
        arguments = node.get(arguments_key, {}) if arguments_key else \
            {k: v for k, v in node.items() if k not in _HYDRA_FLAGS}
        if not isinstance(arguments, dict):
            return None
        keywords = {}
        for argument, value in arguments.items():
            if isinstance(value, dict):
                value = _instantiated(repository, value) or value
            keywords[str(argument)] = UNKNOWN if isinstance(value, str) and "${" in value else value
        positional = node.get("_args_", []) if arguments_key is None else []
        return Instance(ClassRef(module_path.relative_to(repository.root).as_posix(), cls_name),
                        list(positional) if isinstance(positional, list) else [], keywords)
    return None


def _is_test_path(relative: str) -> bool:
    parts = relative.split("/")
    return any(p in ("tests", "test") for p in parts[:-1]) or parts[-1].startswith("test_")


def constructions(code_root: Path, path: str, name: str, repository: Optional[Repository] = None) -> list[Construction]:
    """The calls of class ``name`` (defined in ``path`` under ``code_root``) in the tree, best first: the most
    arguments evaluated, then those that show the model's input, scripts and factories before tests."""
    repository = repository or repository_for(code_root)
    defining = (repository.root / path).resolve()
    found: list[Construction] = []
    for site_path, parsed, call in repository.construction_calls(defining, name):
        evaluator = _Evaluator(repository)
        cls = parsed.enclosing_class(call)
        function = parsed.enclosing_function(call)
        if cls is not None and cls.name == name and not (function is not None and any(
                isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list)):
            continue  # the class building another instance of itself (a recursive tree): not a site
        positional = [UNKNOWN if isinstance(a, ast.Starred) else evaluator.value(site_path, parsed, a)
                      for a in call.args]
        if any(isinstance(a, ast.Starred) for a in call.args):
            positional = positional[:next(i for i, a in enumerate(call.args) if isinstance(a, ast.Starred))]
        keywords: dict = {}
        for keyword in call.keywords:
            value = evaluator.value(site_path, parsed, keyword.value)
            if keyword.arg is None:
                if isinstance(value, dict):
                    keywords.update({str(k): v for k, v in value.items()})
                continue
            keywords[keyword.arg] = value
        construction = Construction(f"{parsed.relative}:{call.lineno}", positional, keywords, evaluator.origins)
        if construction.known == 0:
            continue
        construction.inputs = _model_inputs(evaluator, site_path, parsed, call)
        found.append(construction)
    try:
        found += [c for c in _config_constructions(repository, defining, name) if c.known]
    except Exception:  # noqa: BLE001 - a config that cannot be read is no site
        pass
    # on a tie, a site whose code also calls the model with tensors it makes (a docstring example) gives the input too
    found.sort(key=lambda c: (-c.known, not c.inputs, _is_test_path(c.where.rsplit(":", 1)[0])))
    return found[:MAX_SITES]


def _model_inputs(evaluator: _Evaluator, path: Path, parsed: _File, call: ast.Call) -> list[tuple[list, dict]]:
    """What the code around the construction feeds the model: ``model = Net(...)`` (through ``.to(device)``
    and the like) then ``model(x, mask)`` with tensors it can evaluate (``x = torch.randn(2, 3, 32, 32)``)."""
    holder: ast.AST = call
    while isinstance(parsed.parents.get(id(holder)), (ast.Attribute, ast.Call)):
        holder = parsed.parents[id(holder)]
    statement = parsed.parents.get(id(holder))
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return []
    variable = _dotted(statement.targets[0])
    if variable is None:
        return []
    scope = parsed.enclosing_function(call) or parsed.tree
    inputs = []
    for node in ast.walk(scope):
        if not isinstance(node, ast.Call) or node.lineno <= statement.lineno:
            continue
        callee = _dotted(node.func)
        if callee not in (variable, f"{variable}.forward"):
            continue
        args = [evaluator.value(path, parsed, a) for a in node.args]
        kwargs = {k.arg: evaluator.value(path, parsed, k.value) for k in node.keywords if k.arg}
        if args and all(isinstance(a, TensorShape) for a in [*args, *kwargs.values()]):
            inputs.append((args, kwargs))
    return inputs


def argparse_defaults(code_root: Path, path: str) -> dict:
    """The argparse defaults of file ``path`` (``--log-interval 10`` -> ``{"log_interval": 10}``), those that could
    be evaluated; {} when the file defines no arguments."""
    repository = repository_for(code_root)
    file_path = (repository.root / path).resolve()
    parsed = repository.file(file_path)
    if parsed is None:
        return {}
    namespace = _Evaluator(repository)._argparse(file_path, parsed, 0)
    return {k: v for k, v in namespace.items() if v is not UNKNOWN}


MIN_SECTION_KEYS = 2  # a data file's mapping chosen by its keys alone must hold at least this many of the names
MAX_SECTION_DEPTH = 3  # mappings nested this deep in a data file are looked at


def data_file_sections(code_root: Path, names: list[str]) -> list[tuple[str, AttrDict]]:
    """The mappings of the tree's YAML / JSON files (a whole file or a section of one, ``waveglow_config:``) whose
    keys include every one of ``names``: the configuration a script reads from a file the command line names
    (``json.load(open(args.config))``, the option without a default) and hands the model whole (``Net(h)``,
    ``h.upsample_rates``) or unpacked (``Net(**cfg["net"])``). At least MIN_SECTION_KEYS names, so that a mapping
    is chosen by what the model reads, not by one common word. Smallest numbers first (the cheapest to check:
    any of them is one the repository runs with), then by file and place; ``where`` is ``file`` or
    ``file: a.b``."""
    wanted = [n for n in dict.fromkeys(names) if isinstance(n, str)]
    if len(wanted) < MIN_SECTION_KEYS:
        return []
    repository = repository_for(code_root)
    found: list[tuple[float, str, AttrDict]] = []
    for path in repository.data_files():
        text = repository.text(path)
        if text is None or not all(n in text for n in wanted):
            continue
        data = _load_data_file(path)
        relative = path.relative_to(repository.root).as_posix()
        stack: list[tuple[Any, list[str]]] = [(data, [])]
        while stack:
            value, place = stack.pop()
            if not isinstance(value, dict):
                continue
            if all(n in value for n in wanted):
                found.append((_numbers_size(value), relative + (f": {'.'.join(place)}" if place else ""), value))
            if len(place) < MAX_SECTION_DEPTH:
                stack.extend((v, [*place, str(k)]) for k, v in value.items() if isinstance(v, dict))
    found.sort(key=lambda f: (f[0], f[1]))
    return [(where, value) for _, where, value in found]


def argparse_namespaces(code_root: Path) -> list[tuple[str, dict]]:
    """Every file of the tree that defines command-line options, with its argparse defaults (UNKNOWN where an
    option has none): the namespaces a script may hand a model as its ``args`` / ``configs``."""
    repository = repository_for(code_root)
    if repository._namespaces is None:
        repository._namespaces = []
        for path in repository.python_files():
            text = repository.text(path)
            if text is None or "add_argument" not in text:
                continue
            parsed = repository.file(path)
            if parsed is None:
                continue
            namespace = _Evaluator(repository)._argparse(path, parsed, 0)
            if namespace:
                repository._namespaces.append((parsed.relative, dict(namespace)))
    return repository._namespaces


def constructor_fields(code_root: Path, path: str, name: str) -> dict:
    """What the constructor of class ``name`` (in ``path``) assigns to ``self.<field>``, evaluated statically: the
    fields of a configuration class whose constructor needs arguments the runner cannot give (a dataset folder it
    reads a class list from, an embedding file it loads). Its parameters are what the class's calls pass, else their
    defaults; a field chosen by a condition that cannot be evaluated takes the one arm that evaluates (``load(f) if
    embedding != "random" else None``: None, the configuration without the file). Fields that do not evaluate are
    left out (the builder guesses them by name)."""
    repository = repository_for(code_root)
    defining = (repository.root / path).resolve()
    parsed = repository.file(defining)
    if parsed is None:
        return {}
    cls = next((n for n in parsed.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    init = next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None) \
        if cls is not None else None
    if init is None or not init.args.args:
        return {}
    owner = init.args.args[0].arg
    evaluator = _Evaluator(repository)
    fields: dict = {}
    for node in _own_nodes(init):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == owner) or target.attr in fields:
                continue
            assigned = _attribute_assignment(init, owner, target.attr, 10 ** 9)
            if isinstance(assigned, ast.Call) and parsed.qualified(assigned.func) == "torch.device":
                fields[target.attr] = RUN_DEVICE  # chosen where it runs (cuda when available): the runner's
                continue
            value = evaluator.value(defining, parsed, assigned)
            if value is UNKNOWN and isinstance(assigned, ast.IfExp):
                arms = [evaluator.value(defining, parsed, arm) for arm in (assigned.body, assigned.orelse)]
                known = [arm for arm in arms if arm is not UNKNOWN]
                value = known[0] if len(known) == 1 else UNKNOWN
            if value is not UNKNOWN and not isinstance(value, (_ModuleRef, _OpenFile, Typed)):
                fields[target.attr] = value
    return fields


class _RunDevice:
    def __repr__(self) -> str:
        return "RUN_DEVICE"


RUN_DEVICE = _RunDevice()  # a field the code sets to the device it runs on: the builder gives its own


_REPOSITORIES: dict[Path, Repository] = {}


def repository_for(code_root: Path) -> Repository:
    """One parsed view per code tree and process (a worker builds every target of one revision)."""
    root = Path(code_root).resolve()
    if root not in _REPOSITORIES:
        _REPOSITORIES.clear()
        _REPOSITORIES[root] = Repository(root)
    return _REPOSITORIES[root]
