"""TR813 private-default-collate: default_collate imported from a private torch module."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, dotted_name, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.names import render_name
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule, Valid


_PRIVATE_COLLATE_MODULES = {"torch.utils.data._utils.collate", "torch.utils.data.dataloader"}
_PUBLIC_COLLATE = {"default_collate", "default_convert"}


class PrivateDefaultCollate(Rule):
    id = "TR813"
    syntactic = True
    slug = "private-default-collate"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "default_collate imported from a private torch module"
    what = """
        Flags `default_collate` / `default_convert` imported from
        `torch.utils.data._utils.collate` or `torch.utils.data.dataloader` (or called through
        those paths) instead of the public `torch.utils.data`.
    """
    why = """
        `torch.utils.data.default_collate` is public since PyTorch 1.11. The `_utils` path is
        private and may move without notice, and `torch.utils.data.dataloader.default_collate` is
        only a leftover re-export.
    """
    example = """
        from torch.utils.data.dataloader import default_collate
    """
    fix_example = """
        from torch.utils.data import default_collate
    """
    VALID = [
        """
        import torch
        from torch.utils.data import default_collate
        """,
        """
        import torch
        from torch.utils.data._utils.collate import collate, default_collate_fn_map
        """,
        # the fallback for torch < 1.11
        """
        import torch
        try:
            from torch.utils.data import default_collate
        except ImportError:
            from torch.utils.data.dataloader import default_collate
        """,
        # selected through TorchFix: calls through the public name or the fallback are fine
        Valid("""
        import torch
        try:
            from torch.utils.data import default_collate
        except ImportError:
            from torch.utils.data.dataloader import default_collate
        batch = default_collate(samples)
        from torch.utils.data import default_convert
        values = default_convert(values)
        """, select=("TOR104",)),
    ]
    OPTIONS = {"each-call": """
        each call through a name imported from the private module is reported too (by default only the import
        is, and its fix makes every call correct), at low severity, as TorchFix reported them.
    """}
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data.dataloader import default_collate
            """,
            line=3, message="torch.utils.data.dataloader",
            fixed="""
            import torch
            from torch.utils.data import default_collate
            """,
        ),
        Invalid(
            """
            import torch
            batch = torch.utils.data._utils.collate.default_collate(samples)
            """,
            line=3,
            fixed="""
            import torch
            batch = torch.utils.data.default_collate(samples)
            """,
        ),
        # selected through TorchFix: the import and each call
        Invalid(
            """
            import torch
            from torch.utils.data._utils.collate import default_convert as convert
            values = convert(values)
            other = convert(more)
            """,
            count=3, select=("TOR104", "TOR105"),
        ),
        Invalid(
            """
            import torch
            from torch.utils.data.dataloader import default_collate
            def collate(samples):
                return default_collate(samples)
            """,
            line=3, count=2, select=("TOR104",),
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._fallbacks: set[str] = set()  # names bound by a private import that is the fallback for older torch

    def visit_ImportFrom(self, node: cst.ImportFrom, ctx: FileContext) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        if module not in _PRIVATE_COLLATE_MODULES:
            return
        names = [dotted_name(alias.name) for alias in node.names]
        public = [n for n in names if n in _PUBLIC_COLLATE]
        if public and in_compat_fallback(ctx, node):
            self._fallbacks.update(dotted_name(alias.asname.name if alias.asname else alias.name)
                                   for alias in node.names)
        if not public or in_compat_fallback(ctx, node) or not ctx.facts(VersionFacts).admits("torch", (1, 11)):
            return
        replacement = None
        if len(public) == len(names):
            replacement = node.with_changes(module=cst.parse_expression("torch.utils.data"))
        self.report(node, f"{code_span(', '.join(public))} imported from the private {code_span(module)}; it is public "
                          f"as {code_span('torch.utils.data.' + public[0])} since PyTorch 1.11", replacement=replacement)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if isinstance(func, cst.Name) and "each-call" in self.options:
            self._bare_call(node, func, ctx)
        if not isinstance(func, cst.Attribute) or func.attr.value not in _PUBLIC_COLLATE:
            return
        qualified = ctx.qualified_name(func) or ""
        module = qualified.rsplit(".", 1)[0]
        if module not in _PRIVATE_COLLATE_MODULES or not ctx.facts(VersionFacts).admits("torch", (1, 11)):
            return
        public = render_name(ctx, f"torch.utils.data.{func.attr.value}")
        replacement = node.with_changes(func=public) if public is not None else None
        self.report(node, f"{code_span(short(ctx, node.func))} reaches into the private {code_span(module)}; use "
                          f"{code_span('torch.utils.data.' + func.attr.value)} (public since PyTorch 1.11)",
                    replacement=replacement)

    def _bare_call(self, node: cst.Call, func: cst.Name, ctx: FileContext) -> None:
        """``default_collate(x)`` through a name imported from the private module: the import is reported and fixed;
        TorchFix also reported each call (TOR104), so a user who selected it gets each, without a second fix."""
        qualified = ctx.qualified_name(func) or ""
        module, _, name = qualified.rpartition(".")
        if name not in _PUBLIC_COLLATE or module not in _PRIVATE_COLLATE_MODULES or \
                not ctx.facts(VersionFacts).admits("torch", (1, 11)):
            return
        if func.value in self._fallbacks:
            return  # the fallback for torch < 1.11
        self.report(node, f"{code_span(func.value)} is the private {code_span(qualified)}; import it from "
                          f"{code_span('torch.utils.data')} (public since PyTorch 1.11; TorchFix's TOR104, selected)",
                    severity=Severity.LOW)
