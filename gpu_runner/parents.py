"""Which code of a repository builds a given class: the classes (and module-level functions) whose bodies name it,
as a call (``self.attn = Attention(dim, heads)``) or as a value handed on (``self._make_layer(Block, 64, 2)``,
``nn.Sequential(*[Block(d) for _ in range(n)])``). A class the runner cannot build by itself is then built the way
such a parent builds it (gpu_runner.build). Read statically, on the standard library only: it runs in the sandbox."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

from gpu_runner import sites

MAX_BUILDERS = 3  # parents tried per class: the first ones, same file first


def builders(code_root: Path, path: str, name: str, limit: int = MAX_BUILDERS) -> list[tuple[str, str]]:
    """``(relative path, name)`` of the classes, then module-level functions, whose bodies name class ``name``
    (defined in ``path``): those of its own file first, then those of files that import it by name; at most
    ``limit``. The class itself and its subclasses (which name it as a base, not in their body) are not builders."""
    repository = sites.repository_for(code_root)
    defining = (repository.root / path).resolve()
    found: list[tuple[str, str]] = []
    files = [defining] + [p for p in repository.python_files() if p.resolve() != defining]
    for file_path in files:
        text = repository.text(file_path)
        if not text or name not in text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        local = name if file_path.resolve() == defining else _imported_as(tree, name, defining)
        if local is None:
            continue
        relative = file_path.resolve().relative_to(repository.root).as_posix()
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name != name]
        functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in classes + functions:
            if _names(node, local):
                found.append((relative, node.name))
                if len(found) >= limit:
                    return found
    return found


def _imported_as(tree: ast.Module, name: str, defining: Path) -> Optional[str]:
    """The name under which ``tree`` imports class ``name`` from the file ``defining`` (``from .blocks import
    Block as B``: "B"); None when it does not import it by name."""
    stem = defining.stem if defining.stem != "__init__" else defining.parent.name
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.rsplit(".", 1)[-1] != stem:
            continue
        for alias in node.names:
            if alias.name == name:
                return alias.asname or name
    return None


def _names(definition: ast.AST, local: str) -> bool:
    """Whether the body of ``definition`` (not its bases or decorators) reads the name ``local``."""
    body = getattr(definition, "body", [])
    return any(isinstance(node, ast.Name) and node.id == local and isinstance(node.ctx, ast.Load)
               for statement in body for node in ast.walk(statement))
