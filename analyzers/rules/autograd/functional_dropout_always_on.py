"""TR513 functional-dropout-always-on: F.dropout in a module without training=self.training stays on in eval()."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    iter_names,
    keyword_arg,
    positional_args)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.names import node_text
from analyzers.program.state import zero_unless_training
from analyzers.rules.base import Invalid, Rule


_FUNCTIONAL_DROPOUT = {f"torch.nn.functional.{n}" for n in ("dropout", "dropout1d", "dropout2d", "dropout3d",
                                                             "alpha_dropout", "feature_alpha_dropout")}


class FunctionalDropoutAlwaysOn(Rule):
    id = "TR513"
    source_hint = re.compile(r"dropout")  # F.dropout and its variants
    slug = "functional-dropout-always-on"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "F.dropout in a module without training=self.training stays on in eval()"
    what = """
        Flags `F.dropout(x, p)` (and `dropout1d/2d/3d`) inside an `nn.Module` method that does
        not pass `training=` (it defaults to `True`). `F.alpha_dropout` and
        `F.feature_alpha_dropout` default to `training=False`, so they never stay on in eval.
    """
    why = """
        The functional form does not know the module's mode: unlike `nn.Dropout`, it keeps
        dropping activations after `model.eval()`, so validation and inference are randomly
        perturbed, metrics are noisy and worse than the model really is, and predictions are
        not reproducible.
    """
    example = """
        def forward(self, x):
            x = F.dropout(F.relu(self.fc1(x)), p=0.5)
            return self.fc2(x)
    """
    fix_example = """
        def forward(self, x):
            x = F.dropout(F.relu(self.fc1(x)), p=0.5, training=self.training)
            return self.fc2(x)
    """
    VALID = [
        # the caller zeroes the probability outside training and hands it to an attention helper
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Attention(nn.Module):
            def forward(self, q, k, v):
                if not self.training:
                    drop = 0.0
                else:
                    drop = self.dropout
                return self._attend(q, k, v, drop)
            def _attend(self, q, k, v, dropout_p: float = 0.0):
                weights = (q @ k.transpose(-2, -1)).softmax(-1)
                if dropout_p > 0.0:
                    weights = F.dropout(weights, p=dropout_p)
                return weights @ v
        """,
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Net(nn.Module):
            def forward(self, x):
                x = F.dropout(x, p=self.p, training=self.training)
                return F.dropout2d(x, 0.1, self.training)
        """,
        # only reached in training mode
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Net(nn.Module):
            def forward(self, x):
                if self.training and self.drop > 0:
                    x = F.dropout(x, p=self.drop)
                return F.dropout(x, 0.5) if self.training else x
        """,
        # not a module: a helper whose caller decides
        """
        from torch.nn import functional as F
        def augment(x, p):
            return F.dropout(x, p)
        """,
        # the alpha variants default to training=False
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class SelfNormalizing(nn.Module):
            def forward(self, x):
                return F.alpha_dropout(F.selu(self.fc(x)), 0.1)
        """,
        # explicit training=True (MC dropout) and p=0
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                x = torch.nn.functional.dropout(x, 0.2, training=True)
                return torch.nn.functional.dropout(x, 0.0)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            class Net(nn.Module):
                def forward(self, x):
                    x = F.relu(self.fc1(x))
                    x = F.dropout(x, p=0.5)
                    return self.fc2(x)
            """,
            line=7, message="`F.dropout(x, p=0.5)`",
            fixed="""
            import torch.nn as nn
            import torch.nn.functional as F
            class Net(nn.Module):
                def forward(self, x):
                    x = F.relu(self.fc1(x))
                    x = F.dropout(x, p=0.5, training=self.training)
                    return self.fc2(x)
            """,
        ),
        Invalid(
            """
            import torch
            from torch.nn.functional import dropout
            class Block(torch.nn.Module):
                def forward(self, x):
                    return dropout(self.proj(x), self.drop)
            """,
            line=6,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        called = ctx.call_name(node)
        if called not in _FUNCTIONAL_DROPOUT or called.endswith("alpha_dropout"):
            return  # the alpha variants default to ``training=False``: never on in eval (if never on at all)
        fn = ctx.function_def
        if fn is None or ctx.class_def is None or not ctx.is_module_subclass():
            return
        if keyword_arg(node, "training") is not None or len(positional_args(node)) >= 3:
            return
        if any(isinstance(a, (cst.If, cst.IfExp)) and any("training" in n for n in iter_names(a.test))
               for a in ctx.ancestors(node)):
            return  # ``if self.training: x = F.dropout(x, p)``
        p = argument(node, 1, "p")
        if p is not None and zero_unless_training(ctx, p, fn):
            return  # ``p`` is 0 whenever the module is not training (zeroed by the caller in eval)
        params = [*fn.params.posonly_params, *fn.params.params]
        replacement = None
        if params and params[0].name.value == "self" and not any(a.star for a in node.args):
            args = list(node.args)
            if args:
                last = args[-1]
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(value=cst.parse_expression("self.training"), keyword=cst.Name("training"),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
            replacement = node.with_changes(args=args)
        self.report(node, f"{code_span(node_text(ctx, node))} has no `training=` argument, and it defaults to `True`: "
                          f"dropout stays on after `model.eval()`, so validation and inference are randomly "
                          f"perturbed; pass `training=self.training` (or use an `nn.Dropout` module)",
                    replacement=replacement)
