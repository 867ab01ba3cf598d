"""What TR810, TR811, TR814, TR818, TR820 and TR822 share.

One table lists every deprecated symbol with the release that deprecated it, the release that removed it
(if any), what to use instead and, where the new call is a pure rename, how to rewrite it. TR810 reports the
removed ones (they crash), TR811 the deprecated ones. Both consult :class:`~analyzers.program.versions.
VersionFacts`: a repository pinned to ``torch==1.7`` is not told that ``torch.qr`` is deprecated in 1.9.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, keyword_arg, local_name_for,
                               positional_args, short, string_value)
from analyzers.markdown import code_span
from analyzers.program import in_compat_fallback
from analyzers.program.names import render_name
from analyzers.program.versions import Version, VersionFacts
from analyzers.rules.base import Rule
from analyzers.program.roles import ImportBindings, handles_other_versions


NO_SPACE_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def with_keyword(args: list[cst.Arg], name: str, value: cst.BaseExpression) -> list[cst.Arg]:
    new = cst.Arg(value, keyword=cst.Name(name), equal=NO_SPACE_EQUAL)
    if not args:
        return [new]
    last = args[-1]
    return [*args[:-1], last.with_changes(comma=COMMA), new]


def plain(call: cst.Call) -> bool:
    return not any(a.star for a in call.args)


# ---- fixes: (call, ctx, new callee) -> the rewritten call or None ----------------------------------
Fix = Callable[[cst.Call, FileContext, cst.BaseExpression], Optional[cst.BaseExpression]]


def rename(max_positional: int, keywords: tuple[str, ...] = ()) -> Fix:
    """A pure rename when the call passes at most ``max_positional`` arguments and only ``keywords``."""

    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if not plain(call) or len(positional_args(call)) > max_positional:
            return None
        if any(a.keyword is not None and a.keyword.value not in keywords for a in call.args):
            return None
        return call.with_changes(func=callee)

    return fix


def fix_chain_matmul(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.chain_matmul(a, b, c, out=o) -> torch.linalg.multi_dot([a, b, c], out=o): multi_dot takes out= too
    matrices = positional_args(call)
    if not plain(call) or len(matrices) < 2 or any(a.keyword is not None and a.keyword.value != "out"
                                                   for a in call.args):
        return None
    elements = [cst.Element(a.value, comma=COMMA if i < len(matrices) - 1 else cst.MaybeSentinel.DEFAULT)
                for i, a in enumerate(matrices)]
    out = keyword_arg(call, "out")
    args = [cst.Arg(cst.List(elements))]
    return call.with_changes(func=callee, args=with_keyword(args, "out", out.value) if out is not None else args)


def _literal_flag(call: cst.Call, position: int, name: str) -> Optional[bool]:
    """The value of a boolean parameter written as a literal, False... when absent; None when not a literal."""
    value = argument(call, position, name)
    if value is None:
        return None if any(a.keyword is not None and a.keyword.value == name for a in call.args) else False
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return None


def _only(call: cst.Call, max_positional: int, keywords: tuple[str, ...]) -> bool:
    return plain(call) and len(positional_args(call)) <= max_positional and \
        all(a.keyword is None or a.keyword.value in keywords for a in call.args)


def fix_qr(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.qr(A, some=True) is linalg.qr(A) (mode="reduced", the default); some=False is mode="complete"
    some = _literal_flag(call, 1, "some") if _only(call, 2, ("some",)) and positional_args(call) else None
    if some is None:
        return None
    matrix = [call.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    some_given = argument(call, 1, "some") is not None
    args = matrix if some or not some_given else with_keyword(matrix, "mode", cst.SimpleString('"complete"'))
    return call.with_changes(func=callee, args=args)


def fix_cholesky(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.cholesky(A) is linalg.cholesky(A); with upper=True it returns U = L^H: linalg.cholesky(A).mH (torch 1.11+)
    upper = _literal_flag(call, 1, "upper") if _only(call, 2, ("upper",)) and positional_args(call) else None
    if upper is None or (upper and not ctx.facts(VersionFacts).admits("torch", (1, 11))):
        return None
    new = call.with_changes(func=callee, args=[call.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
    return cst.Attribute(new, cst.Name("mH")) if upper else new


def fix_lu_solve(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.lu_solve(b, LU, pivots) -> torch.linalg.lu_solve(LU, pivots, b)
    if not plain(call) or len(call.args) != 3 or any(a.keyword is not None for a in call.args):
        return None
    b, lu, pivots = (a.value for a in call.args)
    return call.with_changes(func=callee, args=[cst.Arg(lu, comma=COMMA), cst.Arg(pivots, comma=COMMA), cst.Arg(b)])


def integer_value(expr: Optional[cst.BaseExpression]) -> Optional[int]:
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and isinstance(
            expr.expression, cst.Integer):
        return -int(expr.expression.evaluated_value)
    return None


def fix_range(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.range(0, 9) -> torch.arange(0, 10, dtype=torch.get_default_dtype()): the same values (integer literals,
    # so the end is exact) in the same dtype (torch.range makes the default floating dtype, arange an int64)
    if not plain(call) or len(call.args) not in (2, 3) or any(a.keyword is not None for a in call.args):
        return None
    values = [integer_value(a.value) for a in call.args]
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


def with_mode(mode: str, align: bool) -> Fix:
    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if not plain(call) or keyword_arg(call, "mode") is not None:
            return None
        args = with_keyword(list(call.args), "mode", cst.SimpleString(f'"{mode}"'))
        if align:
            args = with_keyword(args, "align_corners", cst.Name("True"))
        return call.with_changes(func=callee, args=args)

    return fix


def fix_upsampling_module(mode: str, align: bool) -> Fix:
    inner = with_mode(mode, align)

    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if len(positional_args(call)) > 2:
            return None
        return inner(call, ctx, callee)

    return fix


def fix_functional_upsampling(mode: str, align: bool) -> Fix:
    inner = with_mode(mode, align)

    def fix(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if len(positional_args(call)) > 3:  # (input, size, scale_factor) line up with interpolate's
            return None
        return inner(call, ctx, callee)

    return fix


def number(expr: Optional[cst.BaseExpression]) -> bool:
    """An int or float literal, possibly negative, or ``float("inf")``."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    return (isinstance(expr, cst.Call) and dotted_name(expr.func) == "float" and len(expr.args) == 1
            and (string_value(expr.args[0].value) or "").lower() in ("inf", "-inf"))


def fix_norm(call: cst.Call, ctx: FileContext, callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    # torch.norm(x[, p][, dim][, keepdim]) -> torch.linalg.vector_norm(x[, ord=p][, dim=..][, keepdim=..]) only when
    # it is a vector norm for sure: p a number (or "fro" over all elements or one dim) and dim absent or one integer.
    # A tuple dim or p="nuc" is a matrix norm, a variable p may be either: those stay message-only.
    if not plain(call) or not call.args or call.args[0].keyword is not None:
        return None
    names = ("input", "p", "dim", "keepdim")
    given: dict[str, cst.BaseExpression] = {}
    for position, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else names[position] if position < 4 else None
        if name not in names or name in given:
            return None
        given[name] = arg.value
    p, dim = given.get("p"), given.get("dim")
    dim_is_one = dim is None or integer_value(dim) is not None or (isinstance(dim, cst.Name) and dim.value == "None")
    if not dim_is_one or (p is not None and not number(p) and string_value(p) != "fro"):
        return None
    args = [cst.Arg(given["input"])]
    if p is not None and string_value(p) != "fro":
        args = with_keyword(args, "ord", p)
    for name in ("dim", "keepdim"):
        if name in given:
            args = with_keyword(args, name, given[name])
    return call.with_changes(func=callee, args=args)


CPU_TENSOR_DTYPES = {"torch.FloatTensor": "float32", "torch.DoubleTensor": "float64", "torch.HalfTensor": "float16",
                      "torch.BFloat16Tensor": "bfloat16"}


def fix_default_tensor_type(call: cst.Call, ctx: FileContext,
                             callee: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    if not plain(call) or len(call.args) != 1:
        return None
    value = call.args[0].value
    name = ctx.qualified_name(value) or string_value(value)
    dtype = CPU_TENSOR_DTYPES.get(name or "")
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


LINALG = (1, 9)
TABLE: dict[str, Entry] = {e.name: e for e in [
    # removed: these raise (RuntimeError stubs, then AttributeError)
    Entry("torch.solve", "torch.linalg.solve(A, B)", LINALG, (1, 13),
          note="the arguments are swapped and it returns only the solution"),
    Entry("torch.symeig", "torch.linalg.eigh(A) (or torch.linalg.eigvalsh)", LINALG, (2, 0)),
    Entry("torch.matrix_rank", "torch.linalg.matrix_rank(A)", LINALG, (1, 13), "torch.linalg.matrix_rank",
          rename(1)),
    Entry("torch.lstsq", "torch.linalg.lstsq(A, B).solution", LINALG, (1, 13),
          note="the arguments are swapped and the solution is a field of the result"),
    Entry("torch.eig", "torch.linalg.eig(A) (complex results)", LINALG, (2, 0)),
    # deprecated
    Entry("torch.qr", "torch.linalg.qr(A)", LINALG, None, "torch.linalg.qr", fix_qr),
    Entry("torch.cholesky", "torch.linalg.cholesky(A)", LINALG, None, "torch.linalg.cholesky", fix_cholesky),
    Entry("torch.chain_matmul", "torch.linalg.multi_dot([a, b, c])", LINALG, None, "torch.linalg.multi_dot",
          fix_chain_matmul),
    Entry("torch.ger", "torch.outer(a, b)", (1, 8), None, "torch.outer", rename(2)),
    Entry("torch.lu", "torch.linalg.lu_factor(A)", (1, 13), None, "torch.linalg.lu_factor", rename(1)),
    Entry("torch.lu_solve", "torch.linalg.lu_solve(LU, pivots, B)", (1, 13), None, "torch.linalg.lu_solve",
          fix_lu_solve),
    Entry("torch.svd", "torch.linalg.svd(A, full_matrices=False)", LINALG,
          note="it returns `Vh` (V conjugate-transposed) instead of `V`, so this is not a rename"),
    Entry("torch.triangular_solve", "torch.linalg.solve_triangular(A, B, upper=...)", (1, 11),
          note="the arguments are swapped and `upper` has no default"),
    Entry("torch.norm", "torch.linalg.vector_norm(x, ord, dim) or torch.linalg.matrix_norm(A, ord)", LINALG, None,
          "torch.linalg.vector_norm", fix_norm, note="a tuple `dim` or `p='nuc'` asks for a matrix norm",
          note_only_unfixed=True),
    Entry("torch.range", "torch.arange(start, end + 1, dtype=torch.get_default_dtype())", (0, 4), None,
          "torch.arange", fix_range, note="torch.range includes its end point and makes floats"),
    Entry("torch.nn.UpsamplingNearest2d", 'nn.Upsample(..., mode="nearest")', (1, 0), None, "torch.nn.Upsample",
          fix_upsampling_module("nearest", False)),
    Entry("torch.nn.UpsamplingBilinear2d", 'nn.Upsample(..., mode="bilinear", align_corners=True)', (1, 0), None,
          "torch.nn.Upsample", fix_upsampling_module("bilinear", True)),
    Entry("torch.nn.functional.upsample", "F.interpolate(...)", (0, 4), None, "torch.nn.functional.interpolate",
          rename(5, ("size", "scale_factor", "mode", "align_corners"))),
    Entry("torch.nn.functional.upsample_nearest", 'F.interpolate(..., mode="nearest")', (0, 4), None,
          "torch.nn.functional.interpolate", fix_functional_upsampling("nearest", False)),
    Entry("torch.nn.functional.upsample_bilinear", 'F.interpolate(..., mode="bilinear", align_corners=True)', (0, 4),
          None, "torch.nn.functional.interpolate", fix_functional_upsampling("bilinear", True)),
    Entry("torch.testing.assert_allclose", "torch.testing.assert_close(actual, expected)", (1, 12),
          note="assert_close also checks dtypes and uses dtype-based tolerances"),
    Entry("torch.nn.utils.weight_norm", "torch.nn.utils.parametrizations.weight_norm(module)", (2, 1),
          note="the parametrized weights are stored as `parametrizations.weight.original0/1` in the state dict"),
    Entry("torch.backends.cuda.sdp_kernel", "torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, ...])",
          (2, 3), note="it takes a list of backends instead of enable_* flags"),
    Entry("torch.set_default_tensor_type", "torch.set_default_dtype(...) / torch.set_default_device(...)", (2, 1),
          None, "torch.set_default_dtype", fix_default_tensor_type),
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
LAST_NAMES = {name.rsplit(".", 1)[-1] for name in TABLE}


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


def successor_callee(call: cst.Call, replacement: str, ctx: FileContext) -> Optional[cst.BaseExpression]:
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


class TableRule(Rule):
    """Reports calls of :data:`TABLE` symbols that this rule's family covers."""

    removed_family: bool = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        # a bare name may be an import alias of a table symbol (``from torch import symeig as eigh_old``)
        if last not in LAST_NAMES and not (isinstance(func, cst.Name) and last in ctx.imports.names):
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
                                        not handles_other_versions(ctx, s) for s in statements)

    def visit_Attribute(self, node: cst.Attribute, ctx: FileContext) -> None:
        """A table symbol named but not called here (``transforms=[v2.ToTensor]``, ``solve = torch.qr``)."""
        if node.attr.value not in LAST_NAMES:
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
        if module is None or isinstance(node.names, cst.ImportStar) or handles_other_versions(ctx, node):
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
            callee = successor_callee(node, entry.replacement, ctx)
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


