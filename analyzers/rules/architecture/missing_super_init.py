"""TR301 missing-super-init: nn.Module subclass __init__ without super().__init__()."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext
from analyzers.model import Category, Severity
from analyzers.program.flow import reaches_through_own_methods
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import direct_method_class as _direct_method_class


class MissingSuperInit(Rule):
    id = "TR301"
    source_hint = re.compile(r"__init__")  # an __init__ without super().__init__()
    slug = "missing-super-init"
    category = Category.ARCHITECTURE
    severity = Severity.CRITICAL
    summary = "nn.Module subclass __init__ without super().__init__()"
    what = """
        Flags `__init__` of an `nn.Module` subclass that never calls `super().__init__()`
        (or `super(Cls, self).__init__()`, `nn.Module.__init__(self)`, `Base.__init__(self)`).
    """
    why = """
        `nn.Module.__init__` creates the dictionaries that hold parameters, buffers and
        submodules. Without it the first `self.layer = nn.Linear(...)` raises
        `AttributeError: cannot assign module before Module.__init__() call`, and a module that
        gets past that registers nothing: no parameters for the optimizer, nothing in `state_dict()`.
    """
    example = """
        class Net(nn.Module):
            def __init__(self):
                self.fc = nn.Linear(10, 2)
    """
    fix_example = """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(10, 2)
    """
    VALID = [
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(2, 2)\n",
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self, d):\n        super(Net, self).__init__()\n"
        "        self.fc = nn.Linear(d, d)\n",
        "from torch import nn\nclass Net(nn.Module):\n    def __init__(self):\n        nn.Module.__init__(self)\n"
        "        self.fc = nn.Linear(2, 2)\n",
        "import torch.nn as nn\nclass Base(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "class Child(Base):\n    def __init__(self, d):\n        Base.__init__(self)\n        self.d = d\n",
        # the base is initialised by a helper method the constructor delegates to
        "import torch.nn as nn\nclass Table(nn.Embedding):\n    def __init__(self, n, d):\n        self.build(n, d)\n"
        "    def build(self, n, d):\n        if not hasattr(self, 'weight'):\n            super().__init__(n, d)\n",
        # no __init__: nn.Module's is inherited
        "import torch.nn as nn\nclass Net(nn.Module):\n    def forward(self, x):\n        return x\n",
        # not a module
        "import torch\nclass Config:\n    def __init__(self):\n        self.lr = 1e-3\n",
    ]
    INVALID = [
        Invalid("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        self.fc = nn.Linear(2, 2)\n",
                line=3, message="Net.__init__"),
        Invalid("from torch.nn import Module, Linear\nclass Head(Module):\n    def __init__(self, d):\n"
                "        self.d = d\n        self.fc = Linear(d, 1)\n", line=3, message="Head"),
        Invalid("import torch\nclass Block(torch.nn.Module):\n    pass\nclass Deep(Block):\n    def __init__(self):\n"
                "        self.blocks = [Block()]\n", line=5, message="Deep"),
        Invalid("import lightning as L\nclass Lit(L.LightningModule):\n    def __init__(self, lr):\n        self.lr = lr\n",
                line=3),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._stack: list[Optional[list]] = []  # per FunctionDef: [node, class, called_super] or None

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        record = None
        if node.name.value == "__init__":
            cls = _direct_method_class(node, ctx)
            if cls is not None and ctx.is_module_subclass(cls) and not _trivial_body(node):
                record = [node, cls, False]
        self._stack.append(record)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        record = next((r for r in reversed(self._stack) if r is not None), None) if self._stack else None
        if record is None or record[2]:
            return
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "__init__":
            record[2] = True
        elif isinstance(func, cst.Name) and func.value == "super":
            record[2] = True  # super() used for anything: the author knows the base

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        record = self._stack.pop()
        if record is None or record[2]:
            return
        if reaches_through_own_methods(record[1], node, _initializes_base):
            return  # ``self.make_weight(...)`` calls ``super().__init__(...)`` for it
        cls_name = record[1].name.value
        self.report(node.name, f"`{cls_name}.__init__` never calls `super().__init__()`: nn.Module's parameter, buffer "
                               f"and submodule registries are never created, so assigning submodules raises "
                               f"AttributeError and nothing is registered; call `super().__init__()` first")


def _initializes_base(node: cst.CSTNode) -> bool:
    """``super()...`` or ``Base.__init__(self, ...)``: what the visit above counts as reaching the base."""
    return isinstance(node, cst.Call) and (
        isinstance(node.func, cst.Attribute) and node.func.attr.value == "__init__" or
        isinstance(node.func, cst.Name) and node.func.value == "super")


def _trivial_body(node: cst.FunctionDef) -> bool:
    """``...`` / ``pass`` / docstring / ``raise`` only (abstract stubs)."""
    body = node.body
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for stmt in statements:
        smalls = stmt.body if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else None
        if smalls is None:
            return False
        for small in smalls:
            if isinstance(small, (cst.Pass, cst.Raise)):
                continue
            if isinstance(small, cst.Expr) and isinstance(
                    small.value, (cst.Ellipsis, cst.SimpleString, cst.ConcatenatedString)):
                continue
            return False
    return True
