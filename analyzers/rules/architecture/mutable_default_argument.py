"""TR303 mutable-default-argument: mutable default argument in a module __init__ or training function."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, dotted_name
from analyzers.markdown import code_span
from analyzers.program import mutated_names, stored_attributes
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import direct_method_class as _direct_method_class


_MUTABLE_CALLS = {"list", "dict", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter"}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _is_training_function_name(name: str) -> bool:
    tokens = [t for t in re.split(r"[_\W]+", _CAMEL.sub("_", name).lower()) if t]
    return any(t.startswith("train") or t in ("pretrain", "finetune", "fit", "fitting") for t in tokens)


def _is_mutable_default(value: cst.BaseExpression) -> bool:
    if isinstance(value, (cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)):
        return True
    if isinstance(value, cst.Call):
        name = dotted_name(value.func)
        return name is not None and name.rsplit(".", 1)[-1] in _MUTABLE_CALLS and (
            name.count(".") == 0 or name.startswith("collections."))
    return False


class MutableDefaultArgument(Rule):
    id = "TR303"
    slug = "mutable-default-argument"
    category = Category.ARCHITECTURE
    severity = Severity.MEDIUM
    summary = "mutable default argument in a module __init__ or training function"
    what = """
        Flags mutable default values (`[]`, `{}`, `set()`, `list()`, `dict()`, displays and
        comprehensions) of the parameters of an `nn.Module`'s `__init__` or of a training
        function (a function whose name contains `train` or `fit`) when the default is changed in
        place: in the function (`append`, `x[k] = ...`, `+=`...), or after being stored on the
        instance (`self.x = x`, then `self.x.append(...)` in any method). A default that is only
        read is harmless and not reported.
    """
    why = """
        A default value is evaluated once, when the `def` runs, and shared by every call. A
        module that stores or appends to a default list shares that list between all its
        instances (hidden sizes, callbacks, metrics history leak from one model or run to the
        next), and a training function that accumulates into a default dict keeps the previous
        run's values.
    """
    example = """
        class MLP(nn.Module):
            def __init__(self, hidden=[64, 64]):
                ...
    """
    fix_example = """
        class MLP(nn.Module):
            def __init__(self, hidden=None):
                hidden = [64, 64] if hidden is None else hidden
                ...
    """
    VALID = [
        "import torch.nn as nn\nclass MLP(nn.Module):\n    def __init__(self, hidden=(64, 64), act=None):\n"
        "        super().__init__()\n",
        "import torch\ndef train(model, loader, callbacks=None, history=None):\n    callbacks = callbacks or []\n",
        # not a module __init__ / training function
        "import torch\ndef collate(batch, keys=[]):\n    return batch\n",
        "import torch\nclass Config:\n    def __init__(self, layers=[1, 2]):\n        self.layers = layers\n",
        "import torch\ndef constrain(x, bounds=[0, 1]):\n    return x\n",
        # only read: indexed, iterated, splatted or passed on
        "import torch.nn as nn\nclass ViT(nn.Module):\n    def __init__(self, img_size=[224], depths=[2, 2]):\n"
        "        super().__init__()\n        self.size = img_size[0]\n        self.n = sum(depths)\n",
        "import torch.nn as nn\nclass VQ(nn.Module):\n    def __init__(self, ignore_keys=[], kw={}):\n"
        "        super().__init__()\n        for k in ignore_keys:\n            print(k)\n"
        "        self.block = Block(**kw)\n",
        "import torch.nn as nn\nclass Sub(Base):\n    def __init__(self, ignore_keys=[]):\n"
        "        super().__init__(ignore_keys=ignore_keys)\n",
    ]
    INVALID = [
        Invalid("import torch.nn as nn\nclass MLP(nn.Module):\n    def __init__(self, hidden=[64, 64]):\n"
                "        super().__init__()\n        hidden.append(10)\n", line=3, message="`hidden`"),
        Invalid("import torch\ndef train_one_epoch(model, loader, metrics={}):\n    metrics['loss'] = 0.0\n",
                line=2, message="metrics"),
        Invalid("import torch\ndef fit(model, data, *, callbacks=list()):\n    callbacks += [Logger()]\n",
                line=2, message="callbacks"),
        Invalid("from torch.nn import Module\nclass Enc(Module):\n    def __init__(self, dims=[1], skip=set()):\n"
                "        super().__init__()\n        dims.append(2)\n        skip.add(3)\n", count=2),
        # stored on the instance, then changed by another method: every instance shares one list
        Invalid("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self, history=[]):\n"
                "        super().__init__()\n        self.history = history\n"
                "    def forward(self, x):\n        self.history.append(x.mean())\n        return x\n",
                line=3, message="self.history"),
    ]

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        name = node.name.value
        if name == "__init__":
            cls = _direct_method_class(node, ctx)
            if cls is None or not ctx.is_module_subclass(cls):
                return
            where = f"`{cls.name.value}.__init__`"
        elif _is_training_function_name(name):
            where = f"`{name}()`"
        else:
            return
        params = node.params
        mutable = {param.name.value: param.default for param in (*params.posonly_params, *params.params,
                                                                  *params.kwonly_params)
                   if param.default is not None and _is_mutable_default(param.default)}
        if not mutable:
            return
        # A default that is only read (indexed, iterated, splatted, passed on) is harmless; the bug is a
        # default that is changed in place, here or — once stored on the instance — anywhere in the class.
        mutated = mutated_names(node.body)
        stored = stored_attributes(node.body, set(mutable))
        cls = ctx.class_def
        class_mutated = mutated_names(cls.body) if cls is not None and stored else set()
        for name, default in mutable.items():
            if name in mutated:
                how = "changed in place here"
            elif name in stored and stored[name] in class_mutated:
                how = f"stored as {code_span(stored[name])} and changed in place"
            else:
                continue
            shown = ctx.module.code_for_node(default)
            if len(shown) > 30:
                shown = shown[:27] + "..."
            # the default is PR source and may hold backticks: code_span sizes its fence to it
            self.report(default, f"parameter `{name}` of {where} defaults to the mutable {code_span(shown)}, {how}: the "
                                 f"default is created once and shared by every call/instance; default to None "
                                 f"and create it inside")
