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


def model_class(ctx: FileContext, expr: Optional[cst.BaseExpression], use: cst.CSTNode,
                depth: int = 0) -> Optional[str]:
    """The repository class a model expression was constructed from (``Net`` for ``model`` after
    ``model = Net().to(device)``, or through a parameter every caller in the file passes one class for).

    None when unknown, or when the model comes from a library (``torchvision.models.resnet18()``).
    """
    if expr is None or depth > 6:
        return None
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in MODULE_CHAIN and ctx.qualified_name(func) is None:
            return model_class(ctx, func.value, use, depth + 1)
        qualified = ctx.qualified_name(func)
        if qualified in MODULE_WRAPPERS:
            return model_class(ctx, argument(expr, 0, "module"), use, depth + 1)
        local = dotted_name(func)
        if local is None or not local.rsplit(".", 1)[-1][:1].isupper():
            return None
        if qualified is not None and qualified.split(".", 1)[0] in LIBRARY_ROOTS:
            return None
        return local
    name = dotted_name(expr)
    if name is None:
        return None
    value = assignment_before(ctx, use, name)
    if value is not None:
        return model_class(ctx, value, value, depth + 1)
    fn = _enclosing_function(ctx, use)
    if fn is not None and "." not in name:
        values = call_site_values(ctx.module, fn, name)
        if values:
            classes = {model_class(ctx, v, v, depth + 1) for v in values}
            if len(classes) == 1:
                return classes.pop()
    return None
