"""TR820 removed-module-import: Import of a module removed from torch / torchvision / torchtext."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, dotted_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.versions import Version, VersionFacts
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import handles_other_versions as _handles_other_versions


# module -> (package, removed in, what to use instead)
_REMOVED_MODULES = {
    "torch._six": ("torch", (2, 0), "`math.inf`, `str`, `collections.abc` and `int` instead of its aliases"),
    "torchvision.transforms.functional_tensor": ("torchvision", (0, 17), "`torchvision.transforms.functional`"),
    "torchtext.legacy": ("torchtext", (0, 12), "torchtext's new datasets and `torch.utils.data`, or pin "
                                                "`torchtext<0.12`"),
}
# torchtext 0.9 moved these to torchtext.legacy.data; 0.12 removed them
_TORCHTEXT_LEGACY_DATA = {"Field", "LabelField", "BucketIterator", "Iterator", "TabularDataset", "Example",
                          "Dataset", "BPTTIterator", "RawField", "NestedField", "ReversibleField", "Batch", "Pipeline"}


class RemovedModuleImport(Rule):
    id = "TR820"
    syntactic = True
    slug = "removed-module-import"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "Import of a module removed from torch / torchvision / torchtext"
    what = """
        Flags imports of modules that no longer exist: `torch._six` (removed in PyTorch 2.0),
        `torchvision.transforms.functional_tensor` (torchvision 0.17), `torchtext.legacy` and the
        classic `torchtext.data.Field` / `BucketIterator` / `TabularDataset` API (torchtext 0.12).
        Quiet when the repository pins a release that still has them, inside `try: ... except
        ImportError`, under a version check, and in `legacy/` folders.
    """
    why = """
        On the releases that removed them the import raises `ModuleNotFoundError` /
        `ImportError`, so the whole module fails to load, usually at startup, long before the
        code that needed the symbol.
    """
    example = """
        from torch._six import inf
        from torchvision.transforms.functional_tensor import rgb_to_grayscale
    """
    fix_example = """
        from math import inf
        from torchvision.transforms.functional import rgb_to_grayscale
    """
    VALID = [
        """
        import torch
        from math import inf
        from torchvision.transforms.functional import rgb_to_grayscale
        """,
        """
        import torch
        try:
            from torch._six import inf
        except ImportError:
            from math import inf
        """,
        """
        import torch
        from torchtext.data.utils import get_tokenizer
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch._six import inf, string_classes
            """,
            line=3, message="`torch._six` was removed in torch 2.0",
        ),
        Invalid(
            """
            import torch
            import torchvision.transforms.functional_tensor as F_t
            """,
            line=3, message="torchvision 0.17",
            fixed="""
            import torch
            import torchvision.transforms.functional as F_t
            """,
        ),
        Invalid(
            """
            import torch
            from torchtext.data import Field, BucketIterator
            """,
            line=3, message="`Field`, `BucketIterator`",
        ),
    ]

    def visit_Import(self, node: cst.Import, ctx: FileContext) -> None:
        for alias in node.names:
            module = dotted_name(alias.name) or ""
            found = self._removed(module)
            if found is not None:
                replacement = None
                if module == "torchvision.transforms.functional_tensor" and alias.asname is not None and \
                        len(node.names) == 1:
                    replacement = node.with_changes(names=[alias.with_changes(
                        name=cst.parse_expression("torchvision.transforms.functional"))])
                self._report(node, module, found, ctx, replacement=replacement)
                return

    def visit_ImportFrom(self, node: cst.ImportFrom, ctx: FileContext) -> None:
        if node.relative or node.module is None:
            return
        module = dotted_name(node.module) or ""
        found = self._removed(module)
        if found is not None:
            replacement = None
            if module == "torchvision.transforms.functional_tensor":
                replacement = node.with_changes(module=cst.parse_expression("torchvision.transforms.functional"))
            self._report(node, module, found, ctx, replacement=replacement)
            return
        if module == "torchtext.data" and not isinstance(node.names, cst.ImportStar):
            names = [dotted_name(a.name) or "" for a in node.names]
            legacy = [n for n in names if n in _TORCHTEXT_LEGACY_DATA]
            if legacy:
                self._report(node, module, ("torchtext", (0, 12), "torchtext's new datasets and "
                                            "`torch.utils.data`, or pin `torchtext<0.12`"), ctx, symbols=legacy)

    @staticmethod
    def _removed(module: str) -> Optional[tuple[str, Version, str]]:
        for name, found in _REMOVED_MODULES.items():
            if module == name or module.startswith(name + "."):
                return found
        return None

    def _report(self, node: cst.CSTNode, module: str, found: tuple[str, Version, str], ctx: FileContext,
                symbols: Optional[list[str]] = None, replacement: Optional[cst.CSTNode] = None) -> None:
        package, removed, instead = found
        if _handles_other_versions(ctx, node) or not ctx.facts(VersionFacts).admits(package, removed):
            return
        release = ".".join(map(str, removed))
        if symbols:
            what = f"{', '.join(code_span(s) for s in symbols)} from {code_span(module)} were removed in {package} {release}"
        else:
            what = f"{code_span(module)} was removed in {package} {release}"
        self.report(node, f"{what}: this import raises ImportError on current releases; use {instead}",
                    replacement=replacement, pins=package)
