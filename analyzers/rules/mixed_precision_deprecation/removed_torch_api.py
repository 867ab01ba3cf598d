"""TR810 removed-torch-api: torch.solve / symeig / matrix_rank / lstsq / eig were removed from PyTorch."""
from __future__ import annotations

from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.rules.mixed_precision_deprecation._removed_api import TableRule as _TableRule


class RemovedTorchApi(_TableRule):
    id = "TR810"
    syntactic = True
    slug = "removed-torch-api"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    removed_family = True
    summary = "torch.solve / symeig / matrix_rank / lstsq / eig were removed from PyTorch"
    what = """
        Flags calls of functions that PyTorch has removed: `torch.solve`, `torch.symeig`,
        `torch.matrix_rank`, `torch.lstsq` and `torch.eig` (deprecated in 1.9 for `torch.linalg`),
        the `from torch import symeig` that imports one (the line that raises ImportError), and
        calls through an import alias.
        Stays quiet when the repository pins a torch release that still has them
        (`requirements*.txt`, `pyproject.toml`, `setup.cfg`, `setup.py`, `environment.yml`), and
        inside `except ImportError/AttributeError` fallbacks.
    """
    why = """
        On the releases that removed them these calls raise a RuntimeError (later an
        AttributeError), so the code crashes the moment it reaches them. Their `torch.linalg`
        successors differ in argument order and results, so the port needs a look, not a rename.
    """
    example = """
        X, LU = torch.solve(B, A)
        rank = torch.matrix_rank(M)
    """
    fix_example = """
        X = torch.linalg.solve(A, B)
        rank = torch.linalg.matrix_rank(M)
    """
    VALID = [
        """
        import torch
        X = torch.linalg.solve(A, B)
        rank = torch.linalg.matrix_rank(M)
        """,
        # a compatibility fallback for old torch builds
        """
        import torch
        try:
            x = torch.linalg.solve(A, B)
        except AttributeError:
            x, _ = torch.solve(B, A)
        """,
        # deprecated, not removed: TR811's
        """
        import torch
        q, r = torch.qr(A)
        """,
        """
        import numpy as np
        import torch
        r = np.linalg.matrix_rank(M)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            X, LU = torch.solve(B, A)
            """,
            line=3, message="`torch.solve(B, A)` was deprecated in PyTorch 1.9 and has since been removed",
        ),
        Invalid(
            """
            import torch as th
            rank = th.matrix_rank(M)
            """,
            line=3, message="use `th.linalg.matrix_rank(M)`",
            fixed="""
            import torch as th
            rank = th.linalg.matrix_rank(M)
            """,
        ),
        # the import itself is what raises on current releases; the call is reported too
        Invalid(
            """
            from torch import symeig
            e, v = symeig(A, eigenvectors=True)
            """,
            line=2, count=2, message="this import raises ImportError",
        ),
        # a call through an import alias is the removed function all the same
        Invalid(
            """
            import torch
            from torch import lstsq as least_squares
            fit = least_squares(B, A)
            """,
            line=3, count=2, message="`torch.lstsq`",
        ),
    ]
