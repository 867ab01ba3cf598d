"""Deprecated and removed PyTorch API, table-driven (TorchFix parity), gated on the version the repository pins.

One table lists every deprecated symbol with the release that deprecated it, the release that removed it
(if any), what to use instead and, where the new call is a pure rename, how to rewrite it. TR810 reports the
removed ones (they crash), TR811 the deprecated ones. Both consult :class:`~analyzers.program.versions.
VersionFacts`: a repository pinned to ``torch==1.7`` is not told that ``torch.qr`` is deprecated in 1.9.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, is_false, is_true, keyword_arg, positional_args, \
    string_value
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.versions import Version, VersionFacts
from analyzers.rules.base import Invalid, Rule

_NO_SPACE_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def short(ctx: FileContext, node: cst.CSTNode, limit: int = 60) -> str:
    text = " ".join(ctx.module.code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def local_name_for(ctx: FileContext, qualified: str) -> Optional[str]:
    """A local name the file's imports bind to ``qualified`` (and nothing rebinds), if any."""
    candidates = [local for local, target in ctx.imports.names.items() if target == qualified]
    candidates.sort(key=lambda n: (n != qualified.rsplit(".", 1)[-1], len(n)))
    for local in candidates:
        binding = ctx.binding(local)
        if binding is None or binding.kind == "import":
            return local
    return None


def render_name(ctx: FileContext, qualified: str) -> Optional[cst.BaseExpression]:
    """``qualified`` written through the file's imports: ``nn.Upsample`` after ``from torch import nn``."""
    parts = qualified.split(".")
    for cut in range(len(parts), 0, -1):
        local = local_name_for(ctx, ".".join(parts[:cut]))
        if local is not None:
            return cst.parse_expression(".".join([local, *parts[cut:]]))
    return None


def with_keyword(args: list[cst.Arg], name: str, value: cst.BaseExpression) -> list[cst.Arg]:
    new = cst.Arg(value, keyword=cst.Name(name), equal=_NO_SPACE_EQUAL)
    if not args:
        return [new]
    last = args[-1]
    return [*args[:-1], last.with_changes(comma=_COMMA), new]


def _plain(call: cst.Call) -> bool:
    return not any(a.star for a in call.args)


# ---- fixes: (call, ctx, new callee) -> the rewritten call or None ----------------------------------
Fix = Callable[[cst.Call, FileContext, cst.BaseExpression], Optional[cst.BaseExpression]]


def rename(max_positional: int, keywords: tuple[str, ...] = ()) -> Fix:
    """A pure rename when the call passes at most ``max_positional`` arguments and only ``keywords``."""

    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if not _plain(call) or len(positional_args(call)) > max_positional:
            return None
        if any(a.keyword is not None and a.keyword.value not in keywords for a in call.args):
            return None
        return call.with_changes(func=callee)

    return fix


def _fix_chain_matmul(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    if not _plain(call) or any(a.keyword is not None for a in call.args) or len(call.args) < 2:
        return None
    elements = [cst.Element(a.value, comma=_COMMA if i < len(call.args) - 1 else cst.MaybeSentinel.DEFAULT)
                for i, a in enumerate(call.args)]
    return call.with_changes(func=callee, args=[cst.Arg(cst.List(elements))])


def _fix_lu_solve(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.lu_solve(b, LU, pivots) -> torch.linalg.lu_solve(LU, pivots, b)
    if not _plain(call) or len(call.args) != 3 or any(a.keyword is not None for a in call.args):
        return None
    b, lu, pivots = (a.value for a in call.args)
    return call.with_changes(func=callee, args=[cst.Arg(lu, comma=_COMMA), cst.Arg(pivots, comma=_COMMA), cst.Arg(b)])


def _int(expr: Optional[cst.BaseExpression]) -> Optional[int]:
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and isinstance(
            expr.expression, cst.Integer):
        return -int(expr.expression.evaluated_value)
    return None


def _fix_range(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.range(0, 9) -> torch.arange(0, 10): only integer literals, so the end is exact
    if not _plain(call) or len(call.args) not in (2, 3) or any(a.keyword is not None for a in call.args):
        return None
    values = [_int(a.value) for a in call.args]
    if any(v is None for v in values) or (len(values) == 3 and values[2] != 1):
        return None
    start, end = values[0], values[1]
    args = [call.args[0], cst.Arg(cst.Integer(str(end + 1)) if end + 1 >= 0 else cst.parse_expression(str(end + 1)))]
    del start
    return call.with_changes(func=callee, args=args)


def _with_mode(mode: str, align: bool) -> Fix:
    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if not _plain(call) or keyword_arg(call, "mode") is not None:
            return None
        args = with_keyword(list(call.args), "mode", cst.SimpleString(f'"{mode}"'))
        if align:
            args = with_keyword(args, "align_corners", cst.Name("True"))
        return call.with_changes(func=callee, args=args)

    return fix


def _fix_upsampling_module(mode: str, align: bool) -> Fix:
    inner = _with_mode(mode, align)

    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if len(positional_args(call)) > 2:
            return None
        return inner(call, ctx, callee)

    return fix


def _fix_functional_upsampling(mode: str, align: bool) -> Fix:
    inner = _with_mode(mode, align)

    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if len(positional_args(call)) > 3:  # (input, size, scale_factor) line up with interpolate's
            return None
        return inner(call, ctx, callee)

    return fix


_CPU_TENSOR_DTYPES = {"torch.FloatTensor": "float32", "torch.DoubleTensor": "float64", "torch.HalfTensor": "float16",
                      "torch.BFloat16Tensor": "bfloat16"}


def _fix_default_tensor_type(call: cst.Call, ctx: FileContext,
                             callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    if not _plain(call) or len(call.args) != 1:
        return None
    value = call.args[0].value
    name = ctx.qualified_name(value) or string_value(value)
    dtype = _CPU_TENSOR_DTYPES.get(name or "")
    torch_name = local_name_for(ctx, "torch")
    if dtype is None or torch_name is None:
        return None
    return call.with_changes(func=callee, args=[cst.Arg(cst.parse_expression(f"{torch_name}.{dtype}"))])


@dataclass(frozen=True)
class Entry:
    name: str  # fully qualified
    instead: str  # what to write instead (shown)
    deprecated: Version
    removed: Optional[Version] = None
    replacement: Optional[str] = None  # the qualified callee a fix writes
    fix: Optional[Fix] = None
    note: str = ""  # why the new spelling is not a plain rename, when it is not
    package: str = "torch"

    def shown_version(self, version: Version) -> str:
        return ".".join(map(str, version))


_LINALG = (1, 9)
TABLE: dict[str, Entry] = {e.name: e for e in [
    # removed: these raise (RuntimeError stubs, then AttributeError)
    Entry("torch.solve", "torch.linalg.solve(A, B)", _LINALG, (1, 13),
          note="the arguments are swapped and it returns only the solution"),
    Entry("torch.symeig", "torch.linalg.eigh(A) (or torch.linalg.eigvalsh)", _LINALG, (2, 0)),
    Entry("torch.matrix_rank", "torch.linalg.matrix_rank(A)", _LINALG, (1, 13), "torch.linalg.matrix_rank",
          rename(1)),
    Entry("torch.lstsq", "torch.linalg.lstsq(A, B).solution", _LINALG, (1, 13),
          note="the arguments are swapped and the solution is a field of the result"),
    Entry("torch.eig", "torch.linalg.eig(A) (complex results)", _LINALG, (2, 0)),
    # deprecated
    Entry("torch.qr", "torch.linalg.qr(A)", _LINALG, None, "torch.linalg.qr", rename(1)),
    Entry("torch.cholesky", "torch.linalg.cholesky(A)", _LINALG, None, "torch.linalg.cholesky", rename(1)),
    Entry("torch.chain_matmul", "torch.linalg.multi_dot([a, b, c])", _LINALG, None, "torch.linalg.multi_dot",
          _fix_chain_matmul),
    Entry("torch.ger", "torch.outer(a, b)", (1, 8), None, "torch.outer", rename(2)),
    Entry("torch.lu", "torch.linalg.lu_factor(A)", (1, 13), None, "torch.linalg.lu_factor", rename(1)),
    Entry("torch.lu_solve", "torch.linalg.lu_solve(LU, pivots, B)", (1, 13), None, "torch.linalg.lu_solve",
          _fix_lu_solve),
    Entry("torch.triangular_solve", "torch.linalg.solve_triangular(A, B, upper=...)", (1, 11),
          note="the arguments are swapped and `upper` has no default"),
    Entry("torch.range", "torch.arange(start, end + 1)", (0, 4), None, "torch.arange", _fix_range,
          note="torch.range includes its end point"),
    Entry("torch.nn.UpsamplingNearest2d", 'nn.Upsample(..., mode="nearest")', (1, 0), None, "torch.nn.Upsample",
          _fix_upsampling_module("nearest", False)),
    Entry("torch.nn.UpsamplingBilinear2d", 'nn.Upsample(..., mode="bilinear", align_corners=True)', (1, 0), None,
          "torch.nn.Upsample", _fix_upsampling_module("bilinear", True)),
    Entry("torch.nn.functional.upsample", "F.interpolate(...)", (0, 4), None, "torch.nn.functional.interpolate",
          rename(5, ("size", "scale_factor", "mode", "align_corners"))),
    Entry("torch.nn.functional.upsample_nearest", 'F.interpolate(..., mode="nearest")', (0, 4), None,
          "torch.nn.functional.interpolate", _fix_functional_upsampling("nearest", False)),
    Entry("torch.nn.functional.upsample_bilinear", 'F.interpolate(..., mode="bilinear", align_corners=True)', (0, 4),
          None, "torch.nn.functional.interpolate", _fix_functional_upsampling("bilinear", True)),
    Entry("torch.testing.assert_allclose", "torch.testing.assert_close(actual, expected)", (1, 12),
          note="assert_close also checks dtypes and uses dtype-based tolerances"),
    Entry("torch.nn.utils.weight_norm", "torch.nn.utils.parametrizations.weight_norm(module)", (2, 1),
          note="the parametrized weights are stored as `parametrizations.weight.original0/1` in the state dict"),
    Entry("torch.backends.cuda.sdp_kernel", "torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, ...])",
          (2, 3), note="it takes a list of backends instead of enable_* flags"),
    Entry("torch.set_default_tensor_type", "torch.set_default_dtype(...) / torch.set_default_device(...)", (2, 1),
          None, "torch.set_default_dtype", _fix_default_tensor_type),
    *[Entry(f"functorch.{name}", f"torch.func.{name}", (2, 0), None, f"torch.func.{name}", rename(99, (
        "in_dims", "out_dims", "randomness", "chunk_size", "argnums", "has_aux", "reapply_views", "remove",
        "strict", "vectorize", "create_graph")), package="torch")
      for name in ("vmap", "grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "functionalize")],
]}
_LAST_NAMES = {name.rsplit(".", 1)[-1] for name in TABLE}


class _TableRule(Rule):
    """Reports calls of :data:`TABLE` symbols that this rule's family covers."""

    removed_family: bool = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        if last not in _LAST_NAMES:
            return
        entry = TABLE.get(ctx.qualified_name(func) or "")
        if entry is None or in_compat_fallback(ctx, node) or self._has_successor(node, entry, ctx):
            return
        versions = ctx.facts(VersionFacts)
        is_removed = entry.removed is not None and versions.admits(entry.package, entry.removed)
        if is_removed != self.removed_family:
            return
        if not is_removed and not versions.admits(entry.package, entry.deprecated):
            return
        self._report(node, entry, ctx)

    @staticmethod
    def _has_successor(node: cst.Call, entry: Entry, ctx: FileContext) -> bool:
        """``try: from torch import vmap / except ImportError: from functorch import vmap``: the old name is
        the fallback of an import that prefers the new one."""
        if isinstance(node.func, cst.Name):
            binding = ctx.binding(node.func.value)
            if binding is not None and binding.kind == "import" and in_compat_fallback(ctx, binding.node):
                return True
        last = entry.name.rsplit(".", 1)[-1]
        successor = (entry.replacement or "").rsplit(".", 1)[0]
        candidates = {f"{module}.{last}" for module in ("torch", successor) if module} - {entry.name}
        return any(name in ctx.imports.modules for name in candidates)

    def _report(self, node: cst.Call, entry: Entry, ctx: FileContext) -> None:
        replacement = None
        if entry.fix is not None and entry.replacement is not None:
            callee = render_name(ctx, entry.replacement)
            if callee is not None:
                replacement = entry.fix(node, ctx, callee)
        written = short(ctx, node)
        qualified = f" ({code_span(entry.name)})" if not dotted_name(node.func) == entry.name else ""
        if self.removed_family:
            status = (f"was deprecated in PyTorch {entry.shown_version(entry.deprecated)} and removed in "
                      f"{entry.shown_version(entry.removed)}: it raises on current releases")
        else:
            status = f"is deprecated since PyTorch {entry.shown_version(entry.deprecated)}"
        instead = code_span(short(ctx, replacement)) if replacement is not None else code_span(entry.instead)
        note = f" ({entry.note})" if entry.note else ""
        self.report(node, f"{code_span(written)}{qualified} {status}; use {instead}{note}", replacement=replacement)


class RemovedTorchApi(_TableRule):
    id = "TR810"
    slug = "removed-torch-api"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    removed_family = True
    summary = "torch.solve / symeig / matrix_rank / lstsq / eig were removed from PyTorch"
    what = """
        Flags calls of functions that PyTorch has removed: `torch.solve`, `torch.symeig`,
        `torch.matrix_rank`, `torch.lstsq` and `torch.eig` (deprecated in 1.9 for `torch.linalg`).
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
            line=3, message="`torch.solve(B, A)` was deprecated in PyTorch 1.9 and removed in 1.13",
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
        Invalid(
            """
            from torch import symeig
            e, v = symeig(A, eigenvectors=True)
            """,
            line=3, message="torch.linalg.eigh",
        ),
    ]


class DeprecatedTorchApi(_TableRule):
    id = "TR811"
    slug = "deprecated-torch-api"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "Deprecated torch API (torch.qr, torch.cholesky, torch.ger, nn.UpsamplingBilinear2d, functorch, ...)"
    what = """
        Flags calls of deprecated PyTorch functions from one table: `torch.qr`, `torch.cholesky`,
        `torch.chain_matmul`, `torch.ger`, `torch.lu`, `torch.lu_solve`, `torch.triangular_solve`,
        `torch.range`, `nn.UpsamplingNearest2d/UpsamplingBilinear2d`, `F.upsample*`,
        `torch.testing.assert_allclose`, `nn.utils.weight_norm`, `torch.backends.cuda.sdp_kernel`,
        `torch.set_default_tensor_type` and `functorch.*`. Where the successor is a pure rename
        (same arguments, same results) it offers the rewrite. Stays quiet when the repository pins
        a torch release older than the deprecation.
    """
    why = """
        Deprecated functions warn on every call, receive no fixes, and are removed in a later
        release (the `torch.solve` family already was). Their successors (`torch.linalg`,
        `torch.func`, `nn.Upsample`) are the maintained, better documented versions.
    """
    example = """
        q, r = torch.qr(A)
        up = nn.UpsamplingBilinear2d(scale_factor=2)
        m = torch.ger(a, b)
    """
    fix_example = """
        q, r = torch.linalg.qr(A)
        up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        m = torch.outer(a, b)
    """
    VALID = [
        # the old name only as the fallback of an import preferring the new one
        """
        import torch
        def resample(k):
            try:
                from torch import vmap
            except ImportError:
                from functorch import vmap
            return vmap(k)(xs)
        """,
        """
        import torch
        q, r = torch.linalg.qr(A)
        m = torch.outer(a, b)
        xs = torch.arange(0, 10)
        """,
        """
        import torch
        import numpy as np
        q, r = np.linalg.qr(A)
        for i in range(10):
            pass
        """,
        # removed ones are TR810's
        """
        import torch
        x, _ = torch.solve(B, A)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            q, r = torch.qr(A)
            """,
            line=3, message="is deprecated since PyTorch 1.9; use `torch.linalg.qr(A)`",
            fixed="""
            import torch
            q, r = torch.linalg.qr(A)
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            up = nn.UpsamplingBilinear2d(scale_factor=2)
            """,
            line=4,
            fixed="""
            import torch
            from torch import nn
            up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            y = F.upsample(x, scale_factor=2, mode="nearest")
            """,
            line=4,
            fixed="""
            import torch
            import torch.nn.functional as F
            y = F.interpolate(x, scale_factor=2, mode="nearest")
            """,
        ),
        Invalid(
            """
            import torch
            xs = torch.range(0, 9)
            """,
            line=3, message="includes its end point",
            fixed="""
            import torch
            xs = torch.arange(0, 10)
            """,
        ),
        Invalid(
            """
            import torch
            p = torch.chain_matmul(a, b, c)
            s = torch.lu_solve(b, LU, piv)
            """,
            count=2,
            fixed="""
            import torch
            p = torch.linalg.multi_dot([a, b, c])
            s = torch.lu_solve(b, LU, piv)
            """,
        ),
        Invalid(
            """
            import torch
            from functorch import vmap
            batched = vmap(f)(xs)
            """,
            line=4, message="torch.func.vmap",
            fixed="""
            import torch
            from functorch import vmap
            batched = torch.func.vmap(f)(xs)
            """,
        ),
        Invalid(
            """
            import torch
            torch.set_default_tensor_type(torch.DoubleTensor)
            """,
            fixed="""
            import torch
            torch.set_default_dtype(torch.float64)
            """,
        ),
        Invalid(
            """
            import torch
            conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(4, 4, 3))
            """,
            message="parametrizations.weight.original0",
        ),
    ]
