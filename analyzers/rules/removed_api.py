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

from analyzers.context import (FileContext, dotted_name, is_false, is_true, keyword_arg, local_name_for,
                               positional_args, short, string_value)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.flow import subtree
from analyzers.program.names import render_name
from analyzers.program.versions import Version, VersionFacts
from analyzers.rules.base import Invalid, Rule

_NO_SPACE_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))




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
    # torch.range(0, 9) -> torch.arange(0, 10, dtype=torch.get_default_dtype()): the same values (integer literals,
    # so the end is exact) in the same dtype (torch.range makes the default floating dtype, arange an int64)
    if not _plain(call) or len(call.args) not in (2, 3) or any(a.keyword is not None for a in call.args):
        return None
    values = [_int(a.value) for a in call.args]
    if any(v is None for v in values) or (len(values) == 3 and values[2] != 1):
        return None
    default_dtype = render_name(ctx, "torch.get_default_dtype")
    if default_dtype is None:
        return None
    end = values[1] + 1
    args = [call.args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(cst.Integer(str(end)) if end >= 0 else cst.parse_expression(str(end)),
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(cst.Call(default_dtype), keyword=cst.Name("dtype"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))]
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


def _number(expr: Optional[cst.BaseExpression]) -> bool:
    """An int or float literal, possibly negative, or ``float("inf")``."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    return (isinstance(expr, cst.Call) and dotted_name(expr.func) == "float" and len(expr.args) == 1
            and (string_value(expr.args[0].value) or "").lower() in ("inf", "-inf"))


def _fix_norm(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.norm(x[, p][, dim][, keepdim]) -> torch.linalg.vector_norm(x[, ord=p][, dim=..][, keepdim=..]) only when
    # it is a vector norm for sure: p a number (or "fro" over all elements or one dim) and dim absent or one integer.
    # A tuple dim or p="nuc" is a matrix norm, a variable p may be either: those stay message-only.
    if not _plain(call) or not call.args or call.args[0].keyword is not None:
        return None
    names = ("input", "p", "dim", "keepdim")
    given: dict[str, cst.BaseExpression] = {}
    for position, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else names[position] if position < 4 else None
        if name not in names or name in given:
            return None
        given[name] = arg.value
    p, dim = given.get("p"), given.get("dim")
    dim_is_one = dim is None or _int(dim) is not None or (isinstance(dim, cst.Name) and dim.value == "None")
    if not dim_is_one or (p is not None and not _number(p) and string_value(p) != "fro"):
        return None
    args = [cst.Arg(given["input"])]
    if p is not None and string_value(p) != "fro":
        args = with_keyword(args, "ord", p)
    for name in ("dim", "keepdim"):
        if name in given:
            args = with_keyword(args, name, given[name])
    return call.with_changes(func=callee, args=args)


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
    note_only_unfixed: bool = False  # the note explains why some calls get no fix: not shown beside a fix
    package: str = "torch"
    moved: bool = False  # the successor is the same function under another module: an import of it is rewritten

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
    Entry("torch.svd", "torch.linalg.svd(A, full_matrices=False)", _LINALG,
          note="it returns `Vh` (V conjugate-transposed) instead of `V`, so this is not a rename"),
    Entry("torch.triangular_solve", "torch.linalg.solve_triangular(A, B, upper=...)", (1, 11),
          note="the arguments are swapped and `upper` has no default"),
    Entry("torch.norm", "torch.linalg.vector_norm(x, ord, dim) or torch.linalg.matrix_norm(A, ord)", _LINALG, None,
          "torch.linalg.vector_norm", _fix_norm, note="a tuple `dim` or `p='nuc'` asks for a matrix norm",
          note_only_unfixed=True),
    Entry("torch.range", "torch.arange(start, end + 1, dtype=torch.get_default_dtype())", (0, 4), None,
          "torch.arange", _fix_range, note="torch.range includes its end point and makes floats"),
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
    *[Entry(f"torch.nn.init.{name}", f"torch.nn.init.{name}_", (0, 4), None, f"torch.nn.init.{name}_", rename(9, (
        "gain", "a", "b", "mean", "std", "val", "mode", "nonlinearity", "sparsity", "groups", "generator")))
      for name in ("uniform", "normal", "constant", "xavier_uniform", "xavier_normal", "kaiming_uniform",
                   "kaiming_normal", "orthogonal", "sparse")],
    Entry("torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad_norm_", (0, 4), None,
          "torch.nn.utils.clip_grad_norm_", rename(4, ("max_norm", "norm_type", "error_if_nonfinite", "foreach"))),
    Entry("torch.utils._pytree._register_pytree_node", "torch.utils._pytree.register_pytree_node", (2, 2), None,
          "torch.utils._pytree.register_pytree_node",
          rename(3, ("serialized_type_name", "to_dumpable_context", "from_dumpable_context"))),
    Entry("torchvision.transforms.v2.ToTensor", "v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])",
          (0, 16), note="ToTensor converted and rescaled in one step; the v2 pipeline says both",
          package="torchvision"),
    *[Entry(f"functorch.{name}", f"torch.func.{name}", (2, 0), None, f"torch.func.{name}", rename(99, (
        "in_dims", "out_dims", "randomness", "chunk_size", "argnums", "has_aux", "reapply_views", "remove",
        "strict", "vectorize", "create_graph")), package="torch", moved=True)
      for name in ("vmap", "grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "functionalize")],
]}
_LAST_NAMES = {name.rsplit(".", 1)[-1] for name in TABLE}


def module_swap(node: cst.ImportFrom) -> Optional[str]:
    """The module a ``from OLD import a, b`` statement should import from instead, when every name it imports
    is a :data:`TABLE` entry that only moved there (``functorch.vmap`` → ``torch.func.vmap``): rewriting the
    module alone then leaves every call through those names correct."""
    if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
        return None
    module = dotted_name(node.module)
    targets = set()
    for alias in node.names:
        entry = TABLE.get(f"{module}.{dotted_name(alias.name)}")
        if entry is None or not entry.moved or entry.replacement is None:
            return None
        successor, _, name = entry.replacement.rpartition(".")
        if name != entry.name.rsplit(".", 1)[-1]:
            return None
        targets.add(successor)
    return targets.pop() if len(targets) == 1 else None


class ImportBindings:
    """Every import statement of the file, at any depth (the compatibility imports that matter here sit in
    ``try`` blocks inside functions), by the local name it binds; built once per file, on first use."""

    def __init__(self, ctx: FileContext) -> None:
        self.statements: dict[str, list[cst.CSTNode]] = {}
        self.from_pairs: set[tuple[str, str]] = set()  # (qualified, local) of every ``from M import N [as local]``
        for node in subtree(ctx.module):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    local = alias.asname.name.value if alias.asname is not None and \
                        isinstance(alias.asname.name, cst.Name) else (dotted_name(alias.name) or "").split(".")[0]
                    self.statements.setdefault(local, []).append(node)
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar) \
                    and node.module is not None and not node.relative:
                module = dotted_name(node.module)
                for alias in node.names:
                    name = dotted_name(alias.name)
                    local = alias.asname.name.value if alias.asname is not None and \
                        isinstance(alias.asname.name, cst.Name) else name
                    self.from_pairs.add((f"{module}.{name}", local))
                    self.statements.setdefault(local, []).append(node)

    def imported_before(self, local: str, node: cst.CSTNode, ctx: FileContext) -> bool:
        """Some import binding ``local`` starts on a line before ``node``'s."""
        statements = self.statements.get(local, [])
        if not statements:
            return False
        where = ctx.positions([node, *statements])
        return any(where[s].start.line < where[node].start.line for s in statements)


def _successor_callee(call: cst.Call, replacement: str, ctx: FileContext) -> Optional[cst.BaseExpression]:
    """The successor written as the call writes its own prefix (``foo.chain_matmul`` after ``import torch as
    foo`` → ``foo.linalg.multi_dot``, ``xx._register_pytree_node`` → ``xx.register_pytree_node``), else
    through the file's imports, provided the name it starts with is bound where the call stands."""
    written = dotted_name(call.func) or ""
    qualified = ctx.qualified_name(call.func) or ""
    if "." in written and "." in qualified:
        written_prefix, qualified_prefix = written.rsplit(".", 1)[0], qualified.rsplit(".", 1)[0]
        if replacement.startswith(qualified_prefix + "."):
            return cst.parse_expression(written_prefix + replacement[len(qualified_prefix):])
    callee = render_name(ctx, replacement)
    head = (dotted_name(callee) or "").split(".", 1)[0] if callee is not None else ""
    if not head or not ctx.facts(ImportBindings).imported_before(head, call, ctx):
        return None  # ``from torch.utils import _pytree as xx`` below this call does not name it here
    return callee


class _TableRule(Rule):
    """Reports calls of :data:`TABLE` symbols that this rule's family covers."""

    removed_family: bool = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        # a bare name may be an import alias of a table symbol (``from torch import symeig as eigh_old``)
        if last not in _LAST_NAMES and not (isinstance(func, cst.Name) and last in ctx.imports.names):
            return
        entry = TABLE.get(ctx.qualified_name(func) or "")
        if entry is None or in_compat_fallback(ctx, node) or self._has_successor(node, entry, ctx):
            return
        if isinstance(func, cst.Name) and entry.moved and self._import_rewritten(func.value, ctx):
            return  # ``from functorch import vmap``: the import's finding rewrites it, and this call with it
        if self._in_family(entry, ctx):
            self._report(node, entry, ctx)

    def _import_rewritten(self, local: str, ctx: FileContext) -> bool:
        statements = ctx.facts(ImportBindings).statements.get(local, [])
        return bool(statements) and all(isinstance(s, cst.ImportFrom) and module_swap(s) is not None and
                                        not _guarded(ctx, s) for s in statements)

    def visit_Attribute(self, node: cst.Attribute, ctx: FileContext) -> None:
        """A table symbol named but not called here (``transforms=[v2.ToTensor]``, ``solve = torch.qr``)."""
        if node.attr.value not in _LAST_NAMES:
            return
        parent = ctx.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node or isinstance(parent, cst.Attribute):
            return  # a call is visit_Call's; ``torch.qr.__doc__`` is not a use
        entry = TABLE.get(ctx.qualified_name(node) or "")
        if entry is None or in_compat_fallback(ctx, node) or \
                any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(node)):
            return
        if self._in_family(entry, ctx):
            self.report(node, f"{code_span(short(ctx, node))} ({code_span(entry.name)}) {self._status(entry)}; "
                              f"use {code_span(entry.instead)}")

    def _status(self, entry: Entry) -> str:
        library = "PyTorch" if entry.package == "torch" else entry.package
        if self.removed_family:
            return (f"was deprecated in {library} {entry.shown_version(entry.deprecated)} and has since been "
                    f"removed: it raises on current releases")
        return f"is deprecated since {library} {entry.shown_version(entry.deprecated)}"

    def visit_ImportFrom(self, node: cst.ImportFrom, ctx: FileContext) -> None:
        """``from torch import symeig``: on the releases that removed it this line is what raises (an
        ImportError), and for a deprecated symbol it is the line the port changes; calls through the
        imported name are reported where they are, with their own advice."""
        module = dotted_name(node.module) if node.module is not None and not node.relative else None
        if module is None or isinstance(node.names, cst.ImportStar) or _guarded(ctx, node):
            return  # ``try: from torch import symeig / except ImportError:``: the author handles both
        entries = [TABLE[f"{module}.{alias.name.value}"] for alias in node.names
                   if isinstance(alias.name, cst.Name) and f"{module}.{alias.name.value}" in TABLE]
        entries = [e for e in entries if self._in_family(e, ctx)]
        if not entries:
            return
        names = ", ".join(code_span(e.name) for e in entries)
        instead = "; ".join(f"{code_span(e.name.rsplit('.', 1)[-1])} → {code_span(e.instead)}" for e in entries)
        if self.removed_family:
            status = "removed: on current releases this import raises ImportError"
        else:
            status = "deprecated"
        successor = module_swap(node)
        if successor is not None:  # the calls through these names need no change: they are not reported
            self.report(node, f"imports {names}, {status}; import them from {code_span(successor)}, where they "
                              "take the same arguments",
                        replacement=node.with_changes(module=cst.parse_expression(successor)))
            return
        self.report(node, f"imports {names}, {status}; import the successor instead ({instead})")

    def _in_family(self, entry: Entry, ctx: FileContext) -> bool:
        versions = ctx.facts(VersionFacts)
        is_removed = entry.removed is not None and versions.admits(entry.package, entry.removed)
        if is_removed != self.removed_family:
            return False
        return is_removed or versions.admits(entry.package, entry.deprecated)

    @staticmethod
    def _has_successor(node: cst.Call, entry: Entry, ctx: FileContext) -> bool:
        """``try: from torch import vmap / except ImportError: from functorch import vmap``: the old name is
        the fallback of an import that prefers the new one. Only a call through that same bare name counts:
        ``from torch.linalg import qr as new_qr`` elsewhere in the file says nothing about ``torch.qr(A)``."""
        if not isinstance(node.func, cst.Name):
            return False
        binding = ctx.binding(node.func.value)
        if binding is not None and binding.kind == "import" and in_compat_fallback(ctx, binding.node):
            return True
        last = entry.name.rsplit(".", 1)[-1]
        successor = (entry.replacement or "").rsplit(".", 1)[0]
        candidates = {f"{module}.{last}" for module in ("torch", successor) if module} - {entry.name}
        bindings = ctx.facts(ImportBindings).from_pairs
        return any((name, node.func.value) in bindings for name in candidates)

    def _report(self, node: cst.Call, entry: Entry, ctx: FileContext) -> None:
        replacement = None
        if entry.fix is not None and entry.replacement is not None:
            callee = _successor_callee(node, entry.replacement, ctx)
            if callee is not None:
                replacement = entry.fix(node, ctx, callee)
        written = short(ctx, node)
        qualified = f" ({code_span(entry.name)})" if not dotted_name(node.func) == entry.name else ""
        status = self._status(entry)
        instead = code_span(short(ctx, replacement)) if replacement is not None else code_span(entry.instead)
        note = f" ({entry.note})" if entry.note and not (entry.note_only_unfixed and replacement is not None) else ""
        assumed = ctx.facts(VersionFacts).assumption(entry.package)  # the pins the verdict rests on, said
        self.report(node, f"{code_span(written)}{qualified} {status}; use {instead}{note} ({assumed})",
                    replacement=replacement)


class RemovedTorchApi(_TableRule):
    id = "TR810"
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


class DeprecatedTorchApi(_TableRule):
    id = "TR811"
    slug = "deprecated-torch-api"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "Deprecated torch API (torch.qr, torch.cholesky, torch.ger, nn.UpsamplingBilinear2d, functorch, ...)"
    what = """
        Flags calls of deprecated PyTorch functions from one table: `torch.qr`, `torch.cholesky`,
        `torch.chain_matmul`, `torch.ger`, `torch.lu`, `torch.lu_solve`, `torch.svd`,
        `torch.triangular_solve`, `torch.range`, `nn.UpsamplingNearest2d/UpsamplingBilinear2d`,
        `F.upsample*`, `torch.norm`, `torch.testing.assert_allclose`, `nn.utils.weight_norm`,
        `torch.backends.cuda.sdp_kernel`, `torch.set_default_tensor_type`, `functorch.*`, and the
        underscore-less `nn.init.*` / `clip_grad_norm`, the private `_register_pytree_node` and
        torchvision's `transforms.v2.ToTensor`; also the `from ... import` of one of them and a
        mention without a call (`[v2.ToTensor, ...]`). Where the successor is a pure rename (same
        arguments, same results) it offers the rewrite; `from functorch import vmap` becomes
        `from torch.func import vmap`, leaving the calls as they are. Stays quiet when the repository pins a
        torch release older than the deprecation. `torch.norm` (deprecated in its docs, as in
        TorchFix's table) is rewritten only where it is certainly a vector norm: `p` a number and
        `dim` absent or one integer.
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
        # the old function is only the default, replaced where the new one exists
        """
        import torch.nn as nn
        def apply_norm(layer):
            weight_norm = nn.utils.weight_norm
            if hasattr(nn.utils.parametrizations, "weight_norm"):
                weight_norm = nn.utils.parametrizations.weight_norm
            return weight_norm(layer)
        """,
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
        # an import the author guards: the newer spelling is the fallback
        """
        import torch
        try:
            from functorch import vmap
        except ImportError:
            from torch.func import vmap
        """,
        # the successor imported under the old name, the old one only as its fallback
        """
        import torch
        try:
            from torch.func import vmap
        except ImportError:
            from functorch import vmap
        batched = vmap(f)(xs)
        """,
        # the v1 ToTensor is not deprecated; attribute access on a symbol is not a use of it
        """
        import torch
        from torchvision import transforms
        steps = [transforms.ToTensor(), transforms.Normalize(mean, std)]
        doc = torch.qr.__doc__
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
            u, s, v = torch.svd(A)
            """,
            message="returns `Vh`",
        ),
        Invalid(
            """
            import torch
            xs = torch.range(0, 9)
            """,
            line=3, message="includes its end point",
            fixed="""
            import torch
            xs = torch.arange(0, 10, dtype=torch.get_default_dtype())
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
            import functorch
            batched = functorch.vmap(f)(xs)
            """,
            line=4, message="torch.func.vmap",
            fixed="""
            import torch
            import functorch
            batched = torch.func.vmap(f)(xs)
            """,
        ),
        # the import of a deprecated name is the line the port changes; calls through it are reported as well
        Invalid(
            """
            import torch
            from functorch import vmap, jacrev
            batched = vmap(f)(xs)
            """,
            line=3, message="imports `functorch.vmap`, `functorch.jacrev`, deprecated",
            fixed="""
            import torch
            from torch.func import vmap, jacrev
            batched = vmap(f)(xs)
            """,
        ),
        # a name that did not move with the others: the import is reported, the calls are rewritten one by one
        Invalid(
            """
            import torch
            from functorch import make_functional, vmap
            batched = vmap(f)(xs)
            """,
            line=3, count=2, message="import the successor instead (`vmap` → `torch.func.vmap`)",
        ),
        # ``from torch.linalg import qr as new_qr`` elsewhere in the file does not excuse ``torch.qr``
        Invalid(
            """
            import torch
            from torch.linalg import qr as new_qr
            q, r = torch.qr(A)
            """,
            line=4, message="use `torch.linalg.qr(A)`",
            fixed="""
            import torch
            from torch.linalg import qr as new_qr
            q, r = torch.linalg.qr(A)
            """,
        ),
        # the private pytree registration, renamed when it became public
        Invalid(
            """
            import torch
            import torch.utils._pytree as pytree
            pytree._register_pytree_node(Pair, flatten_pair, unflatten_pair)
            """,
            fixed="""
            import torch
            import torch.utils._pytree as pytree
            pytree.register_pytree_node(Pair, flatten_pair, unflatten_pair)
            """,
        ),
        # named without being called: a torchvision v2 pipeline listing the deprecated transform class
        Invalid(
            """
            import torch
            from torchvision.transforms import v2
            steps = [v2.ToTensor, v2.Normalize]
            """,
            line=4, message="is deprecated since torchvision 0.16",
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
            import torch.nn as nn
            nn.init.xavier_uniform(m.weight, gain=2)
            """,
            message="torch.nn.init.xavier_uniform",
            fixed="""
            import torch
            import torch.nn as nn
            nn.init.xavier_uniform_(m.weight, gain=2)
            """,
        ),
        Invalid(
            """
            import torch as T
            dist = T.norm(a - b, dim=1)
            """,
            fixed="""
            import torch as T
            dist = T.linalg.vector_norm(a - b, dim=1)
            """,
        ),
        Invalid(
            """
            import torch
            total = torch.norm(grads, 2.0, -1, True)
            """,
            fixed="""
            import torch
            total = torch.linalg.vector_norm(grads, ord=2.0, dim=-1, keepdim=True)
            """,
        ),
        Invalid(
            """
            import torch
            nuclear = torch.norm(W, p="nuc")
            """,
            message="asks for a matrix norm",
        ),
        Invalid(
            """
            import torch
            conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(4, 4, 3))
            """,
            message="parametrizations.weight.original0",
        ),
    ]


# ---------------------------------------------------------------------------------------------
# TR812

_CHECKPOINT = {"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"}


class CheckpointWithoutUseReentrant(Rule):
    id = "TR812"
    slug = "checkpoint-without-use-reentrant"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.MEDIUM
    summary = "torch.utils.checkpoint.checkpoint without use_reentrant= warns and will raise"
    what = """
        Flags `torch.utils.checkpoint.checkpoint(...)` and `checkpoint_sequential(...)` calls that
        do not pass `use_reentrant=` (unless a `**kwargs` may carry it).
    """
    why = """
        Current PyTorch releases warn on every call that omits `use_reentrant`, and PyTorch has
        announced that it will become an error. The implicit default (`True`, the reentrant variant) is also
        the one to avoid: it does not support `torch.autograd.grad`, keyword inputs, or inputs
        that do not require grad (gradients silently stop flowing through the block when no input
        requires grad, e.g. with frozen embeddings).
    """
    example = """
        x = checkpoint(block, x)
    """
    fix_example = """
        x = checkpoint(block, x, use_reentrant=False)
    """
    VALID = [
        """
        import torch
        from torch.utils.checkpoint import checkpoint
        x = checkpoint(block, x, use_reentrant=False)
        """,
        """
        import torch
        from torch.utils.checkpoint import checkpoint
        x = checkpoint(block, x, **ckpt_kwargs)
        """,
        # a project's own checkpoint helper
        """
        import torch
        from .utils import checkpoint
        x = checkpoint(block, x)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.checkpoint import checkpoint
            def forward(self, x):
                for blk in self.blocks:
                    x = checkpoint(blk, x)
                return x
            """,
            line=6, message="`checkpoint(blk, x)` does not pass `use_reentrant=`",
        ),
        Invalid(
            """
            import torch
            import torch.utils.checkpoint as cp
            y = cp.checkpoint_sequential(self.layers, 4, x)
            """,
            line=4,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        if last not in ("checkpoint", "checkpoint_sequential"):
            return
        if ctx.qualified_name(func) not in _CHECKPOINT:
            return
        if keyword_arg(node, "use_reentrant") is not None or any(a.star == "**" for a in node.args):
            return
        if in_compat_fallback(ctx, node) or not ctx.facts(VersionFacts).admits("torch", (2, 1)):
            return
        self.report(node, f"{code_span(short(ctx, node))} does not pass `use_reentrant=`: PyTorch warns on every call "
                          f"and plans to make it an error, and the implicit reentrant variant drops gradients when no "
                          f"input requires grad; pass `use_reentrant=False` (or `True` to keep today's behavior)")


# ---------------------------------------------------------------------------------------------
# TR813

_PRIVATE_COLLATE_MODULES = {"torch.utils.data._utils.collate", "torch.utils.data.dataloader"}
_PUBLIC_COLLATE = {"default_collate", "default_convert"}


class PrivateDefaultCollate(Rule):
    id = "TR813"
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
    ]
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
    ]

    def visit_ImportFrom(self, node: cst.ImportFrom, ctx: FileContext) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        if module not in _PRIVATE_COLLATE_MODULES:
            return
        names = [dotted_name(alias.name) for alias in node.names]
        public = [n for n in names if n in _PUBLIC_COLLATE]
        if not public or in_compat_fallback(ctx, node) or not ctx.facts(VersionFacts).admits("torch", (1, 11)):
            return
        replacement = None
        if len(public) == len(names):
            replacement = node.with_changes(module=cst.parse_expression("torch.utils.data"))
        self.report(node, f"{code_span(', '.join(public))} imported from the private {code_span(module)}; it is public "
                          f"as {code_span('torch.utils.data.' + public[0])} since PyTorch 1.11", replacement=replacement)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
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


# ---------------------------------------------------------------------------------------------
# TR814

# families whose legacy pretrained=True weights are not named IMAGENET1K_V1
_NON_CLASSIFICATION = ("torchvision.models.detection.", "torchvision.models.segmentation.",
                       "torchvision.models.video.", "torchvision.models.quantization.",
                       "torchvision.models.optical_flow.")


class TorchvisionPretrained(Rule):
    id = "TR814"
    slug = "torchvision-pretrained-argument"
    pinned_package = "torchvision"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "torchvision models take weights=, not the deprecated pretrained="
    what = """
        Flags torchvision model builders called with `pretrained=` (or `pretrained_backbone=`).
        For ImageNet classifiers `pretrained=True` is rewritten to `weights="IMAGENET1K_V1"`
        (exactly the weights it loads) and `pretrained=False` to `weights=None`. Quiet when the
        repository pins torchvision older than 0.13.
    """
    why = """
        `pretrained=` has been deprecated since torchvision 0.13 (it warns on every call) and is
        slated for removal. `weights=` also says which weights: `pretrained=True` silently keeps
        loading the original 2017-era checkpoints while better ones (`IMAGENET1K_V2`,
        `DEFAULT`) exist, each with its own preprocessing in `weights.transforms()`.
    """
    example = """
        model = torchvision.models.resnet50(pretrained=True)
    """
    fix_example = """
        model = torchvision.models.resnet50(weights="IMAGENET1K_V1")
        # or the best available: weights=ResNet50_Weights.DEFAULT
    """
    VALID = [
        """
        import torch
        import torchvision
        model = torchvision.models.resnet50(weights="IMAGENET1K_V1")
        """,
        # a layer helper whose boolean is not its first argument
        """
        import torch
        from torchvision.models.vgg import make_layers, cfgs
        features = make_layers(cfgs["D"], False)
        """,
        # timm / hub models keep pretrained=
        """
        import torch
        import timm
        model = timm.create_model("resnet50", pretrained=True)
        backbone = torch.hub.load("facebookresearch/xcit:main", "xcit_small", pretrained=False)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torchvision
            resnet = torchvision.models.resnet18(pretrained=True)
            """,
            line=4, message="`pretrained=True`",
            fixed="""
            import torch
            import torchvision
            resnet = torchvision.models.resnet18(weights="IMAGENET1K_V1")
            """,
        ),
        Invalid(
            """
            import torch
            from torchvision import models
            vgg = models.vgg19(pretrained=False).features
            """,
            line=4,
            fixed="""
            import torch
            from torchvision import models
            vgg = models.vgg19(weights=None).features
            """,
        ),
        Invalid(
            """
            import torch
            from torchvision.models.detection import fasterrcnn_resnet50_fpn
            model = fasterrcnn_resnet50_fpn(pretrained=args.pretrained)
            """,
            line=4, message="weights=",
        ),
        # the pre-0.13 positional form: a literal boolean first argument is `pretrained`
        Invalid(
            """
            import torch
            import torchvision
            net = torchvision.models.resnet50(True)
            """,
            line=4, message="a positional `pretrained`",
            fixed="""
            import torch
            import torchvision
            net = torchvision.models.resnet50(weights="IMAGENET1K_V1")
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        arg = keyword_arg(node, "pretrained") or keyword_arg(node, "pretrained_backbone")
        positional = positional_args(node)
        if arg is None and positional and (is_true(positional[0].value) or is_false(positional[0].value)):
            # ``resnet50(True)``: before 0.13 the first parameter of every builder was ``pretrained``; a
            # literal boolean first argument can mean nothing else (layer helpers take configs first)
            arg = positional[0]
        if arg is None:
            return
        qualified = ctx.qualified_name(node.func) or ""
        if not qualified.startswith("torchvision.models.") or not qualified.rsplit(".", 1)[-1][:1].islower():
            return
        if not ctx.facts(VersionFacts).admits("torchvision", (0, 13)):
            return
        keyword = arg.keyword.value if arg.keyword is not None else "pretrained"
        replacement = None
        if keyword == "pretrained" and is_false(arg.value):
            new_value: Optional[cst.BaseExpression] = cst.Name("None")
        elif keyword == "pretrained" and is_true(arg.value) and not qualified.startswith(_NON_CLASSIFICATION):
            new_value = cst.SimpleString('"IMAGENET1K_V1"')
        else:
            new_value = None
        if new_value is not None:
            replacement = node.with_changes(args=[a.with_changes(keyword=cst.Name("weights"), value=new_value,
                                                                 equal=a.equal if a.keyword else _NO_SPACE_EQUAL)
                                                  if a is arg else a for a in node.args])
        new_keyword = "weights_backbone" if keyword == "pretrained_backbone" else "weights"
        written = f"`{keyword}=`" if arg.keyword is not None else "a positional `pretrained`"
        self.report(node, f"{code_span(short(ctx, node))}: {written} is deprecated since torchvision 0.13 and warns "
                          f"on every call; pass `{new_keyword}=` (a weights enum or its name, e.g. "
                          f"`\"IMAGENET1K_V1\"`, which is what `pretrained=True` loads)", replacement=replacement)


# ---------------------------------------------------------------------------------------------
# TR815

def _is_builtin_iter(call: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    return (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "iter"
            and ctx.binding("iter") is None and "iter" not in ctx.imports.names and len(call.args) == 1)


class IteratorNextMethod(Rule):
    id = "TR815"
    slug = "iterator-next-method"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "iter(loader).next() is Python 2; it raises AttributeError on current PyTorch"
    what = """
        Flags `.next()` called on an iterator made by `iter(...)`: `dataiter = iter(loader)`
        followed by `dataiter.next()`, or `iter(loader).next()`.
    """
    why = """
        Python 3 iterators have `__next__`, not `next`. DataLoader iterators kept a `next` alias
        for Python 2 until PyTorch removed it, so this line now raises
        `AttributeError: '_SingleProcessDataLoaderIter' object has no attribute 'next'`
        (and on any other iterator it always did).
    """
    example = """
        dataiter = iter(trainloader)
        images, labels = dataiter.next()
    """
    fix_example = """
        dataiter = iter(trainloader)
        images, labels = next(dataiter)
    """
    VALID = [
        """
        import torch
        dataiter = iter(trainloader)
        images, labels = next(dataiter)
        """,
        # an object with its own next() method
        """
        import torch
        sampler = Sampler(data)
        batch = sampler.next()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            dataiter = iter(trainloader)
            images, labels = dataiter.next()
            """,
            line=4, message="`dataiter.next()`",
            fixed="""
            import torch
            dataiter = iter(trainloader)
            images, labels = next(dataiter)
            """,
        ),
        Invalid(
            """
            import torch
            x, y = iter(loader).next()
            """,
            line=3,
            fixed="""
            import torch
            x, y = next(iter(loader))
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "next" or node.args:
            return
        receiver = func.value
        made = receiver if isinstance(receiver, cst.Call) else ctx.assigned_value(receiver)
        if not _is_builtin_iter(made, ctx) or ctx.binding("next") is not None:
            return
        if not ctx.facts(VersionFacts).admits("torch", (2, 0)):
            return
        replacement = cst.Call(func=cst.Name("next"), args=[cst.Arg(receiver)])
        self.report(node, f"{code_span(short(ctx, node))} calls the Python 2 `next()` method, which iterators no longer "
                          f"have (DataLoader iterators dropped it): it raises AttributeError; use "
                          f"{code_span(short(ctx, replacement))}", replacement=replacement)


# ---------------------------------------------------------------------------------------------
# TR816

_REDUCTIONS = {"sum", "mean", "max", "min", "prod", "norm", "std", "var", "item"}


def _scalar_origin(expr: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """Why ``expr`` is a 0-dim tensor: it is a loss, or a full reduction such as ``x.sum()``."""
    name = dotted_name(expr)
    last_name = name.rsplit(".", 1)[-1].lower() if name is not None else ""
    if "loss" in last_name.split("_") or last_name.endswith("loss"):
        return "a loss"
    value = ctx.origin(expr) if name is not None else expr
    if isinstance(value, cst.Call):
        func = value.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if isinstance(func, cst.Attribute) and last in _REDUCTIONS and not value.args and \
                ctx.qualified_name(func) is None:
            return f"a full reduction (`.{last}()`)"
        callee = (dotted_name(func) or "").lower()
        if callee.rsplit(".", 1)[-1] in ("criterion", "loss_fn", "loss_func", "loss_function", "lossfn") or \
                callee.endswith("_loss"):
            return "a loss"
    return None


class IndexZeroDimData(Rule):
    id = "TR816"
    slug = "index-zero-dim-tensor"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "loss.data[0] indexes a 0-dim tensor: an IndexError since PyTorch 0.5; use loss.item()"
    what = """
        Flags `x.data[0]` where `x` is a scalar: a loss (a name containing "loss", or the result
        of `criterion(...)` / `F.*_loss(...)`) or a full reduction such as `(pred == y).sum()`.
    """
    why = """
        Before PyTorch 0.4 losses were 1-element vectors and `loss.data[0]` read the number.
        Losses are 0-dim tensors now, and indexing one raises `IndexError: invalid index of a
        0-dim tensor. Use tensor.item()`: the training loop crashes on its first log line.
    """
    example = """
        total += loss.data[0]
    """
    fix_example = """
        total += loss.item()
    """
    VALID = [
        """
        import torch
        total += loss.item()
        first = outputs.data[0]
        """,
        # indexing a batch of per-sample losses
        """
        import torch
        losses = criterion_none(out, y)
        worst = losses.data[0]
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                print(loss.data[0])
            """,
            line=6, message="`loss.data[0]`",
            fixed="""
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                print(loss.item())
            """,
        ),
        Invalid(
            """
            import torch
            correct = (pred == labels).sum()
            acc = correct.data[0] / total
            """,
            line=4, message="full reduction",
            fixed="""
            import torch
            correct = (pred == labels).sum()
            acc = correct.item() / total
            """,
        ),
    ]

    def visit_Subscript(self, node: cst.Subscript, ctx: FileContext) -> None:
        value = node.value
        if not isinstance(value, cst.Attribute) or value.attr.value != "data" or len(node.slice) != 1:
            return
        index = node.slice[0].slice
        if not isinstance(index, cst.Index) or not isinstance(index.value, cst.Integer) or index.value.value != "0":
            return
        if isinstance(ctx.parent(node), (cst.AssignTarget, cst.AugAssign)):
            return
        why = _scalar_origin(value.value, ctx)
        if why is None or not ctx.facts(VersionFacts).admits("torch", (0, 5)):
            return
        replacement = cst.Call(func=cst.Attribute(value.value, cst.Name("item")))
        self.report(node, f"{code_span(short(ctx, node))} indexes {code_span(short(ctx, value.value))}, {why} and so a "
                          f"0-dim tensor: this raises IndexError since PyTorch 0.5; use "
                          f"{code_span(short(ctx, replacement))}", replacement=replacement)


# ---------------------------------------------------------------------------------------------
# TR817

# NumPy aliases of Python builtins: deprecated in 1.20, removed in 1.24 (np.long came back in 2.0 as C long)
_NUMPY_ALIASES = {"numpy.float": "float", "numpy.int": "int", "numpy.bool": "bool", "numpy.object": "object",
                  "numpy.str": "str", "numpy.complex": "complex", "numpy.unicode": "str"}


class RemovedNumpyAlias(Rule):
    id = "TR817"
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


# ---------------------------------------------------------------------------------------------
# TR818

_LEGACY_REDUCTION = ("size_average", "reduce")


def _reduction(size_average: Optional[cst.Arg], reduce: Optional[cst.Arg]) -> Optional[str]:
    """torch's legacy_get_string: the reduction the two legacy flags meant (None when not literal)."""
    values = []
    for arg in (size_average, reduce):
        if arg is None:
            values.append(True)
        elif is_true(arg.value):
            values.append(True)
        elif is_false(arg.value):
            values.append(False)
        else:
            return None
    size, red = values
    if not red:
        return "none"
    return "mean" if size else "sum"


class LegacyLossReductionArguments(Rule):
    id = "TR818"
    slug = "legacy-loss-reduction-arguments"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "size_average= / reduce= on losses are deprecated; use reduction="
    what = """
        Flags `size_average=` and `reduce=` passed to `torch.nn` loss modules and
        `torch.nn.functional` loss functions, and rewrites them to the equivalent `reduction=`
        when their values are literals.
    """
    why = """
        Both arguments have been deprecated since PyTorch 0.4.1 and warn on every call; their
        combination is hard to read (`size_average=False` means *sum*, `reduce=False` means
        *no reduction* whatever `size_average` says). `reduction="mean" | "sum" | "none"` says it
        directly.
    """
    example = """
        loss = F.binary_cross_entropy(recon, x, size_average=False)
    """
    fix_example = """
        loss = F.binary_cross_entropy(recon, x, reduction="sum")
    """
    VALID = [
        """
        import torch
        import torch.nn.functional as F
        loss = F.binary_cross_entropy(recon, x, reduction="sum")
        crit = torch.nn.MSELoss(reduction="none")
        """,
        """
        import torch
        out = my_loss(x, y, size_average=False)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = F.binary_cross_entropy(recon, x, size_average=False)
            """,
            line=4, message='`reduction="sum"`',
            fixed="""
            import torch
            import torch.nn.functional as F
            loss = F.binary_cross_entropy(recon, x, reduction="sum")
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            crit = nn.CrossEntropyLoss(reduce=False)
            """,
            line=4,
            fixed="""
            import torch
            from torch import nn
            crit = nn.CrossEntropyLoss(reduction="none")
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        size_average, reduce = keyword_arg(node, "size_average"), keyword_arg(node, "reduce")
        if size_average is None and reduce is None:
            return
        qualified = ctx.qualified_name(node.func) or ""
        last = qualified.rsplit(".", 1)[-1]
        is_module = qualified.startswith("torch.nn.") and last.endswith("Loss")
        is_function = qualified.startswith("torch.nn.functional.") and (
            "loss" in last or last in ("binary_cross_entropy", "cross_entropy", "kl_div", "nll_loss"))
        if not (is_module or is_function):
            return
        reduction = _reduction(size_average, reduce)
        replacement = None
        if reduction is not None and keyword_arg(node, "reduction") is None:
            args = [a for a in node.args if a is not size_average and a is not reduce]
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            replacement = node.with_changes(args=with_keyword(args, "reduction", cst.SimpleString(f'"{reduction}"')))
        written = ", ".join(code_span(short(ctx, a, 40)) for a in (size_average, reduce) if a is not None)
        instead = f'`reduction="{reduction}"`' if reduction is not None else '`reduction="mean" | "sum" | "none"`'
        self.report(node, f"{code_span(short(ctx, node))} passes {written}, deprecated since PyTorch 0.4.1 (a warning "
                          f"on every call); use {instead}", replacement=replacement)


# ---------------------------------------------------------------------------------------------
# TR819

_SOFTMAX_FUNCTIONS = {"torch.nn.functional.softmax", "torch.nn.functional.log_softmax", "torch.nn.functional.softmin"}
_SOFTMAX_MODULES = {"torch.nn.Softmax", "torch.nn.LogSoftmax", "torch.nn.Softmin", "torch.nn.Softmax2d"}


class ImplicitSoftmaxDim(Rule):
    id = "TR819"
    slug = "implicit-softmax-dim"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "F.softmax / nn.Softmax without dim= guess the dimension (deprecated)"
    what = """
        Flags `F.softmax`, `F.log_softmax`, `F.softmin` calls and `nn.Softmax()`,
        `nn.LogSoftmax()`, `nn.Softmin()` modules created without `dim`.
    """
    why = """
        Without `dim` PyTorch guesses: dimension 0 for 0-, 1- and 3-D inputs, 1 otherwise, and
        warns that the implicit choice is deprecated. For a batch of sequences (3-D) that guess
        normalizes across the batch instead of the classes, silently; for a single sample vs a
        batch the same line normalizes different axes.
    """
    example = """
        probs = F.softmax(logits)
        self.act = nn.LogSoftmax()
    """
    fix_example = """
        probs = F.softmax(logits, dim=-1)
        self.act = nn.LogSoftmax(dim=1)
    """
    VALID = [
        """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        probs = F.softmax(logits, dim=-1)
        act = nn.LogSoftmax(1)
        p = F.softmax(logits, -1)
        """,
        """
        import torch
        import torch.nn.functional as F
        probs = F.softmax(logits, **kwargs)
        s = nn.Softmax2d()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            probs = F.softmax(logits)
            """,
            line=4, message="`F.softmax(logits)`",
        ),
        Invalid(
            """
            import torch
            from torch import nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.out = nn.LogSoftmax()
            """,
            line=7,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last not in ("softmax", "log_softmax", "softmin", "Softmax", "LogSoftmax", "Softmin"):
            return
        qualified = ctx.qualified_name(func) or ""
        if any(a.star for a in node.args) or keyword_arg(node, "dim") is not None:
            return
        if qualified in _SOFTMAX_FUNCTIONS:
            if len(positional_args(node)) >= 2 or keyword_arg(node, "_stacklevel") is not None:
                return
        elif qualified in _SOFTMAX_MODULES - {"torch.nn.Softmax2d"}:
            if positional_args(node):
                return
        else:
            return
        self.report(node, f"{code_span(short(ctx, node))} has no `dim`: PyTorch guesses (dimension 0 for 1-D and 3-D "
                          f"inputs, 1 otherwise) and warns that the guess is deprecated; pass the class dimension, "
                          f"e.g. `dim=-1`")


# ---------------------------------------------------------------------------------------------
# TR820

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


def _guarded(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Inside ``try:`` with an ImportError handler, or under an ``if`` on a version: the author handles both."""
    previous: cst.CSTNode = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.Try) and previous is ancestor.body and ancestor.handlers:
            for handler in ancestor.handlers:
                if handler.type is None:
                    return True
                text = ctx.module.code_for_node(handler.type)
                if any(word in text for word in ("ImportError", "ModuleNotFoundError", "Exception")):
                    return True
        if isinstance(ancestor, cst.If) and "version" in ctx.module.code_for_node(ancestor.test).lower():
            return True
        previous = ancestor
    return in_compat_fallback(ctx, node)


class RemovedModuleImport(Rule):
    id = "TR820"
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
        if _guarded(ctx, node) or not ctx.facts(VersionFacts).admits(package, removed):
            return
        release = ".".join(map(str, removed))
        if symbols:
            what = f"{', '.join(code_span(s) for s in symbols)} from {code_span(module)} were removed in {package} {release}"
        else:
            what = f"{code_span(module)} was removed in {package} {release}"
        self.report(node, f"{what}: this import raises ImportError on current releases; use {instead}",
                    replacement=replacement, pins=package)


# ---------------------------------------------------------------------------------------------
# TR821

_AUTOGRAD_FUNCTION = {"torch.autograd.Function", "torch.autograd.function.Function"}


class LegacyAutogradFunction(Rule):
    id = "TR821"
    slug = "legacy-autograd-function"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "torch.autograd.Function with an instance-method forward: a legacy API that now raises"
    what = """
        Flags subclasses of `torch.autograd.Function` whose `forward` (or `backward`) is an
        ordinary method instead of a `@staticmethod` taking `ctx`.
    """
    why = """
        Old-style autograd functions (`self.save_for_backward`, `MyFn()(x)`) were deprecated in
        PyTorch 1.3 and then removed: calling one raises `RuntimeError: Legacy autograd function
        with non-static forward method is deprecated`, so the layer that uses it crashes on the
        first forward pass.
    """
    example = """
        class Clamp(torch.autograd.Function):
            def forward(self, x):
                self.save_for_backward(x)
                return x.clamp(0, 1)
            def backward(self, grad):
                x, = self.saved_tensors
                return grad * ((x > 0) & (x < 1))
        y = Clamp()(x)
    """
    fix_example = """
        class Clamp(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.clamp(0, 1)
            @staticmethod
            def backward(ctx, grad):
                x, = ctx.saved_tensors
                return grad * ((x > 0) & (x < 1))
        y = Clamp.apply(x)
    """
    VALID = [
        """
        import torch
        class Swish(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * torch.sigmoid(x)
            @staticmethod
            def backward(ctx, grad):
                x, = ctx.saved_tensors
                s = torch.sigmoid(x)
                return grad * (s * (1 + x * (1 - s)))
        """,
        """
        import torch
        from torch import nn
        class Net(nn.Module):
            def forward(self, x):
                return x
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            class Clamp(torch.autograd.Function):
                def forward(self, x):
                    self.save_for_backward(x)
                    return x.clamp(0, 1)
                @staticmethod
                def backward(ctx, grad):
                    return grad
            """,
            line=4, message="`Clamp.forward`",
        ),
        Invalid(
            """
            import torch
            from torch.autograd import Function
            class Round(Function):
                @staticmethod
                def forward(ctx, x):
                    return x.round()
                def backward(self, grad):
                    return grad
            """,
            line=8, message="`Round.backward`",
        ),
    ]

    def visit_ClassDef(self, node: cst.ClassDef, ctx: FileContext) -> None:
        if not any(ctx.qualified_name(base.value) in _AUTOGRAD_FUNCTION for base in node.bases):
            return
        if not isinstance(node.body, cst.IndentedBlock) or not ctx.facts(VersionFacts).admits("torch", (1, 5)):
            return
        for statement in node.body.body:
            if not isinstance(statement, cst.FunctionDef) or statement.name.value not in ("forward", "backward"):
                continue
            decorators = {dotted_name(d.decorator) for d in statement.decorators}
            if decorators & {"staticmethod", "classmethod"}:
                continue
            name = f"{node.name.value}.{statement.name.value}"
            self.report(statement.name, f"{code_span(name)} is an instance method: legacy autograd Functions "
                                        f"(non-static `forward`/`backward`, called as {code_span(node.name.value + '()(x)')}) raise "
                                        f"RuntimeError on current PyTorch; make both `@staticmethod`s taking `ctx` "
                                        f"and call {code_span(node.name.value + '.apply(...)')}")
            return


# ---------------------------------------------------------------------------------------------
# TR822

# scipy.misc image helpers: deprecated in SciPy 1.0, removed in 1.2 (imresize in 1.3)
_SCIPY_MISC = {
    "imread": "`imageio.v3.imread(path)` or `PIL.Image.open(path)`",
    "imsave": "`imageio.v3.imwrite(path, image)` or `PIL.Image.fromarray(image).save(path)`",
    "imresize": "`PIL.Image.fromarray(image).resize(size)` or `skimage.transform.resize`",
    "toimage": "`PIL.Image.fromarray(array)`",
    "fromimage": "`numpy.asarray(image)`",
    "imrotate": "`PIL.Image.rotate` or `scipy.ndimage.rotate`",
    "imfilter": "`PIL.ImageFilter`",
    "bytescale": "an explicit rescale to uint8",
}


class RemovedScipyMiscImage(Rule):
    id = "TR822"
    slug = "removed-scipy-misc-image"
    pinned_package = "scipy"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "scipy.misc.imread / imsave / imresize / toimage were removed from SciPy"
    what = """
        Flags `scipy.misc.imread`, `imsave`, `imresize`, `toimage`, `fromimage`, `imrotate`,
        `imfilter` and `bytescale`, used as attributes or imported from `scipy.misc`. Quiet when
        the repository pins SciPy below 1.3.
    """
    why = """
        These PIL wrappers were deprecated in SciPy 1.0 and removed in 1.2 (`imresize` in
        1.3): the call raises AttributeError (the import, ImportError) on every current install,
        typically when a training script first saves sample images, hours into a run.
    """
    example = """
        scipy.misc.imsave(path, merged)
    """
    fix_example = """
        imageio.v3.imwrite(path, merged)
    """
    VALID = [
        """
        import torch
        import imageio
        from scipy import ndimage
        imageio.v3.imwrite(path, merged)
        face = scipy.datasets.face()
        """,
        """
        import torch
        try:
            from scipy.misc import imread
        except ImportError:
            from imageio import imread
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import scipy.misc
            def save_samples(path, merged):
                scipy.misc.imsave(path, merged)
            """,
            line=5, message="`scipy.misc.imsave`",
        ),
        Invalid(
            """
            import torch
            from scipy.misc import imread, imresize
            """,
            line=3, message="`imread`, `imresize`",
        ),
    ]

    def visit_Attribute(self, node: cst.Attribute, ctx: FileContext) -> None:
        name = node.attr.value
        if name not in _SCIPY_MISC or ctx.qualified_name(node) != f"scipy.misc.{name}":
            return
        if _guarded(ctx, node) or not ctx.facts(VersionFacts).admits("scipy", (1, 3)):
            return
        self.report(node, f"{code_span(short(ctx, node))} was removed from SciPy (1.2/1.3): it raises AttributeError on "
                          f"current installs; use {_SCIPY_MISC[name]}")

    def visit_ImportFrom(self, node: cst.ImportFrom, ctx: FileContext) -> None:
        if node.relative or node.module is None or dotted_name(node.module) != "scipy.misc" or \
                isinstance(node.names, cst.ImportStar):
            return
        removed = [n for n in (dotted_name(a.name) for a in node.names) if n in _SCIPY_MISC]
        if not removed or _guarded(ctx, node) or not ctx.facts(VersionFacts).admits("scipy", (1, 3)):
            return
        shown = ", ".join(code_span(n) for n in removed)
        instead = "; ".join(f"{code_span(n)}: {_SCIPY_MISC[n]}" for n in removed)
        self.report(node, f"{shown} from `scipy.misc` were removed from SciPy (1.2/1.3): this import raises "
                          f"ImportError on current installs; use instead {instead}")
