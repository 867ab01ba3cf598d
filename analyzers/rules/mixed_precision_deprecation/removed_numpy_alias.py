"""TR817 removed-numpy-alias: np.float / np.int / np.bool / np.object were removed in NumPy 1.24."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule


# NumPy aliases of Python builtins: deprecated in 1.20, removed in 1.24 (np.long came back in 2.0 as C long)
_NUMPY_ALIASES = {"numpy.float": "float", "numpy.int": "int", "numpy.bool": "bool", "numpy.object": "object",
                  "numpy.str": "str", "numpy.complex": "complex", "numpy.unicode": "str"}


class RemovedNumpyAlias(Rule):
    id = "TR817"
    syntactic = True
    slug = "removed-numpy-alias"
    pinned_package = "numpy"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "np.float / np.int / np.bool / np.object were removed in NumPy 1.24"
    what = """
        Flags `np.float`, `np.int`, `np.bool`, `np.object`, `np.str`, `np.complex` and
        `np.unicode`, the NumPy aliases of Python builtins, and rewrites them to the builtin.
        Quiet when the repository pins NumPy below 1.24.
    """
    why = """
        The aliases were deprecated in NumPy 1.20 and removed in 1.24: the line raises
        `AttributeError: module 'numpy' has no attribute 'float'` on any current install. They
        always meant the Python builtin (`np.float` is `float`, i.e. float64), so the builtin is an
        exact replacement; use `np.float32` / `np.int64` where a sized type was meant.
    """
    example = """
        omega = np.arange(embed_dim // 2, dtype=np.float)
    """
    fix_example = """
        omega = np.arange(embed_dim // 2, dtype=float)
    """
    VALID = [
        # a shim that restores the alias for a library that still reads it: an assignment, not a use
        "import numpy as np\nimport torch\nnp.float = float\nnp.int = int\n",
        """
        import numpy as np
        import torch
        a = np.arange(4, dtype=np.float64)
        b = np.zeros(3, dtype=bool)
        c = np.float32(1.0)
        """,
        """
        import torch
        import numpy as np
        x = np.floating
        y = np.int_
        """,
    ]
    INVALID = [
        Invalid(
            """
            import numpy as np
            import torch
            omega = np.arange(embed_dim // 2, dtype=np.float)
            """,
            line=4, message="`np.float`",
            fixed="""
            import numpy as np
            import torch
            omega = np.arange(embed_dim // 2, dtype=float)
            """,
        ),
        Invalid(
            """
            import numpy
            import torch
            onehot = numpy.zeros((n, k), dtype=numpy.bool)
            """,
            line=4,
            fixed="""
            import numpy
            import torch
            onehot = numpy.zeros((n, k), dtype=bool)
            """,
        ),
    ]

    def visit_Attribute(self, node: cst.Attribute, ctx: FileContext) -> None:
        if node.attr.value not in ("float", "int", "bool", "object", "str", "complex", "unicode"):
            return
        builtin = _NUMPY_ALIASES.get(ctx.qualified_name(node) or "")
        if builtin is None or ctx.binding(builtin) is not None or in_compat_fallback(ctx, node):
            return
        parent = ctx.parent(node)
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, (cst.AnnAssign, cst.AugAssign))
                                                    and parent.target is node):
            return  # ``np.float = float`` puts the alias back for code that still uses it: a shim, not a use
        if not ctx.facts(VersionFacts).admits("numpy", (1, 24)):
            return
        shown = short(ctx, node)
        self.report(node, f"{code_span(shown)} was removed in NumPy 1.24 (AttributeError on current installs); it was "
                          f"only an alias of the builtin, so use {code_span(builtin)} (or a sized type such as "
                          f"`np.float32` if that was meant)", replacement=cst.Name(builtin))
