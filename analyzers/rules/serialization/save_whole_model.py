"""TR602 save-whole-model: torch.save of a whole nn.Module instead of its state_dict()."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name
from analyzers.model import Category, Severity
from analyzers.program.library import Does, does
from analyzers.program.roles import holds_module
from analyzers.rules.base import Invalid, Rule


class SaveWholeModel(Rule):
    id = "TR602"
    source_hint = re.compile(r"save")  # a torch.save call
    fix_safety = "unsafe"  # the checkpoint changes format: its loaders must change too
    slug = "save-whole-model"
    category = Category.SECURITY
    severity = Severity.MEDIUM
    summary = "torch.save of a whole nn.Module instead of its state_dict()"
    what = """
        Flags `torch.save(model, ...)` where `model` is an `nn.Module` instance (built in this
        file from a module class, or an attribute/variable named like a model) rather than
        `model.state_dict()`.
    """
    why = """
        Saving the module pickles the class by reference: the checkpoint only loads with the
        exact same code layout, breaks on refactors, and can only be read back with
        `weights_only=False`, i.e. by executing pickled code.
    """
    example = """
        torch.save(model, "model.pt")
    """
    fix_example = """
        torch.save(model.state_dict(), "model.pt")
    """
    VALID = [
        "import torch\ntorch.save(model.state_dict(), 'm.pt')\n",
        "import torch\ntorch.save({'model': model.state_dict(), 'epoch': 3}, 'ckpt.pt')\n",
        "import torch\ntorch.save(tensor, 't.pt')\n",
    ]
    INVALID = [
        Invalid("import torch\nmodel = Net()\ntorch.save(model, 'm.pt')\n", line=3, message="model",
                fixed="import torch\nmodel = Net()\ntorch.save(model.state_dict(), 'm.pt')\n"),
        Invalid("import torch\nimport torch.nn as nn\nnet = nn.Sequential(nn.Linear(2, 2))\ntorch.save(net, 'm.pt')\n", line=4),
        Invalid("import torch\ntorch.save(self.model, path)\n", line=2, message="self.model"),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not does(ctx.call_name(node), Does.WRITES_TORCH_CHECKPOINT):
            return
        obj = argument(node, 0, "obj")
        if obj is None or not isinstance(obj, (cst.Name, cst.Attribute)):
            return
        if not holds_module(ctx, obj):
            return
        name = dotted_name(obj)
        replacement = cst.Call(func=cst.Attribute(value=obj, attr=cst.Name("state_dict")))
        self.report(obj, f"torch.save({name}, ...) pickles the whole module; save {name}.state_dict() instead",
                    replacement=replacement)
