"""TR903 unscoped-torch-library: torch.library.Library registrations outlive the test that made them (TorchFix's
TOR901; runs only when selected)."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


class UnscopedTorchLibrary(Rule):
    id = "TR903"
    opt_in = True
    slug = "unscoped-torch-library"
    category = Category.REPRODUCIBILITY
    severity = Severity.LOW
    source_hint = re.compile(r"\bLibrary\b")
    summary = "torch.library.Library registrations outlive the test that made them (TorchFix's TOR901)"
    what = """
        Flags `torch.library.Library(...)`. It runs only when selected (`--select TR903` or TorchFix's
        `TOR901`): pytorch/pytorch's own test suite asks for `torch.library._scoped_library` there
        (pytorch/pytorch#118318), and projects whose tests register operators may want the same.
    """
    why = """
        Operators and kernels registered through a `Library` object stay registered as long as the
        object lives, usually for the whole process: a test that registers `aten` kernels changes what
        the tests after it run, and the suite passes or fails with the order. `_scoped_library` is a
        context manager that removes the registrations when the block ends.
    """
    example = """
        def test_fallthrough():
            lib = Library("aten", "IMPL")
            lib.impl("mul.Tensor", my_mul, "CPU")
    """
    fix_example = """
        def test_fallthrough():
            with torch.library._scoped_library("aten", "IMPL") as lib:
                lib.impl("mul.Tensor", my_mul, "CPU")
    """
    VALID = [
        """
        import torch
        def test_fallthrough():
            with torch.library._scoped_library("aten", "IMPL") as lib:
                lib.impl("mul.Tensor", my_mul, "CPU")
        """,
        # another library's Library class
        """
        import torch
        from music import Library
        shelf = Library("jazz")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.library import Library, impl
            my_lib = Library("aten", "IMPL")
            """,
            line=4, message="_scoped_library",
        ),
        Invalid(
            """
            import torch
            def test_custom_op():
                lib = torch.library.Library("mylib", "DEF")
                lib.define("add_one(Tensor x) -> Tensor")
            """,
            line=4,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if ctx.call_name(node) != "torch.library.Library":
            return
        self.report(node, f"{code_span(short(ctx, node))} keeps its registrations for the life of the process, so "
                          f"a test that makes them changes the tests after it; "
                          f"`with torch.library._scoped_library(...) as lib:` removes them when the block ends "
                          f"(TorchFix's TOR901, selected)")
