"""TR814 torchvision-pretrained-argument: torchvision models take weights=, not the deprecated pretrained=."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, is_false, is_true, keyword_arg, positional_args, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule
from analyzers.rules.mixed_precision_deprecation._removed_api import NO_SPACE_EQUAL as _NO_SPACE_EQUAL


# families whose legacy pretrained=True weights are not named IMAGENET1K_V1
_NON_CLASSIFICATION = ("torchvision.models.detection.", "torchvision.models.segmentation.",
                       "torchvision.models.video.", "torchvision.models.quantization.",
                       "torchvision.models.optical_flow.")


class TorchvisionPretrained(Rule):
    id = "TR814"
    syntactic = True
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
