"""TR107 backward-on-non-scalar: .backward() without a gradient on a non-scalar tensor."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    call_receiver,
    dotted_name)
from analyzers.program.names import last_segment
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import is_plain_backward
from analyzers.model import Category, Severity
from analyzers.program.graphs import non_scalar_origin
from analyzers.rules.base import Invalid, Rule


# ---------------------------------------------------------------------------------------------
# Shared classification helpers (each looks at one expression's immediate structure only)

_OUTPUT_NAMES = {"out", "output", "outputs", "logits", "pred", "preds", "prediction", "predictions",
                 "y_pred", "y_hat", "yhat", "scores", "recon", "reconstruction"}


class BackwardOnNonScalar(Rule):
    id = "TR107"
    slug = "backward-on-non-scalar"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = ".backward() without a gradient on a non-scalar tensor"
    what = """
        Flags `.backward()` without a `gradient` argument on a tensor that is clearly not a
        scalar: a loss computed with `reduction='none'` (by a criterion object built with it or
        an `F.*` call passing it) that was not reduced afterwards, or the model's raw output.
    """
    why = """
        `backward()` without a gradient only works for a scalar; on anything else it raises
        "grad can be implicitly created only for scalar outputs" - or, once someone passes
        `torch.ones_like(...)` to silence it, backpropagates the sum, which scales the
        gradient with the batch size.
    """
    example = """
        criterion = nn.CrossEntropyLoss(reduction="none")
        loss = criterion(model(x), y)
        loss.backward()
    """
    fix_example = """
        criterion = nn.CrossEntropyLoss(reduction="none")
        loss = criterion(model(x), y)
        (loss * weights).mean().backward()
    """
    VALID = [
        """
        import torch
        import torch.nn as nn
        criterion = nn.CrossEntropyLoss(reduction="none")
        loss = criterion(model(x), y)
        loss.mean().backward()
        """,
        # a model that returns its own loss (DDP tests, HF-style models)
        """
        import torch
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        for _ in range(6):
            ddp_model().backward(create_graph=True)
        """,
        """
        import torch
        import torch.nn.functional as F
        loss = F.mse_loss(pred, target, reduction="none")
        loss = (loss * mask).sum() / mask.sum()
        loss.backward()
        """,
        """
        import torch
        import torch.nn.functional as F
        loss = F.cross_entropy(logits, y, reduction="none")
        loss.backward(torch.ones_like(loss))
        torch.autograd.backward(loss, grad_tensors=torch.ones_like(loss))
        """,
        """
        import torch
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        loss.backward()
        """,
        # the model computes and returns its loss
        """
        import torch
        loss = model(x, y)
        loss.backward()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss(reduction="none")
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            line=7, message="reduction='none'",
        ),
        Invalid(
            """
            import torch
            from torch.nn import functional as F
            loss = F.binary_cross_entropy_with_logits(logits, y, reduction='none') * weights
            loss.backward(retain_graph=True)
            """,
            line=5, message="loss.backward()",
        ),
        Invalid(
            """
            import torch
            out = model(x)
            out.backward()
            """,
            line=4, message="out",
        ),
        Invalid(
            """
            import torch
            from torch import nn
            class Trainer:
                def __init__(self):
                    self.criterion = nn.MSELoss(reduction="none")
                def step(self, x, y):
                    self.criterion(self.model(x), y).backward()
            """,
            line=8,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not is_plain_backward(node) or argument(node, 0, "gradient") is not None:
            return
        receiver = call_receiver(node)
        if receiver is None:
            return
        shown = dotted_name(receiver)
        value: Optional[cst.BaseExpression] = receiver
        if shown is not None:
            value = ctx.assigned_value(shown)
            if value is None or in_no_grad_block(ctx, ctx.binding(shown).node):
                return
        reason = non_scalar_origin(value, ctx)
        if reason is None:
            return
        if reason == "model":
            # ``model(x).backward()`` is common for models that return their own loss: only a value
            # named like an output (out, logits, preds...) is clearly not a loss
            if shown is None or not _output_like(shown):
                return
            what = f"{shown or 'the output'} is the raw output of the model"
        else:
            what = f"{shown or 'the loss'} is a per-element loss computed with reduction='none'"
        target = shown or "the tensor"
        self.report(node, (f"{target}.backward() without a gradient argument, but {what} - not a scalar: backward "
                           f"raises 'grad can be implicitly created only for scalar outputs'; reduce it first "
                           f"(e.g. {target}.mean().backward())"))


def _output_like(name: str) -> bool:
    last = last_segment(name).lower()
    return last in _OUTPUT_NAMES or last.startswith(("out", "logit", "pred"))
