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

from analyzers.context import FileContext
from analyzers.program.flow import ModuleNodes
from analyzers.program.library import FROZEN_NORM_LAYERS, NORM_FREEZING_OPTIONS, NORM_LAYERS_WITH_STATS
from analyzers.program.loops import functions_that

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
    return functions_that(tree, lambda fn: _freezes_directly(ast.walk(fn)))


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


# BatchNorm classes an ``isinstance`` test names, by last name (``nn.BatchNorm2d``, ``_BatchNorm``, ``SyncBatchNorm``)
_BATCHNORM_CLASS_NAMES = frozenset(NORM_LAYERS_WITH_STATS | {"_BatchNorm", "_NormBase"})


def _names_batchnorm(node: ast.AST) -> bool:
    """``nn.BatchNorm2d``, ``(nn.BatchNorm1d, nn.BatchNorm2d)``, ``torch.nn.modules.batchnorm._BatchNorm``."""
    if isinstance(node, ast.Tuple):
        return any(_names_batchnorm(element) for element in node.elts)
    last = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return last in _BATCHNORM_CLASS_NAMES or (last is not None and "FrozenBatchNorm" in last)


def _evaluates_batchnorm(scope: ast.AST) -> bool:
    """Does this function, lambda or loop put BatchNorm modules in eval mode: an ``isinstance`` test against a BatchNorm
    class, and an ``.eval()`` / ``.train(False)`` call, in one body?"""
    tests_batchnorm = evaluates = False
    for node in ast.walk(scope):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "isinstance" and len(node.args) == 2 and \
                _names_batchnorm(node.args[1]):
            tests_batchnorm = True
        elif isinstance(func, ast.Attribute) and (func.attr == "eval" and not node.args or func.attr == "train" and
                                                  node.args and isinstance(node.args[0], ast.Constant)
                                                  and node.args[0].value is False):
            evaluates = True
    return tests_batchnorm and evaluates


def batchnorm_fixing_functions(tree: ast.Module) -> set[str]:
    """The top-level functions of a parsed file that put BatchNorm modules in eval mode, or call another function of
    the file that does (for the repository's summaries)."""
    return functions_that(tree, _evaluates_batchnorm)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.For)


def _fixes_batchnorm_statistics(tree: ast.Module) -> bool:
    """Does the file's code keep BatchNorm statistics from changing by itself: a function, method, lambda or loop
    (``for m in model.modules():``) that puts BatchNorm modules in eval mode, a BatchNorm built with ``track_running_stats=False`` or ``momentum=0``, or a
    norm-freezing option turned on (``norm_eval=True``)?"""
    for node in ast.walk(tree):
        if isinstance(node, _SCOPES) and _evaluates_batchnorm(node):
            return True
        if isinstance(node, ast.keyword):
            value = node.value
            if node.arg == "track_running_stats" and isinstance(value, ast.Constant) and value.value is False:
                return True
            if node.arg == "momentum" and isinstance(value, ast.Constant) and value.value == 0 and \
                    not isinstance(value.value, bool):
                return True
            if node.arg in NORM_FREEZING_OPTIONS and isinstance(value, ast.Constant) and value.value is True:
                return True
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in NORM_FREEZING_OPTIONS and
                                              isinstance(v, ast.Constant) and v.value is True
                                              for k, v in zip(node.keys, node.values)):
            return True
    return False


def program_fixes_batchnorm_statistics(ctx: FileContext) -> bool:
    """Does the program keep BatchNorm statistics fixed another way than ``eval()`` of the frozen module: a frozen
    BatchNorm layer (:data:`FROZEN_NORM_LAYERS`), BatchNorm built without running statistics, a norm-freezing option,
    code that puts BatchNorm modules in eval mode, or a function of the repository it calls that does
    (``model.apply(set_bn_eval)`` with ``set_bn_eval`` in ``utils.py``)?"""
    tree = ctx.python_tree
    if tree is None:
        return False
    if _fixes_batchnorm_statistics(tree):
        return True
    nodes = ctx.facts(ModuleNodes)
    if any(ctx.qualified_name(node) in FROZEN_NORM_LAYERS for node in nodes.of_type(cst.Name, cst.Attribute)):
        return True
    from analyzers.program.modules import calls_marked_function  # modules summarizes files with this module
    return calls_marked_function(ctx, lambda summary: summary.batchnorm_fixing_functions, handed=True)


def program_freezes(ctx: FileContext) -> bool:
    """Does the analyzed program freeze parameters: in this file's code, or through a function it calls, its own
    or one it imports from the repository (``freeze(model.backbone)`` with ``freeze`` in ``utils.py``)?"""
    tree = ctx.python_tree
    if tree is None:
        return False
    if file_freezes(tree):
        return True
    from analyzers.program.modules import calls_marked_function  # modules summarizes files with this module
    return calls_marked_function(ctx, lambda summary: summary.freezing_functions)


def class_freezes_or_stops_gradient(name: str, ctx: FileContext) -> Optional[bool]:
    """Does the model class ``name`` (this file's, or the repository's) cut part of itself out of the graph, or does
    the file that defines it freeze parameters? None when the class is not found."""
    if name in ctx.module_classes_in_file:
        tree = ctx.python_tree
        if tree is None:
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
