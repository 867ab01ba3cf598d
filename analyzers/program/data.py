"""What a data set is: what its transform does to each item, and whether it holds its items in memory."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, keyword_arg
from analyzers.program.flow import subtree
from analyzers.program.library import Does, does

# transforms that draw a random number per item, besides the ``Random*`` classes
_RANDOM_TRANSFORMS = {"ColorJitter", "RandAugment", "TrivialAugmentWide", "AutoAugment", "AugMix", "ElasticTransform",
                      "RandomApply", "RandomChoice", "RandomOrder"}
_TRANSFORM_ROOTS = ("torchvision.transforms", "torchvision.transforms.v2", "albumentations", "monai.transforms",
                    "timm.data")


def random_transforms(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> list[str]:
    """Names of the random transforms ``expr`` (a Compose, a list, or a name bound to one) applies."""
    if expr is None or depth > 3:
        return []
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return random_transforms(ctx.assigned_value(expr), ctx, depth + 1)
    if isinstance(expr, (cst.List, cst.Tuple)):
        found: list[str] = []
        for element in expr.elements:
            found.extend(random_transforms(element.value, ctx, depth + 1))
        return found
    if not isinstance(expr, cst.Call):
        return []
    qualified = ctx.qualified_name(expr.func) or ""
    last = qualified.rsplit(".", 1)[-1]
    if not qualified.startswith(_TRANSFORM_ROOTS):
        return []
    if last == "Compose":
        return random_transforms(argument(expr, 0, "transforms"), ctx, depth + 1)
    if last.startswith("Random") or last in _RANDOM_TRANSFORMS:
        probability = keyword_arg(expr, "p")
        if probability is not None and isinstance(probability.value, (cst.Integer, cst.Float)) and \
                float(probability.value.value) == 0.0:
            return []
        return [last]
    return []


def dataset_in_memory(dataset: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    """A data set of small tensors already in memory (``TensorDataset``, torchvision's MNIST family) whose items
    need no random augmentation: loading one costs nothing worth a worker process or pinned memory."""
    origin = ctx.origin(dataset) if dataset is not None else None
    if not isinstance(origin, cst.Call) or not does(ctx.call_name(origin), Does.HOLDS_DATA_IN_MEMORY):
        return False
    transform = argument(origin, 2, "transform")
    return not random_transforms(transform, ctx)


def transform_replaced(dataset: str, ctx: FileContext) -> bool:
    """The program gives ``dataset`` (or the data set it wraps: ``valid_data.dataset``) a transform with no random
    step somewhere: ``valid_data.dataset.transform = test_transforms`` after splitting it off augmented data."""
    for node in subtree(ctx.module):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = dotted_name(node.targets[0].target) or ""
            if target.startswith(f"{dataset}.") and target.rsplit(".", 1)[-1] in ("transform", "transforms") and \
                    not random_transforms(node.value, ctx):
                return True
    return False
