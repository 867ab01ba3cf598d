"""Does the program freeze parameters, and does a module cut part of itself out of the graph: answered from what the
code does (``p.requires_grad = False``, ``requires_grad_(False)``, a helper of the repository that does either;
``with torch.no_grad():`` or ``.detach()`` inside a class), never from words such as "freeze" in its text.

Read with ``ast`` so that the analyzed file and the repository's other files (through
:mod:`analyzers.program.modules`' summaries) are asked the same questions the same way.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, parse_ast
from analyzers.program.flow import ModuleNodes
from analyzers.program.loops import closure

# the context managers and decorators under which autograd records nothing (torch.no_grad, torch.inference_mode,
# torch.set_grad_enabled(False), and torch.enable_grad's opposite is not one): known by their last name here, as
# the summaries of other files cannot resolve imports
_GRAD_OFF = frozenset({"no_grad", "inference_mode", "set_grad_enabled"})


def _true(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _freezes_directly(nodes) -> bool:
    """Sets some ``requires_grad`` to anything but True: ``= False``, ``= not train_all``, ``= flag``,
    ``requires_grad_(False)``."""
    for node in nodes:
        if isinstance(node, ast.Assign) and not _true(node.value) and any(
                isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in node.targets):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "requires_grad_":
            given = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg == "requires_grad"), None)
            if given is not None and not _true(given):
                return True
    return False


def freezing_functions(tree: ast.Module) -> set[str]:
    """The top-level functions of a parsed file that freeze parameters of what they are given or build, or call
    another function of the file that does (for the repository's summaries)."""
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    direct = {name for name, fn in functions.items() if _freezes_directly(ast.walk(fn))}
    calls = {name: {node.func.id for node in ast.walk(fn) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id in functions}
             for name, fn in functions.items()}
    return closure(direct, calls)


def file_freezes(tree: ast.Module) -> bool:
    """Does the file's code freeze parameters anywhere (its top level, its functions, its classes' methods)?"""
    return _freezes_directly(ast.walk(tree))


def stops_gradient(cls: ast.ClassDef) -> bool:
    """Does the class cut part of its computation out of the graph: a ``no_grad`` / ``inference_mode`` /
    ``set_grad_enabled`` block or decorator, or a ``.detach()``?"""
    for node in ast.walk(cls):
        if isinstance(node, ast.Call):
            func = node.func
            last = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if last == "detach" and isinstance(func, ast.Attribute):
                return True
            if last in _GRAD_OFF:
                return True
        elif isinstance(node, (ast.Attribute, ast.Name)) and \
                (node.attr if isinstance(node, ast.Attribute) else node.id) in ("no_grad", "inference_mode"):
            return True  # ``@torch.no_grad`` without parentheses
    return False


def program_freezes(ctx: FileContext) -> bool:
    """Does the analyzed program freeze parameters: in this file's code, or through a function it calls, its own
    or one it imports from the repository (``freeze(model.backbone)`` with ``freeze`` in ``utils.py``)?"""
    try:
        tree = parse_ast(ctx.source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if file_freezes(tree):
        return True
    from analyzers.program.modules import ModuleFacts  # modules summarizes files with this module's functions
    facts = ctx.facts(ModuleFacts)
    asked: set[str] = set()
    for call in ctx.facts(ModuleNodes).of_type(cst.Call):
        called = dotted_name(call.func)
        if called is None or called in asked or called.startswith("self."):
            continue
        asked.add(called)
        if facts.freezing_function(called):
            return True
    return False


def class_freezes_or_stops_gradient(name: str, ctx: FileContext) -> Optional[bool]:
    """Does the model class ``name`` (this file's, or the repository's) cut part of itself out of the graph, or does
    the file that defines it freeze parameters? None when the class is not found."""
    if name in ctx.module_classes_in_file:
        try:
            tree = parse_ast(ctx.source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        cls = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)
        return None if cls is None else stops_gradient(cls)  # this file's freezes are asked of the program
    from analyzers.program.modules import ModuleFacts
    found = ctx.facts(ModuleFacts).find_class(name)
    if found is None:
        return None
    index = ctx.repository
    summary = index.summary(Path(found.path)) if index is not None else None
    return found.stops_gradient or (summary is not None and summary.freezes)
