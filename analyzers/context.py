"""Shared per-file metadata that every rule reads during the one traversal.

libcst's QualifiedNameProvider/ScopeProvider/PositionProvider cost several times the parse
itself, so this module keeps its own cheaper equivalents:

* an import table that resolves names through every import form and alias
  (``import torch as th``, ``from torch import nn``, ``import torch.nn.functional as F``...);
* scope-aware "last assignment" bindings, maintained in source order as the walk proceeds;
* stacks of the enclosing functions, classes, loops and ``with`` blocks;
* a parent map, and positions computed afterwards only for nodes that are reported.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, TypeVar, Union

import libcst as cst

FunctionNode = Union[cst.FunctionDef, cst.Lambda]
LoopNode = Union[cst.For, cst.While]
# Comprehensions iterate too: a call inside one runs once per element.
ComprehensionNode = Union[cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp]


def dotted_name(expr: Optional[cst.CSTNode]) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None (calls, subscripts...)."""
    parts: list[str] = []
    while type(expr) in _ATTRIBUTES:  # isinstance, by set: every rule asks this of most nodes it sees
        parts.append(expr.attr.value)
        expr = expr.value
    if type(expr) in _NAMES:
        parts.append(expr.value)
        return ".".join(reversed(parts))
    return None


def call_receiver(call: cst.Call) -> Optional[cst.BaseExpression]:
    """For ``x.y.step()`` the expression ``x.y``; None for plain function calls."""
    func = call.func
    return func.value if isinstance(func, cst.Attribute) else None


def method_name(call: cst.Call) -> Optional[str]:
    """For ``anything.step(...)`` the string ``"step"``; for ``f(...)`` the name ``"f"``."""
    func = call.func
    if type(func) in _ATTRIBUTES:
        return func.attr.value
    if type(func) in _NAMES:
        return func.value
    return None


def keyword_arg(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def argument(call: cst.Call, position: int, name: str) -> Optional[cst.BaseExpression]:
    """The value passed for a parameter, by keyword or by position."""
    kw = keyword_arg(call, name)
    if kw is not None:
        return kw.value
    positional = positional_args(call)
    if position < len(positional):
        return positional[position].value
    return None


def is_true(expr: Optional[cst.BaseExpression]) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


def is_false(expr: Optional[cst.BaseExpression]) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


def literal_bool(expr: Optional[cst.BaseExpression]) -> Optional[bool]:
    """``True`` / ``False`` for those literals, None for anything else."""
    return True if is_true(expr) else False if is_false(expr) else None


# ---- children, cheaply ---------------------------------------------------------------------------
# libcst's ``node.children`` rebuilds the node through a visitor on every call (~50 us). The engine's
# walk and the helpers below read the fields directly instead.

# Fields that only hold whitespace, punctuation or operators: no rule needs to visit them, and
# skipping them halves the number of nodes walked.
SKIPPED_FIELDS = {
    "lpar", "rpar", "comma", "colon", "first_colon", "second_colon", "semicolon", "equal", "dot",
    "leading_lines", "lines_after_decorators", "header", "footer", "empty_lines", "trailing_whitespace",
    "newline", "asynchronous", "lbrace", "rbrace", "lbracket", "rbracket", "operator", "posonly_ind",
    "trailing_comma", "default_indent", "default_newline", "encoding", "has_trailing_newline", "indent",
    "leading_whitespace", "relative", "separator", "comment", "whitespace", "first_line", "last_line",
    "star",
}
# Where libcst's field order is not the order the code runs in (decorators, keyword=value...).
_FIELD_ORDER = {
    cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "bases", "keywords", "body"),
    cst.Arg: ("keyword", "value"),
    cst.ListComp: ("for_in", "elt"),
    cst.SetComp: ("for_in", "elt"),
    cst.GeneratorExp: ("for_in", "elt"),
    cst.DictComp: ("for_in", "key", "value"),
}


class _PerType(dict):
    """node type -> what ``compute`` says of it, computed on the first lookup; ``table[type(node)]`` in hot loops
    (an empty answer, for ``Pass`` or a whitespace node, is kept like any other)."""

    def __init__(self, compute) -> None:
        super().__init__()
        self.compute = compute

    def __missing__(self, node_type: type) -> tuple[str, ...]:
        found = self[node_type] = self.compute(node_type)
        return found


def _all_node_types() -> set[type]:
    found: set[type] = set()
    todo = [cst.CSTNode]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


NODE_TYPES = _all_node_types()  # a set lookup: isinstance against the CSTNode ABC is slow
# ``isinstance(x, cst.Attribute)`` and ``cst.Name`` the same way (libcst's nodes are ABCs: isinstance is slow)
_ATTRIBUTES = frozenset(t for t in NODE_TYPES if issubclass(t, cst.Attribute))
_NAMES = frozenset(t for t in NODE_TYPES if issubclass(t, cst.Name))


def _code_fields(node_type: type) -> tuple[str, ...]:
    """The fields of ``node_type`` that hold code (not whitespace or punctuation), in the order it runs."""
    import dataclasses

    names = _FIELD_ORDER.get(node_type)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(node_type)
                      if f.name not in SKIPPED_FIELDS and not f.name.startswith("whitespace"))
    return names


CHILD_FIELDS: dict[type, tuple[str, ...]] = _PerType(_code_fields)


def code_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes that hold code, in the order the code runs (not always the order it is written:
    a comprehension's ``for`` comes first); no whitespace, punctuation or operator nodes."""
    node_types = NODE_TYPES
    found = []
    for name in CHILD_FIELDS[type(node)]:
        value = getattr(node, name)
        value_type = type(value)
        if value_type in node_types:
            found.append(value)
        elif value_type is tuple or value_type is list:
            found.extend([v for v in value if type(v) in node_types])
    return found


# Every field of a node type that libcst's ``children`` visits, whitespace and punctuation included, in its order:
# read once per type from the field names its ``_visit_and_replace_children`` passes to ``visit_*`` (string
# constants, in source order), so ``all_children`` returns what ``node.children`` does without a visitor.
def _lexical_fields(node_type: type) -> tuple[str, ...]:
    import dataclasses

    fields = {f.name for f in dataclasses.fields(node_type)}
    names: list[str] = []
    for const in node_type._visit_and_replace_children.__code__.co_consts:
        if type(const) is str and const in fields and const not in names:
            names.append(const)
    return tuple(names)


_LEXICAL_FIELDS: dict[type, tuple[str, ...]] = _PerType(_lexical_fields)


def all_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node.children`` (every child node, whitespace and punctuation too, in lexical order), read from the
    fields directly: libcst rebuilds the node through a visitor to answer."""
    node_types = NODE_TYPES
    found = []
    for name in _LEXICAL_FIELDS[type(node)]:
        value = getattr(node, name)
        value_type = type(value)
        if value_type in node_types:
            found.append(value)
        elif value_type is tuple or value_type is list:
            found.extend([v for v in value if type(v) in node_types])
    return found


# The fields of a node type that hold code (``CHILD_FIELDS``), in the order they are written (``_LEXICAL_FIELDS``):
# ``a if t else b`` lists ``a`` first here, ``t`` first there.
SOURCE_CODE_FIELDS: dict[type, tuple[str, ...]] = _PerType(
    lambda node_type: tuple(name for name in _LEXICAL_FIELDS[node_type] if name in CHILD_FIELDS[node_type]))


def code_children_as_written(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``code_children`` in the order the code is written: ``all_children`` less whitespace and punctuation."""
    node_types = NODE_TYPES
    found = []
    for name in SOURCE_CODE_FIELDS[type(node)]:
        value = getattr(node, name)
        value_type = type(value)
        if value_type in node_types:
            found.append(value)
        elif value_type is tuple or value_type is list:
            found.extend([v for v in value if type(v) in node_types])
    return found


def iter_names(expr: cst.CSTNode) -> Iterator[str]:
    """Every dotted name used anywhere inside ``expr`` (cheap manual walk, no visitor)."""
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        name = dotted_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if name is not None:
            yield name
            if isinstance(node, cst.Attribute):
                # also yield the prefixes: ``x.grad`` uses ``x``
                continue
        else:
            stack.extend(code_children(node))


def uses_name(expr: cst.CSTNode, name: str) -> bool:
    """``name`` is used in ``expr`` as a variable, an attribute, a keyword or a function it calls
    (``p.requires_grad``, ``isinstance(x, T)``), never because a string or a comment spells it."""
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name) and node.value == name:
            return True
        stack.extend(code_children(node))
    return False


def string_value(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    if isinstance(expr, cst.SimpleString):
        try:
            value = expr.evaluated_value
        except Exception:  # pragma: no cover - odd prefixes
            return None
        return value if isinstance(value, str) else None
    return None


def short(ctx: "FileContext", node: cst.CSTNode, limit: int = 60) -> str:
    """A node's source on one line, cut to ``limit`` characters: how messages quote code."""
    text = " ".join(ctx.module.code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def local_name_for(ctx: "FileContext", qualified: str) -> Optional[str]:
    """A local name that the file's imports bind to ``qualified`` (and nothing rebinds), if any."""
    candidates = [local for local, target in ctx.imports.names.items() if target == qualified]
    candidates.sort(key=lambda n: (n != qualified.rsplit(".", 1)[-1], len(n)))
    for local in candidates:
        binding = ctx.binding(local)
        if binding is None or binding.kind == "import":
            return local
    return None


@dataclass
class Binding:
    """One assignment to a name (or dotted attribute target such as ``self.opt``)."""

    value: Optional[cst.BaseExpression]  # None when the value is not a single expression
    node: cst.CSTNode  # the statement/target node that assigned it
    kind: str  # assign | augassign | annassign | for | with | param | import | def | walrus
    loop: Optional[LoopNode]  # innermost loop (in the same function) at the assignment
    # the binding this one replaced in the same scope: ``D = D.to(device)`` reads the previous ``D``
    previous: Optional["Binding"] = None
    # ``out, h = model(x)``: the call a tuple target was unpacked from, and this name's position in it
    unpacked_from: Optional[cst.BaseExpression] = None
    element: Optional[int] = None
    # when it was recorded, in the walk's source order: a name read inside this binding's value sees only
    # bindings of a lower order (``model = model.to(d)`` reads the ``model`` before it, never itself)
    order: int = 0


@dataclass
class Scope:
    node: Optional[cst.CSTNode]  # FunctionDef / ClassDef / Lambda, None for the module
    bindings: dict[str, Binding] = field(default_factory=dict)


class ImportTable:
    """Maps local names to fully qualified ones from a file's import statements."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.modules: set[str] = set()  # every module imported from, fully qualified
        self.star_modules: set[str] = set()
        self.has_star = False  # any ``from m import *``, a relative one included

    def add(self, node: Union[cst.Import, cst.ImportFrom]) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted_name(alias.name)
                if full is None:
                    continue
                self.modules.add(full)
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.names[alias.asname.name.value] = full
                else:
                    head = full.split(".", 1)[0]
                    self.names[head] = head
            return
        if isinstance(node.names, cst.ImportStar):
            self.has_star = True
        if node.relative:
            return  # project-local modules: never torch/sklearn
        module = dotted_name(node.module) if node.module is not None else None
        if module is None:
            return
        self.modules.add(module)
        if isinstance(node.names, cst.ImportStar):
            self.star_modules.add(module)
            return
        for alias in node.names:
            name = dotted_name(alias.name)
            if name is None:
                continue
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.names[local] = f"{module}.{name}"
            self.modules.add(f"{module}.{name}")

    def imports_root(self, root: str) -> bool:
        prefix = root + "."
        return any(m == root or m.startswith(prefix) for m in self.modules)

    def resolve(self, dotted: str) -> Optional[str]:
        head, _, rest = dotted.partition(".")
        target = self.names.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target


def _collect_module_imports(module: cst.Module, table: ImportTable) -> None:
    """Imports anywhere outside functions and classes (``try: import torch`` included).

    Walks statements only, never expressions, so it costs next to nothing. Imports inside
    functions are added during the main walk, before the code after them is visited.
    """
    stack: list[cst.CSTNode] = list(reversed(module.body))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    table.add(small)
        elif isinstance(stmt, (cst.If, cst.Try, cst.TryStar, cst.With, cst.For, cst.While, cst.Else,
                               cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)):
            body = stmt.body
            children = list(body.body) if isinstance(body, (cst.IndentedBlock, cst.SimpleStatementSuite)) else []
            for attr in ("orelse", "finalbody"):
                extra = getattr(stmt, attr, None)
                if extra is not None:
                    children.append(extra)
            children.extend(getattr(stmt, "handlers", ()))
            stack.extend(reversed(children))


_Fact = TypeVar("_Fact")


class FileContext:
    """Everything a rule may ask about the file and the node being visited."""

    def __init__(self, path: str, source: str, module: cst.Module) -> None:
        self.path = path
        self.source = source
        self.module = module
        self.imports = ImportTable()
        _collect_module_imports(module, self.imports)
        self._star_names: dict[str, Optional[str]] = {}
        self.parents: dict[int, cst.CSTNode] = {}  # id(node) -> parent: libcst hashes nodes in Python, ids hash in C
        self.walked = False  # the engine's walk is over: ``parents`` holds every code node of the module
        # Enclosing structure, innermost last. Maintained by the engine's walker.
        self.functions: list[FunctionNode] = []
        self.classes: list[cst.ClassDef] = []
        self.loops: list[LoopNode | ComprehensionNode] = []  # only loops whose *body* we are in
        self.withs: list[cst.With] = []  # only ``with`` blocks whose body we are in
        self.scopes: list[Scope] = [Scope(None)]
        self.class_attributes: list[dict[str, Binding]] = []  # ``self.x = ...`` per enclosing class
        # id(value expression) -> the binding it was assigned through; the bindings recorded so far
        self._binding_of_value: dict[int, Binding] = {}
        self._bindings_recorded = 0
        # Every loop's enclosing function (None at module level), for "same function" checks.
        self.loop_function: dict[cst.CSTNode, Optional[FunctionNode]] = {}
        self._facts: dict[type, object] = {}
        self._last_qualified: tuple = (None, None)
        # the rest of the code base (analyzers.program.modules.RepositoryIndex), when the file has one
        self.repository = None

    def release(self) -> None:
        """Forget the facts once the file is analyzed (each holds this context: a cycle through the whole tree)."""
        self._facts.clear()

    def facts(self, kind: type[_Fact]) -> _Fact:
        """The program model's ``kind`` of facts about this file (built once, on first use, by any rule)."""
        found = self._facts.get(kind)
        if found is None:
            found = self._facts[kind] = kind(self)
        return found  # type: ignore[return-value]

    # ---- names -------------------------------------------------------------------------
    def qualified_name(self, expr: Optional[cst.CSTNode]) -> Optional[str]:
        """Fully qualified name of a Name/Attribute chain through the file's imports.

        ``th.nn.functional.softmax`` → ``torch.nn.functional.softmax`` after ``import torch as th``;
        also follows simple module aliases assigned in the file (``F = torch.nn.functional``).
        Returns None for names that were not imported (locals, builtins...).
        """
        if expr is self._last_qualified[0] and expr is not None:
            return self._last_qualified[1]  # several rules ask about the same call in one visit
        found = self._qualified_name(expr)
        self._last_qualified = (expr, found)
        return found

    def _qualified_name(self, expr: Optional[cst.CSTNode]) -> Optional[str]:
        dotted = dotted_name(expr)
        if dotted is None:
            return None
        resolved = self.imports.resolve(dotted)
        if resolved is not None:
            return resolved
        head, _, rest = dotted.partition(".")
        binding = self.binding(head)
        if binding is not None and binding.kind == "assign" and isinstance(binding.value, (cst.Name, cst.Attribute)):
            target = self.imports.resolve(dotted_name(binding.value) or "")
            if target is not None:
                return f"{target}.{rest}" if rest else target
        if binding is None and self.imports.has_star and self.repository is not None:
            target = self._star_imported(head)  # ``from .utils import *`` where utils does ``import numpy as np``
            if target is not None:
                return f"{target}.{rest}" if rest else target
        return None

    def _star_imported(self, name: str) -> Optional[str]:
        if name not in self._star_names:
            from analyzers.program.modules import ModuleFacts  # the program model imports this module

            self._star_names[name] = self.facts(ModuleFacts).star_imported(name)
        return self._star_names[name]

    def names_changed(self) -> None:
        """Scopes, bindings or imports changed: forget the last answer of ``qualified_name``."""
        self._last_qualified = (None, None)

    def call_name(self, call: cst.Call) -> Optional[str]:
        """Qualified name of the called function, e.g. ``torch.load``; None if not imported."""
        return self.qualified_name(call.func)

    def uses_torch(self) -> bool:
        return self.imports.imports_root("torch") or self.imports.imports_root("lightning") or \
            self.imports.imports_root("pytorch_lightning")

    # ---- structure ---------------------------------------------------------------------
    @property
    def function(self) -> Optional[FunctionNode]:
        return self.functions[-1] if self.functions else None

    @property
    def function_def(self) -> Optional[cst.FunctionDef]:
        for fn in reversed(self.functions):
            if isinstance(fn, cst.FunctionDef):
                return fn
        return None

    @property
    def class_def(self) -> Optional[cst.ClassDef]:
        return self.classes[-1] if self.classes else None

    @property
    def loop(self) -> Optional[LoopNode | ComprehensionNode]:
        """Innermost loop whose body encloses the current node, within the current function."""
        if not self.loops:
            return None
        innermost = self.loops[-1]
        return innermost if self.loop_function.get(innermost) is self.function else None

    def loops_in_function(self) -> list[LoopNode | ComprehensionNode]:
        fn = self.function
        return [lp for lp in self.loops if self.loop_function.get(lp) is fn]

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parents.get(id(node))
        while current is not None:
            yield current
            current = self.parents.get(id(current))

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The simple statement (or compound statement header) that contains ``node``."""
        current = node
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            current = self.parents.get(id(current))
        return current if current is not None else node

    def inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        return any(a is ancestor for a in self.ancestors(node))

    def class_bases(self, cls: Optional[cst.ClassDef] = None) -> list[str]:
        """Qualified (or, failing that, dotted) names of a class's bases."""
        cls = cls or self.class_def
        if cls is None:
            return []
        names = []
        for base in cls.bases:
            names.append(self.qualified_name(base.value) or dotted_name(base.value) or "")
        return names

    def is_module_subclass(self, cls: Optional[cst.ClassDef] = None) -> bool:
        """True for ``class X(nn.Module)`` / Lightning modules / subclasses of a module class in this file."""
        cls = cls or self.class_def
        if cls is None:
            return False
        for base in self.class_bases(cls):
            if base in MODULE_BASES or base.startswith("torch.nn.") and base.rsplit(".", 1)[-1][:1].isupper():
                return True
            if base in self.module_classes_in_file:
                return True
        return False

    @property
    def python_tree(self) -> Optional[ast.Module]:
        """The file's ``ast`` tree, parsed once and shared (read it, never change it); None where Python's own
        parser refuses what libcst read."""
        try:
            return parse_ast(self.source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None

    @property
    def module_classes_in_file(self) -> set[str]:
        cached = getattr(self, "_module_classes", None)
        if cached is None:
            cached = set()
            self._module_classes = cached  # filled lazily below, classes referencing earlier ones
            for stmt in self.module.body:
                if isinstance(stmt, cst.ClassDef):
                    for base in stmt.bases:
                        name = self.qualified_name(base.value) or dotted_name(base.value) or ""
                        if name in MODULE_BASES or name in cached or (
                            name.startswith("torch.nn.") and name.rsplit(".", 1)[-1][:1].isupper()
                        ):
                            cached.add(stmt.name.value)
                            break
        return cached

    def decorators_of(self, fn: Optional[FunctionNode]) -> list[str]:
        if not isinstance(fn, cst.FunctionDef):
            return []
        out = []
        for dec in fn.decorators:
            expr = dec.decorator.func if isinstance(dec.decorator, cst.Call) else dec.decorator
            out.append(self.qualified_name(expr) or dotted_name(expr) or "")
        return out

    def in_context_manager(self, *qualified: str) -> bool:
        """Inside ``with <one of qualified>(...):`` or a function decorated with one of them."""
        wanted = set(qualified)
        for with_node in self.withs:
            for item in with_node.items:
                call = item.item if isinstance(item.item, cst.Call) else None
                expr = call.func if call is not None else item.item
                name = self.qualified_name(expr)
                if name in wanted:
                    if name == "torch.set_grad_enabled" and call is not None and is_true(argument(call, 0, "mode")):
                        continue  # set_grad_enabled(True) enables grad
                    return True
        for fn in self.functions:
            if any(d in wanted for d in self.decorators_of(fn)):
                return True
        return False

    def in_no_grad(self) -> bool:
        return self.in_context_manager(*NO_GRAD_CONTEXTS)

    # ---- dataflow ------------------------------------------------------------------------
    def binding(self, name: str, at: Optional[cst.CSTNode] = None) -> Optional[Binding]:
        """The latest assignment (before the current point) of a name or ``self.attr`` target; with ``at``, the
        one visible where that node stands: a name read inside an assignment's value, however the program model
        reached it, sees only what was bound before that assignment. Following values from binding to binding
        therefore always goes back in the source and ends (``x = x.to(d)``, ``a = b; b = a``)."""
        horizon = self._horizon(at) if at is not None else None
        for scope in reversed(self.scopes):
            found = _before(scope.bindings.get(name), horizon)
            if found is not None:
                return found
            if scope.node is not None and isinstance(scope.node, cst.ClassDef):
                continue  # class bodies do not enclose their methods' names
        if name.startswith("self.") and self.class_attributes:
            return _before(self.class_attributes[-1].get(name), horizon)
        return None

    def _horizon(self, node: cst.CSTNode) -> Optional[int]:
        """The order of the innermost recorded binding whose value holds ``node``, if any."""
        by_value = self._binding_of_value
        if not by_value:
            return None
        parents = self.parents
        current: Optional[cst.CSTNode] = node
        while current is not None:
            found = by_value.get(id(current))
            if found is not None and found.value is current:
                return found.order
            current = parents.get(id(current))
        return None

    def assigned_value(self, name_or_expr: Union[str, cst.CSTNode, None]) -> Optional[cst.BaseExpression]:
        """Where ``name`` was last assigned from (the value expression), if known. Given the expression itself,
        the assignment visible where it stands (see :meth:`binding`)."""
        if isinstance(name_or_expr, str):
            name, at = name_or_expr, None
        else:
            name, at = dotted_name(name_or_expr), name_or_expr
        if name is None:
            return None
        binding = self.binding(name, at)
        return binding.value if binding is not None else None

    def origin(self, expr: Optional[cst.BaseExpression], depth: int = 4) -> Optional[cst.BaseExpression]:
        """Follow plain name-to-name assignments to the expression that produced a value."""
        seen = 0
        while expr is not None and seen < depth and isinstance(expr, (cst.Name, cst.Attribute)):
            value = self.assigned_value(expr)
            if value is None:
                return expr
            expr = value
            seen += 1
        return expr

    def origin_call_name(self, expr: Optional[cst.BaseExpression]) -> Optional[str]:
        """``torch.optim.Adam`` for ``opt`` after ``opt = optim.Adam(...)``; None if unknown."""
        value = self.origin(expr)
        if isinstance(value, cst.Call):
            return self.call_name(value)
        return None

    def record_binding(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression],
                       node: cst.CSTNode, kind: str) -> None:
        self._last_qualified = (None, None)
        loop = self.loop
        loop = loop if isinstance(loop, (cst.For, cst.While)) else None
        if isinstance(target, (cst.Tuple, cst.List)):
            values = None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
                values = [e.value for e in value.elements]
            for i, element in enumerate(target.elements):
                self.record_binding(element.value, values[i] if values else None, node, kind)
                if values is None and isinstance(value, cst.Call) and isinstance(element.value, (cst.Name,
                                                                                                 cst.Attribute)):
                    unpacked = self.binding(dotted_name(element.value) or "")
                    if unpacked is not None and unpacked.node is node:
                        unpacked.unpacked_from, unpacked.element = value, i
            return
        if isinstance(target, cst.StarredElement):
            self.record_binding(target.value, None, node, kind)
            return
        name = dotted_name(target)
        if name is None:
            return
        self._bindings_recorded += 1
        binding = Binding(value, node, kind, loop, self.scopes[-1].bindings.get(name), order=self._bindings_recorded)
        self.scopes[-1].bindings[name] = binding
        if value is not None:
            self._binding_of_value[id(value)] = binding
        if name.startswith("self.") and self.class_attributes:
            self.class_attributes[-1][name] = binding

    # ---- positions -----------------------------------------------------------------------
    def positions(self, nodes: Iterable[cst.CSTNode]) -> dict[cst.CSTNode, "cst.metadata.CodeRange"]:
        """Positions for the given nodes only; one code generation pass over the module."""
        return compute_positions(self.module, set(nodes), self.parents, self.source)


def _before(binding: Optional[Binding], horizon: Optional[int]) -> Optional[Binding]:
    """``binding`` or the first of the bindings it replaced that was recorded before ``horizon``."""
    if horizon is not None:
        while binding is not None and binding.order >= horizon:
            binding = binding.previous
    return binding


MODULE_BASES = {
    "torch.nn.Module",
    "torch.nn.modules.module.Module",
    "torch.nn.modules.Module",
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "pytorch_lightning.LightningModule",
    "pytorch_lightning.core.LightningModule",
    "pytorch_lightning.core.module.LightningModule",
}

NO_GRAD_CONTEXTS = (
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
    "torch.set_grad_enabled",  # only counts when its argument is not literally True
)


def compute_positions(module: cst.Module, wanted: set[cst.CSTNode],
                      parents: Optional[dict] = None, source: Optional[str] = None) -> dict[cst.CSTNode, "cst.metadata.CodeRange"]:
    """Positions of ``wanted``. With the parent map and the source, only the top-level statements that
    hold those nodes are generated again (a finding in a 10,000-line file costs its class or function,
    not the file); anything that does not line up falls back to one pass over the whole module."""
    if parents is not None and source is not None and wanted:
        found = _positions_by_statement(module, wanted, parents, source)
        if found is not None:
            return found
    from libcst.metadata.position_provider import PositionProvider

    provider = PositionProvider()
    provider._gen_impl(module)  # fills provider._computed for every node: one codegen pass
    computed = provider._computed
    return {node: computed[node] for node in wanted if node in computed}


# The text of the file under analysis, and its ``ast`` tree once parsed: its finding positions and the repository
# index's summary of that same file (a class defined there, its payloads) both read it, and an ``ast`` parse is a
# fifth of a libcst parse. Other texts (the summaries of other files, read in between) are parsed and not kept.
_KEPT_AST: tuple = (None, None)


def keep_ast(source: str) -> None:
    """Keep the ``ast`` tree of ``source`` (the analyzed file's text) once someone parses it, until ``forget_ast``."""
    global _KEPT_AST
    _KEPT_AST = (source, None)


def forget_ast() -> None:
    """Drop the kept tree (the analysis of its file is over)."""
    global _KEPT_AST
    _KEPT_AST = (None, None)


def parse_ast(source: str) -> ast.Module:
    """``ast.parse(source)``, parsed once for the analyzed file's text however often it is asked (callers only read
    the tree)."""
    global _KEPT_AST
    kept, tree = _KEPT_AST
    if kept is None or not (kept is source or kept == source):
        return ast.parse(source)
    if tree is None:
        tree = ast.parse(source)
        _KEPT_AST = (kept, tree)
    return tree


_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # how Python counts lines (str.splitlines also splits on \f, \x1c...)


def _positions_by_statement(module: cst.Module, wanted: set[cst.CSTNode], parents: dict,
                            source: str) -> Optional[dict[cst.CSTNode, "cst.metadata.CodeRange"]]:
    try:
        tree = parse_ast(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    placer = _StatementPlacer(module, parents, _LINE_BREAK.split(source))
    try:
        placer.place(module.body, tree.body, list(wanted), top=True)
    except _Misaligned:
        return None
    return placer.found


class _Misaligned(Exception):
    """ast and libcst disagree about where a statement is: trust neither."""


# Statements whose indented ``body`` is ast's ``body`` of the same statement, statement for statement: a node in that
# body is placed by generating its own statement there, not the whole block (a loop of a hundred lines).
_BLOCK_STATEMENTS = (cst.ClassDef, cst.FunctionDef, cst.For, cst.While, cst.With, cst.If, cst.Try)


class _StatementPlacer:
    """Generates code again only for the innermost statements that hold the wanted nodes, inside class and function
    bodies and the bodies of blocks (``for``, ``while``, ``with``, ``if``, ``try``); their lines come from ``ast`` and
    their columns from the real line (the code of a nested statement generated alone lacks the indentation of
    the blocks around it)."""

    def __init__(self, module: cst.Module, parents: dict, lines: list[str]) -> None:
        self.module = module
        self.parents = parents
        self.lines = lines
        self.found: dict = {}

    def place(self, statements, ast_statements, nodes: list, top: bool = False) -> bool:
        """False (nothing placed) when some node is not under ``statements``."""
        index = {id(statement): i for i, statement in enumerate(statements)}
        groups: dict[int, list] = {}
        for node in nodes:
            current = node
            while current is not None and id(current) not in index:
                current = self.parents.get(id(current))
            if current is None:
                if top:
                    raise _Misaligned()
                return False
            groups.setdefault(index[id(current)], []).append(node)
        if top and len(groups) == len(statements):
            raise _Misaligned()  # every statement anyway: one pass over the module is cheaper
        first_lines = _first_token_lines(statements, ast_statements)
        for i, group in groups.items():
            statement, (first_line, ast_statement) = statements[i], first_lines[i]
            body = getattr(statement, "body", None)
            if isinstance(statement, _BLOCK_STATEMENTS) and isinstance(body, cst.IndentedBlock) \
                    and self.place(body.body, ast_statement.body, group):
                continue
            self._generate(statement, first_line, group)
        return True

    def _generate(self, statement: cst.CSTNode, first_line: int, nodes: list) -> None:
        from libcst._position import CodePosition, CodeRange
        from libcst.metadata.position_provider import PositionProvider, PositionProvidingCodegenState

        provider = PositionProvider()
        module = self.module
        state = PositionProvidingCodegenState(default_indent=module.default_indent,
                                              default_newline=module.default_newline, provider=provider)
        statement._codegen(state)
        own = _LINE_BREAK.split("".join(state.tokens))
        first = next((n for n, line in enumerate(own) if line.strip() and not line.lstrip().startswith("#")), None)
        if first is None:
            raise _Misaligned()
        offset = first_line - 1 - first  # real line = own line + offset

        def real(position):
            line = position.line + offset
            if not 1 <= line <= len(self.lines):
                raise _Misaligned()
            text, own_text = self.lines[line - 1], own[position.line - 1]
            if not text.endswith(own_text) or text[:len(text) - len(own_text)].strip():
                raise _Misaligned()
            return CodePosition(line, position.column + len(text) - len(own_text))

        real(CodePosition(first + 1, 0))
        computed = provider._computed
        for node in nodes:
            where = computed.get(node)
            if where is not None:
                self.found[node] = CodeRange(real(where.start), real(where.end))


def _first_token_lines(statements, ast_statements) -> list[tuple[int, ast.stmt]]:
    """For each libcst statement, the line of its first token and its ast statement, from ``ast`` (~20x
    cheaper than generating the code again): ``a; b`` is one libcst statement and two ast ones."""
    remaining = iter(ast_statements)
    found = []
    try:
        for statement in statements:
            first = next(remaining)
            if isinstance(statement, cst.SimpleStatementLine):
                for _ in range(len(statement.body) - 1):
                    next(remaining)
                found.append((first.lineno, first))
            else:
                found.append((min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", ())]), first))
    except StopIteration:
        raise _Misaligned() from None
    if next(remaining, None) is not None:
        raise _Misaligned()
    return found
