"""Imports a fix left unused: ``Variable(x)`` -> ``x`` frees ``from torch.autograd import Variable``.

``--fix``, the LSP's quick fixes and anything else that applies a finding's fix call :func:`freed_import_fixes`
with the text before and after the fix. An import is freed when it was in use before (referenced, exported
through ``__all__``, or named in a string annotation: libcst's scope analysis, ``GatherUnusedImportsVisitor``)
and is unused after. Everything else is left alone: imports that were already unused (someone may want them:
a re-export, a side effect), star imports, ``__future__``, the imports of an ``__init__.py`` (a package's
namespace is its API), an import on a line with other statements, and the only statement of a block.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional, Union

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import GatherUnusedImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from analyzers.model import Fix

ImportNode = Union[cst.Import, cst.ImportFrom]
ImportKey = tuple[str, str, Optional[str]]  # (from-module or "", imported name, alias)


def _key(alias: cst.ImportAlias, statement: ImportNode) -> ImportKey:
    module = ""
    if isinstance(statement, cst.ImportFrom):
        module = "." * len(statement.relative) + (get_full_name_for_node(statement.module) or "")
    asname = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else None
    return module, get_full_name_for_node(alias.name) or "", asname


class _Imports:
    """Every import alias of one text (star imports and ``__future__`` excluded), and which are unused."""

    def __init__(self, source: str):
        self.wrapper = MetadataWrapper(cst.parse_module(source))
        # the visitor reads metadata its parent transform computed: compute it here, as a codemod would
        self.wrapper.resolve_many({*GatherUnusedImportsVisitor.get_inherited_dependencies(), PositionProvider,
                                   ParentNodeProvider})
        gather = GatherUnusedImportsVisitor(CodemodContext(wrapper=self.wrapper))
        self.wrapper.module.visit(gather)
        self.unused = gather.unused_imports
        self.all: list[tuple[cst.ImportAlias, ImportNode]] = []
        self.wrapper.module.visit(_Collect(self.all))  # the wrapper's own tree: its nodes carry the metadata

    def keys(self, unused: bool) -> Counter:
        chosen = self.unused if unused else set(self.all) - self.unused
        return Counter(_key(alias, statement) for alias, statement in chosen)


class _Collect(cst.CSTVisitor):
    def __init__(self, into: list):
        self.into = into

    def visit_Import(self, node: cst.Import) -> bool:
        self.into.extend((alias, node) for alias in node.names)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar) and get_full_name_for_node(node.module or cst.Name("_")) != "__future__":
            self.into.extend((alias, node) for alias in node.names)
        return False


def _without(statement: ImportNode, dropped: set[cst.ImportAlias]) -> ImportNode:
    kept = [alias for alias in statement.names if alias not in dropped]
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)  # no trailing comma left behind
    if isinstance(statement, cst.ImportFrom) and len(kept) == 1:
        return statement.with_changes(names=kept, lpar=None, rpar=None)  # ``from x import (a,\n b)`` -> ``b``
    return statement.with_changes(names=kept)


def freed_import_fixes(before: str, after: str, path: str = "") -> list[Fix]:
    """Whole-line edits of ``after`` that remove the import names ``after`` no longer uses but ``before`` did;
    empty when either text does not parse or ``path`` is a package's ``__init__.py``."""
    if path.replace("\\", "/").rsplit("/", 1)[-1] == "__init__.py" or before == after:
        return []
    try:
        old, new = _Imports(before), _Imports(after)
    except (cst.ParserSyntaxError, RecursionError):
        return []
    used_before, unused_before = old.keys(unused=False), old.keys(unused=True)
    # a name imported twice (or once used, once not) is ambiguous between the texts: leave it
    everywhere = Counter(_key(a, s) for a, s in new.all)
    freed: dict[ImportNode, set[cst.ImportAlias]] = {}
    for alias, statement in new.unused:
        key = _key(alias, statement)
        if used_before[key] == 1 and not unused_before[key] and everywhere[key] == 1:
            freed.setdefault(statement, set()).add(alias)
    if not freed:
        return []
    positions = new.wrapper.resolve(PositionProvider)
    parents = new.wrapper.resolve(ParentNodeProvider)
    lines = after.splitlines(keepends=True)
    fixes = []
    for statement, dropped in freed.items():
        line = parents[statement]
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            continue  # ``import a; x = 1``: not ours to rewrite
        start, end = positions[line].start.line, positions[line].end.line
        if len(dropped) < len(statement.names):
            indent = lines[start - 1][:len(lines[start - 1]) - len(lines[start - 1].lstrip())]
            rendered = new.wrapper.module.code_for_node(
                line.with_changes(leading_lines=(), body=[_without(statement, dropped)]))
            fixes.append(Fix(start, end, indent + rendered, safe=True))
            continue
        block = parents[line]
        siblings = getattr(block, "body", ())
        if not isinstance(block, cst.Module) and len(siblings) == 1:
            continue  # the only statement of a block: removing it would leave the block empty
        fixes.append(Fix(start, end, "", safe=True))
    return sorted(fixes, key=lambda f: f.start_line)


def remove_freed_imports(before: str, after: str, path: str = "") -> str:
    """``after`` without the imports it freed (see :func:`freed_import_fixes`)."""
    for fix in reversed(freed_import_fixes(before, after, path)):
        after = fix.apply(after)
    return after


def with_freed_imports(source: str, fix: Fix, path: str = "") -> list[Fix]:
    """``fix`` and the removals of the imports it frees, all as edits of ``source`` (not of the fixed text), for
    an editor that applies them together. A removal that would touch the fix's own lines is left out."""
    after = fix.apply(source)
    added = len(fix.replacement.splitlines()) - (fix.end_line - fix.start_line + 1)  # lines the fix adds
    edits = [fix]
    for removal in freed_import_fixes(source, after, path):
        if removal.end_line < fix.start_line:
            edits.append(removal)  # above the fix: its lines did not move
        elif removal.start_line >= fix.start_line + len(fix.replacement.splitlines()):
            edits.append(Fix(removal.start_line - added, removal.end_line - added, removal.replacement, removal.safe))
    return sorted(edits, key=lambda f: f.start_line)
