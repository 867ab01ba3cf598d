"""TR823 torchvision-submodule-import-alias: `import torchvision.models as models` where `from torchvision import
models` says the same (TorchFix's TOR203; runs only when selected)."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, dotted_name
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


class TorchvisionSubmoduleImportAlias(Rule):
    id = "TR823"
    opt_in = True
    slug = "torchvision-submodule-import-alias"
    category = Category.DEPRECATION
    severity = Severity.LOW
    source_hint = re.compile(r"import\s+torchvision\.\w+\s+as\b")
    summary = "`import torchvision.models as models` instead of `from torchvision import models` (TorchFix's TOR203)"
    what = """
        Flags `import torchvision.X as X`, a torchvision submodule imported under its own last name
        (`models`, `datasets`, `transforms`, ...). It runs only when selected (`--select TR823` or TorchFix's
        `TOR203`): it is a style preference TorchFix users may keep enforcing, with no effect on behaviour.
    """
    why = """
        `from torchvision import models` binds the same module to the same name and says so directly;
        the aliased form repeats the name and reads as if a different name were meant. Linters that
        check import style (pylint's `consider-using-from-import`) ask for the same.
    """
    example = """
        import torchvision.models as models
    """
    fix_example = """
        from torchvision import models
    """
    VALID = [
        """
        import torch
        from torchvision import models, transforms
        import torchvision.models as cnn
        import torchvision.models
        from torchvision.models import resnet50
        """,
        # a deeper module: `from torchvision.models import detection` is not the same line shortened
        """
        import torchvision.models.detection as detection
        import torchvision
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torchvision.datasets as datasets
            """,
            line=3, message="`from torchvision import datasets`",
            fixed="""
            import torch
            from torchvision import datasets
            """,
        ),
        # with another name on the line it is reported without a fix (the line would have to be split)
        Invalid(
            """
            import torchvision.transforms as transforms, torch
            """,
            line=2, message="transforms",
        ),
    ]

    def visit_Import(self, node: cst.Import, ctx: FileContext) -> None:
        for alias in node.names:
            name = alias.name
            if not (isinstance(name, cst.Attribute) and isinstance(name.value, cst.Name) and
                    name.value.value == "torchvision" and alias.asname is not None):
                continue
            submodule = name.attr.value
            if dotted_name(alias.asname.name) != submodule:
                continue
            replacement = None
            if len(node.names) == 1:
                replacement = cst.ImportFrom(module=cst.Name("torchvision"),
                                             names=[cst.ImportAlias(name=cst.Name(submodule))])
            self.report(node, f"{code_span(f'import torchvision.{submodule} as {submodule}')}: "
                              f"{code_span(f'from torchvision import {submodule}')} binds the same module "
                              f"(TorchFix's TOR203, selected)", replacement=replacement)
