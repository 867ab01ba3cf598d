"""Packages the runner lacks, imported as stand-ins when the file only needs them inside its functions.

A model file often imports what its training script needs (``from torchvision import datasets``,
``from PIL import ImageFilter``) next to a model that never touches it. Importing such a file with a
stand-in in place of the missing package lets the model build; the first real use of the stand-in
(a call, a subclass, iteration) raises ``MissingPackageError``, and the target is skipped as needing the
package, exactly as it would be without stand-ins. Stand-ins live in ``sys.modules`` only while the file
is imported, so later ``try: import X / except ImportError`` code still sees the package missing.
"""
from __future__ import annotations

import ast
import contextlib
import dis
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Callable, Iterable, Iterator, Optional


class MissingPackageError(ModuleNotFoundError):
    """The PR's code used a package the runner does not have."""


def _missing(name: str, module: Optional[str] = None) -> MissingPackageError:
    top = name.split(".")[0]
    if module and "." in module:  # a module an installed package does not have (see ``absent_module``)
        return MissingPackageError(f"{name} is used, but the installed package '{top}' has no module '{module}' (a "
                                   "module of another release of it)", name=module)
    return MissingPackageError(f"{name} is used, but the package '{top}' is not installed on the smoke runner",
                               name=top)


def absent_module(name: str) -> str:
    """What to stand in for when importing the dotted module ``name`` failed: its top-level package when that is not
    installed; the module itself when the package is installed but has no such module (an API another release
    of the package had: ``from scipy.sparse.linalg.eigen.arpack import eigsh`` against a SciPy that moved it), so
    that the rest of the installed package stays real."""
    top = name.split(".")[0]
    if "." not in name:
        return top
    try:
        installed = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        installed = False
    return name if installed else top


def _covers(packages: Iterable[str], fullname: str) -> Optional[str]:
    """The package (or dotted module) of ``packages`` that ``fullname`` is or lies under."""
    return next((p for p in packages if fullname == p or fullname.startswith(p + ".")), None)


class StandIn(types.ModuleType):
    """Any attribute is another stand-in; any use other than naming it raises ``MissingPackageError``."""

    _standing_for: Optional[str] = None  # the package or module it stands in for (a child: its parent's)

    def __getattr__(self, attribute: str) -> "StandIn":
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)  # protocols probed by inspect, copy, pickle... are absent
        if attribute == "_standing_for":
            return None
        child = StandIn(f"{self.__name__}.{attribute}")
        child._standing_for = self._standing_for
        setattr(self, attribute, child)
        return child

    def __call__(self, *args, **kwargs):
        for substitute in reversed(_SUBSTITUTES):
            found = substitute(self.__name__)
            if found is not None:  # what the runner has in the package's place while a step runs
                return found(*args, **kwargs)
        if _discarded_at_import(sys._getframe(1)):
            return None  # ``plotting.use("Agg")`` as a statement of the module: a setting nothing here reads
        raise _missing(self.__name__, self._standing_for)

    def __mro_entries__(self, bases):  # class Net(missing.Base): the class cannot exist without the package
        raise _missing(self.__name__, self._standing_for)

    def __iter__(self):
        raise _missing(self.__name__, self._standing_for)

    def __getitem__(self, key):
        raise _missing(self.__name__, self._standing_for)

    def __instancecheck__(self, instance) -> bool:  # nothing is an instance of a class that is not installed
        return False

    def __subclasscheck__(self, subclass) -> bool:
        return False


def _discarded_at_import(frame: Optional[types.FrameType]) -> bool:
    """Whether ``frame`` runs a module's own top-level code and the call it is making is a statement of its own,
    its result thrown away (``plotting.use("Agg")``, ``tracker.login()``): a setting of the missing package that the
    model cannot read back without using the package again, where the first real use still raises. Read from the
    frame's bytecode: the instruction after the call pops its result."""
    if frame is None or frame.f_code.co_name != "<module>":
        return False
    # only while the module is being imported (importlib marks its spec ``_initializing``): a script's main block
    # the runner executes as a step reports such statements itself (``script_steps``: "statements that only call")
    if not getattr(frame.f_globals.get("__spec__"), "_initializing", False):
        return False
    try:
        instructions = [i for i in dis.get_instructions(frame.f_code) if i.opname != "CACHE"]
    except Exception:  # noqa: BLE001 - unreadable code: the use counts, as before
        return False
    at = [i for i in instructions if i.offset <= frame.f_lasti]
    after = [i for i in instructions if i.offset > frame.f_lasti]
    return bool(at) and at[-1].opname.startswith("CALL") and bool(after) and after[0].opname == "POP_TOP"


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, packages: Iterable[str]):
        self.packages = set(packages)

    def find_spec(self, fullname, path=None, target=None):
        if _covers(self.packages, fullname):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _stand_in_module(spec.name, _covers(self.packages, spec.name))

    def exec_module(self, module):
        pass


def _stand_in_module(name: str, standing_for: Optional[str]) -> StandIn:
    module = StandIn(name)
    module.__path__ = []
    module._standing_for = standing_for
    return module


_SUBSTITUTES: list[Callable[[str], Optional[Callable]]] = []


@contextlib.contextmanager
def substituted(lookup: Callable[[str], Optional[Callable]]) -> Iterator[None]:
    """Within the block, calling a stand-in whose dotted name ``lookup`` knows calls what it returns instead of
    raising (``gpu_runner.vision_data``: torchvision's data sets and transforms on synthetic images)."""
    _SUBSTITUTES.append(lookup)
    try:
        yield
    finally:
        _SUBSTITUTES.remove(lookup)


@contextlib.contextmanager
def stand_ins(packages: Iterable[str]) -> Iterator[None]:
    """Within the block, importing any of ``packages`` (or their submodules) gives stand-ins. A dotted name is a
    module an installed package lacks (``absent_module``): it is registered as it is, since the import system would
    not ask a finder for a child of a parent that is a real module and not a package."""
    finder = _StandInFinder(packages)
    sys.meta_path.insert(0, finder)
    for name in finder.packages:
        if "." in name and name not in sys.modules:
            sys.modules[name] = _stand_in_module(name, name)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if _covers(finder.packages, n)]:
            if isinstance(sys.modules[name], StandIn):
                del sys.modules[name]


def missing_package(exc: BaseException) -> Optional[str]:
    """The package a stand-in reported missing, anywhere in ``exc``'s chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MissingPackageError):
            return exc.name
        exc = exc.__cause__ or exc.__context__
    return None


def _bound_names(node: ast.stmt, missing: str) -> set[str]:
    """The names an import statement binds to ``missing`` or its submodules."""
    names = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == missing:
                names.add(alias.asname or alias.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
            and node.module.split(".")[0] == missing:
        names |= {alias.asname or alias.name for alias in node.names}
    return names


def _root(node: ast.AST) -> ast.AST:
    """``a`` of ``a.b.c``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _is_main_guard(statement: ast.stmt) -> bool:
    test = statement.test if isinstance(statement, ast.If) else None
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" \
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)


def used_when_imported(tree: ast.Module, missing: str) -> bool:
    """Whether the module's own top-level code (not the bodies of its functions) uses a name bound to the
    package ``missing``: a call at import time whose result is kept, a base class, a decorator, a default value.
    A call that is a statement of its own (``plotting.use("Agg")``) is not a use: the stand-in lets it pass
    (``_discarded_at_import``), though its arguments still count. Annotations count unless ``from __future__
    import annotations`` makes them strings. ``import *`` counts as a use."""
    bound: set[str] = set()
    lazy_annotations = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                           and any(a.name == "annotations" for a in n.names) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names) \
                    and node.level == 0 and (node.module or "").split(".")[0] == missing:
                return True
            bound |= _bound_names(node, missing)
    if not bound:
        return False

    def executed(node: ast.AST, in_class: bool = False) -> Iterator[ast.AST]:
        """The nodes evaluated when the module runs: function bodies and lazy annotations are left out, and the
        callee of a call whose result the module's own code throws away."""
        yield node
        if not in_class and isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(_root(node.value.func), ast.Name):
            for part in [*node.value.args, *node.value.keywords]:
                yield from executed(part)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            parts: list[ast.AST] = list(arguments.defaults) + [d for d in arguments.kw_defaults if d is not None]
            if not isinstance(node, ast.Lambda):
                parts += node.decorator_list
                if not lazy_annotations:
                    parts += [a.annotation for a in arguments.args + arguments.kwonlyargs if a.annotation]
                    parts += [node.returns] if node.returns else []
            for part in parts:
                yield from executed(part, in_class)
            return
        for child in ast.iter_child_nodes(node):
            if lazy_annotations and isinstance(node, ast.AnnAssign) and child is node.annotation:
                continue
            yield from executed(child, in_class or isinstance(node, ast.ClassDef))

    for statement in tree.body:
        if _is_main_guard(statement):  # the runner imports the file, it does not run it as a script
            continue
        for node in executed(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound:
                return True
    return False
