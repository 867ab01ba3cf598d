"""TR403 double-sigmoid-bce-with-logits: sigmoid output passed to BCEWithLogitsLoss, which applies sigmoid again."""
from __future__ import annotations

import re
import libcst as cst
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.rules.numerics._numerics import ActivationIntoLoss as _ActivationIntoLoss


class DoubleSigmoidBCEWithLogits(_ActivationIntoLoss):
    id = "TR403"
    source_hint = re.compile(r"BCEWithLogits|binary_cross_entropy_with_logits")  # the loss is named in this file (import or call)
    slug = "double-sigmoid-bce-with-logits"
    category = Category.NUMERICS
    severity = Severity.HIGH
    summary = "sigmoid output passed to BCEWithLogitsLoss, which applies sigmoid again"
    what = """
        Flags a sigmoid output (`torch.sigmoid`, `F.sigmoid`, `x.sigmoid()`, an `nn.Sigmoid`
        module, or a model defined in the file whose `forward` returns sigmoid) passed to
        `nn.BCEWithLogitsLoss` / `F.binary_cross_entropy_with_logits`.
    """
    why = """
        `BCEWithLogitsLoss` expects logits and applies the sigmoid itself. A sigmoid output
        lies in [0, 1], so the loss sees sigmoid(sigmoid(z)) in [0.5, 0.73]: it can never
        predict a negative class confidently, the loss cannot go below ~0.31, and gradients are
        tiny. Training silently produces a poor model.
    """
    example = """
        criterion = nn.BCEWithLogitsLoss()
        loss = criterion(torch.sigmoid(logits), y)
    """
    fix_example = """
        criterion = nn.BCEWithLogitsLoss()
        loss = criterion(logits, y)
    """
    LOSS_MODULES = {"torch.nn.BCEWithLogitsLoss": "BCEWithLogitsLoss",
                    "torch.nn.modules.loss.BCEWithLogitsLoss": "BCEWithLogitsLoss"}
    LOSS_FUNCS = {"torch.nn.functional.binary_cross_entropy_with_logits": "F.binary_cross_entropy_with_logits"}
    KINDS = {"BCEWithLogitsLoss": ("sigmoid",), "F.binary_cross_entropy_with_logits": ("sigmoid",)}
    VALID = [
        """
        import torch
        import torch.nn as nn
        criterion = nn.BCEWithLogitsLoss(pos_weight=w)
        loss = criterion(logits, y)
        acc = ((torch.sigmoid(logits) > 0.5) == y).float().mean()
        """,
        """
        import torch.nn.functional as F
        loss = F.binary_cross_entropy_with_logits(model(x), y)
        """,
        # a sigmoid whose result is rebound before the loss
        """
        import torch
        import torch.nn as nn
        criterion = nn.BCEWithLogitsLoss()
        out = torch.sigmoid(z)
        out = decoder(out)
        loss = criterion(out, y)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            criterion = nn.BCEWithLogitsLoss()
            loss = criterion(torch.sigmoid(logits), y)
            """,
            line=5, message="`criterion` (BCEWithLogitsLoss)",
            fixed="""
            import torch
            import torch.nn as nn
            criterion = nn.BCEWithLogitsLoss()
            loss = criterion(logits, y)
            """,
        ),
        Invalid(
            """
            import torch.nn.functional as F
            loss = F.binary_cross_entropy_with_logits(out.sigmoid(), target)
            """,
            line=3,
            fixed="""
            import torch.nn.functional as F
            loss = F.binary_cross_entropy_with_logits(out, target)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.criterion = nn.BCEWithLogitsLoss().cuda()
                def training_step(self, x, y):
                    pred = torch.sigmoid(self.head(x))
                    return self.criterion(pred, y)
            """,
            line=10, message="`self.criterion` (BCEWithLogitsLoss)",
        ),
        Invalid(
            """
            from torch import nn
            class Net(nn.Module):
                def forward(self, x):
                    return self.fc(x).sigmoid()
            net = Net()
            loss = nn.BCEWithLogitsLoss()(net(x), y)
            """,
            line=7, message="Net.forward returns sigmoid",
        ),
    ]

    def describe(self, crit, source, kind, loss):
        return (f"{crit} receives a sigmoid output: {source}; BCEWithLogitsLoss applies sigmoid itself, so "
                f"sigmoid runs twice and predictions are squeezed into [0.5, 0.73]. Pass the raw logits"), None

    def fix(self, act, kind, cls):
        if not act.inline or cls is not None:
            return None
        call = act.producer
        if call.lpar:
            return None
        if act.form == "function" and len(call.args) == 1 and not call.args[0].star and \
                (call.args[0].keyword is None or call.args[0].keyword.value == "input"):
            return call.args[0].value
        if act.form == "method" and isinstance(call.func, cst.Attribute) and not call.args:
            return call.func.value
        return None
