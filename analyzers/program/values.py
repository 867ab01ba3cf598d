"""What a variable holds, asked after the walk: which model class a name was built from."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name
from analyzers.program.flow import assignment_before, call_site_values

# Methods and wrappers that return the module they are given.
MODULE_CHAIN = {"to", "cuda", "cpu", "eval", "train", "half", "float", "double", "bfloat16", "requires_grad_",
                "share_memory"}
MODULE_WRAPPERS = {"torch.compile", "torch.nn.DataParallel", "torch.nn.parallel.DistributedDataParallel",
                   "torch.nn.parallel.DataParallel", "copy.deepcopy"}
LIBRARY_ROOTS = {"torch", "torchvision", "torchaudio", "torchtext", "transformers", "timm", "lightning",
                 "pytorch_lightning", "numpy", "sklearn", "tensorflow", "jax", "flax", "diffusers", "accelerate"}


def _enclosing_function(ctx: FileContext, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            return ancestor
    return None


def constructor(ctx: FileContext, expr: Optional[cst.BaseExpression], use: cst.CSTNode,
                depth: int = 0) -> Optional[cst.Call]:
    """The call that built a model: ``Net(...)`` for ``model`` after ``model = Net().to(device)``, through
    ``.to()``/``.cuda()``/``torch.compile``/DDP wrappers, assignments (also module-level ones read inside a
    function) and parameters whose callers in the file all pass one constructor."""
    if expr is None or depth > 6:
        return None
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in MODULE_CHAIN and ctx.qualified_name(func) is None:
            return constructor(ctx, func.value, use, depth + 1)
        if ctx.qualified_name(func) in MODULE_WRAPPERS:
            return constructor(ctx, argument(expr, 0, "module"), use, depth + 1)
        local = dotted_name(func)
        return expr if local is not None and local.rsplit(".", 1)[-1][:1].isupper() else None
    name = dotted_name(expr)
    if name is None:
        return None
    value = assignment_before(ctx, use, name)
    if value is not None:
        return constructor(ctx, value, value, depth + 1)
    fn = _enclosing_function(ctx, use)
    if fn is not None and "." not in name:
        values = call_site_values(ctx, fn, name)
        if values:
            built = [constructor(ctx, v, v, depth + 1) for v in values]
            texts = {ctx.module.code_for_node(b.func) if b is not None else None for b in built}
            if len(texts) == 1 and built[0] is not None:
                return built[0]
    return None


def model_class(ctx: FileContext, expr: Optional[cst.BaseExpression], use: cst.CSTNode) -> Optional[str]:
    """The repository class a model was constructed from; None when unknown or from a library
    (``torchvision.models.resnet18()``, ``nn.Linear``)."""
    call = constructor(ctx, expr, use)
    if call is None:
        return None
    qualified = ctx.qualified_name(call.func)
    if qualified is not None and qualified.split(".", 1)[0] in LIBRARY_ROOTS:
        return None
    return dotted_name(call.func)
