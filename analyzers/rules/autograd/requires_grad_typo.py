"""TR514 requires-grad-typo: x.require_grad = ... sets a new attribute; the flag is requires_grad."""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext, literal_bool
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.names import node_text
from analyzers.program.values import tracks_gradients_by_default
from analyzers.rules.base import Invalid, Rule


_GRAD_TYPOS = {"require_grad", "requires_grads", "require_grads", "requries_grad", "requires_gradient"}


class RequiresGradTypo(Rule):
    id = "TR514"
    slug = "requires-grad-typo"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "x.require_grad = ... sets a new attribute; the flag is requires_grad"
    what = """
        Flags assignments to a misspelled `requires_grad` attribute (`p.require_grad = False`,
        `p.requires_grads = False`), unless the program knows the typo changes nothing: `False` on a
        tensor a creation op made (it does not track gradients anyway), `True` on an `nn.Parameter`
        (it already does).
    """
    why = """
        Tensors accept arbitrary Python attributes, so the typo raises nothing: it creates a new,
        meaningless attribute and leaves `requires_grad` unchanged. The layers meant to be frozen
        keep training (or the ones meant to train stay frozen), silently.
    """
    example = """
        for p in backbone.parameters():
            p.require_grad = False
    """
    fix_example = """
        for p in backbone.parameters():
            p.requires_grad = False
    """
    VALID = [
        "import torch\nfor p in backbone.parameters():\n    p.requires_grad = False\n",
        "import torch\nx.requires_grad_(True)\nflags.require_gradients = True\n",
        # the typo has no effect: a new tensor does not track gradients, a Parameter does
        "import torch\nmask = torch.zeros(4, 4)\nmask.require_grad = False\n",
        "import torch\ntable = torch.zeros(16, 8).float()\ntable.require_grad = False\n",
        "import torch\nfrom torch import nn\nscale = nn.Parameter(torch.ones(3))\nscale.require_grad = True\n",
    ]
    INVALID = [
        Invalid("import torch\nfor p in backbone.parameters():\n    p.require_grad = False\n", line=3,
                message="`p.require_grad`",
                fixed="import torch\nfor p in backbone.parameters():\n    p.requires_grad = False\n"),
        Invalid("import torch\nmodel.fc.weight.requires_grads = True\n", line=2,
                fixed="import torch\nmodel.fc.weight.requires_grad = True\n"),
        # a Parameter meant to be frozen keeps training; a new tensor meant to train gets no gradient
        Invalid("import torch\nfrom torch import nn\nscale = nn.Parameter(torch.ones(3))\nscale.require_grad = False\n",
                line=4),
        Invalid("import torch\nnoise = torch.randn(8)\nnoise.require_grad = True\n", line=3),
        Invalid("import torch\nw = torch.zeros(3, requires_grad=True)\nw.require_grad = False\n", line=3),
    ]

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        for target in node.targets:
            t = target.target
            if isinstance(t, cst.Attribute) and t.attr.value in _GRAD_TYPOS:
                wanted = literal_bool(node.value)
                if wanted is not None and tracks_gradients_by_default(t.value, ctx) is wanted:
                    continue  # the flag already has the value the typo meant to set: no effect
                self.report(t, f"{code_span(node_text(ctx, t))} is not `requires_grad`: the assignment creates a new "
                               f"attribute and leaves gradient tracking unchanged",
                            replacement=t.with_changes(attr=cst.Name("requires_grad")))
