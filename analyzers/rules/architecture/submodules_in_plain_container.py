"""TR302 submodules-in-plain-container: submodules kept in a plain list/dict are not registered."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, method_name
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.builds import registered_kind
from analyzers.program.names import render_name
from analyzers.program.roles import direct_method_class as _direct_method_class


_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}
_SELF_REGISTRATION = {"add_module", "register_module", "register_parameter", "register_buffer", "setattr"}


class _MethodRecord:
    __slots__ = ("cls", "displays", "empties", "aliases", "appended", "registered", "self_registers")

    def __init__(self, cls: cst.ClassDef) -> None:
        self.cls = cls
        self.displays: dict[str, tuple[cst.BaseExpression, str, str]] = {}  # target -> (value, container, kind)
        self.empties: dict[str, tuple[cst.BaseExpression, str]] = {}  # target -> (value, "list"|"dict")
        self.aliases: dict[str, tuple[cst.BaseExpression, str]] = {}  # self.x -> (Name value, local name)
        self.appended: dict[str, set] = {}  # list/dict name -> kinds of elements added
        self.registered: set[str] = set()  # names passed to nn containers
        self.self_registers = False


class SubmodulesInPlainContainer(Rule):
    id = "TR302"
    fix_safety = "unsafe"  # registering the modules adds parameters, state_dict keys and .to() moves
    slug = "submodules-in-plain-container"
    category = Category.ARCHITECTURE
    severity = Severity.HIGH
    summary = "submodules kept in a plain list/dict are not registered"
    what = """
        Flags an `nn.Module` that stores submodules (or `nn.Parameter`s) on `self` in a plain
        Python list, tuple or dict: a list/dict display or comprehension of modules, or an empty
        list/dict later filled with `.append(Block(...))` / `[key] = nn.Linear(...)`. Quiet when every
        module there holds nothing to register (activations, pooling, padding, a class of the file whose
        `__init__` keeps only constants, sizes it only computes with, and such layers): leaving those out of
        `.parameters()` or `state_dict()` loses nothing.
    """
    why = """
        `nn.Module` only registers submodules assigned directly as attributes or held in
        `nn.ModuleList` / `nn.ModuleDict` / `nn.Sequential`. Modules in a plain list are invisible
        to `.parameters()` (the optimizer never updates them), `.to(device)` / `.cuda()` (device
        mismatch errors), `.train()` / `.eval()` and `state_dict()` (they are not saved).
    """
    example = """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = [nn.Linear(64, 64) for _ in range(4)]
    """
    fix_example = """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(4)])
    """
    VALID = [
        # a ModuleList imported bare, built in a local, then stored
        "import torch\nfrom torch.nn import Module, ModuleList, Linear\nclass Net(Module):\n    def __init__(self):\n"
        "        super().__init__()\n        layers = ModuleList([])\n        for _ in range(2):\n"
        "            layers.append(ModuleList([Linear(2, 2), Linear(2, 2)]))\n        self.layers = layers\n",
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])\n",
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.heads = nn.ModuleDict({'a': nn.Linear(2, 2)})\n        self.body = nn.Sequential(nn.Linear(2, 2))\n",
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.ws = nn.ParameterList([nn.Parameter(torch.zeros(2))])\n",
        # lists of non-modules
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self, sizes):\n        super().__init__()\n"
        "        self.sizes = [64, 32, 16]\n        self.names = ['a', 'b']\n        self.anchors = [torch.zeros(2)]\n"
        "        self.cfg = {'depth': 3}\n",
        # a list built and then wrapped / used only to build a Sequential
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.blocks = []\n        for i in range(3):\n            self.blocks.append(nn.Linear(2, 2))\n"
        "        self.blocks = nn.ModuleList(self.blocks)\n",
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        layers = []\n        for i in range(3):\n            layers.append(nn.Linear(2, 2))\n"
        "        self.net = nn.Sequential(*layers)\n",
        # modules that hold nothing to register (no parameter, buffer or train/eval switch): nothing is lost
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.acts = {'relu': nn.ReLU(), 'gelu': nn.GELU()}\n"
        "        self.pools = [nn.MaxPool2d(2) for _ in range(3)]\n",
        "import torch.nn as nn\nclass Swish(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.beta = 1.0\n    def forward(self, x):\n        return x * (self.beta * x).sigmoid()\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.acts = []\n"
        "        for _ in range(2):\n            self.acts.append(Swish())\n",
        # a class of the file that keeps a window size it only computes with and a pooling layer
        "import torch.nn as nn\nclass Window(nn.Module):\n    def __init__(self, size):\n        super().__init__()\n"
        "        self.size = size\n        self.pool = nn.AvgPool1d(size, stride=1)\n    def forward(self, x):\n"
        "        return self.pool(x[..., self.size - 1:])\n"
        "class Net(nn.Module):\n    def __init__(self, sizes):\n        super().__init__()\n"
        "        self.windows = [Window(s) for s in sizes]\n",
        # not a module class
        "import torch.nn as nn\nclass Builder:\n    def __init__(self):\n        self.layers = [nn.Linear(2, 2)]\n",
    ]
    INVALID = [
        Invalid("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.layers = [nn.Linear(2, 2), nn.ReLU()]\n", line=5, message="self.layers",
                fixed="import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.layers = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])\n"),
        Invalid("from torch import nn\nclass Net(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
                "        self.heads = {'cls': nn.Linear(2, 3), 'box': nn.Linear(2, 4)}\n", line=5, message="self.heads",
                fixed="from torch import nn\nclass Net(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
                      "        self.heads = nn.ModuleDict({'cls': nn.Linear(2, 3), 'box': nn.Linear(2, 4)})\n"),
        Invalid("import torch\nclass ResBlock(torch.nn.Module):\n    pass\nclass Net(torch.nn.Module):\n"
                "    def __init__(self, depth):\n        super().__init__()\n        self.blocks = []\n"
                "        for _ in range(depth):\n            self.blocks.append(ResBlock())\n", line=7, message="self.blocks",
                fixed="import torch\nclass ResBlock(torch.nn.Module):\n    pass\nclass Net(torch.nn.Module):\n"
                      "    def __init__(self, depth):\n        super().__init__()\n        self.blocks = torch.nn.ModuleList()\n"
                      "        for _ in range(depth):\n            self.blocks.append(ResBlock())\n"),
        Invalid("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
                "        self.layers = [nn.Linear(8, 8) for _ in range(n)]\n", line=5,
                fixed="import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
                      "        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(n)])\n"),
        # a dropout layer behaves differently in training: eval() must reach it
        Invalid("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.drops = [nn.Dropout(0.1), nn.ReLU()]\n", line=5, message="self.drops"),
        Invalid("import torch\nfrom torch.nn import Module, Parameter\nclass Mix(Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.weights = [Parameter(torch.ones(1)) for _ in range(3)]\n",
                line=6, message="ParameterList"),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._stack: list[Optional[_MethodRecord]] = []

    @property
    def _record(self) -> Optional[_MethodRecord]:
        return self._stack[-1] if self._stack else None

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        cls = _direct_method_class(node, ctx)
        record = None
        if cls is not None and ctx.is_module_subclass(cls):
            record = _MethodRecord(cls)
        elif self._stack and self._stack[-1] is not None:
            record = self._stack[-1]  # nested helper inside a method: same registrations
        self._stack.append(record)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        record = self._record
        if record is None:
            return
        name = method_name(node)
        if name is None:
            return
        if name in _CONTAINERS:
            for arg in node.args:
                dotted = dotted_name(arg.value)
                if dotted is not None:
                    record.registered.add(dotted)
            return
        if name in _SELF_REGISTRATION:
            record.self_registers = True
            return
        if name in ("append", "insert", "extend") and isinstance(node.func, cst.Attribute):
            target = dotted_name(node.func.value)
            if target is None or not node.args:
                return
            value = node.args[-1].value
            if name == "extend":
                if isinstance(value, (cst.List, cst.Tuple)):
                    kinds = {registered_kind(e.value, ctx) for e in value.elements}
                elif isinstance(value, (cst.ListComp, cst.GeneratorExp)):
                    kinds = {registered_kind(value.elt, ctx)}
                else:
                    return
            else:
                kinds = {registered_kind(value, ctx)}
            record.appended.setdefault(target, set()).update(kinds)

    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        record = self._record
        if record is None or not isinstance(node.operator, cst.AddAssign):
            return
        target = dotted_name(node.target)
        if target is not None and isinstance(node.value, (cst.List, cst.Tuple)):
            record.appended.setdefault(target, set()).update(
                {registered_kind(e.value, ctx) for e in node.value.elements})

    def leave_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        record = self._record
        if record is None:
            return
        value = node.value
        for target_node in node.targets:
            target_expr = target_node.target
            if isinstance(target_expr, cst.Subscript):
                base = dotted_name(target_expr.value)
                if base is not None:
                    record.appended.setdefault(base, set()).add(registered_kind(value, ctx))
                continue
            target = dotted_name(target_expr)
            if target is None:
                continue
            # any new assignment replaces what the target held before
            record.displays.pop(target, None)
            record.empties.pop(target, None)
            record.aliases.pop(target, None)
            if not target.startswith("self."):
                if _is_empty_container(value):
                    record.appended.pop(target, None)
                elif isinstance(value, cst.Call) and method_name(value) in _CONTAINERS:
                    record.registered.add(target)  # ``layers = ModuleList([])``: a registering container
                continue
            self._classify(record, target, value, ctx)

    def _classify(self, record: _MethodRecord, target: str, value: cst.BaseExpression, ctx: FileContext) -> None:
        if _is_empty_container(value):
            record.empties[target] = (value, "dict" if _is_dict(value) else "list")
            record.appended.pop(target, None)
            return
        if isinstance(value, cst.Name):
            record.aliases[target] = (value, value.value)
            return
        if isinstance(value, (cst.List, cst.Tuple)):
            kinds = {registered_kind(e.value, ctx) for e in value.elements
                     if not isinstance(e, cst.StarredElement)}
            container = "list"
        elif isinstance(value, cst.ListComp):
            kinds = {registered_kind(value.elt, ctx)}
            container = "list"
        elif isinstance(value, cst.Dict):
            kinds = {registered_kind(e.value, ctx) for e in value.elements if isinstance(e, cst.DictElement)}
            container = "dict"
        elif isinstance(value, cst.DictComp):
            kinds = {registered_kind(value.value, ctx)}
            container = "dict"
        else:
            return
        kind = _container_kind(kinds)
        if kind is not None:
            record.displays[target] = (value, container, kind)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        record = self._stack.pop()
        if record is None or (self._stack and self._stack[-1] is record):
            return  # not a module method, or a nested helper (its parent method decides)
        if record.self_registers:
            return
        cls_name = record.cls.name.value
        for target, (value, container, kind) in record.displays.items():
            if target in record.registered:
                continue
            fixable = True
            if isinstance(value, cst.Dict):  # ModuleDict keys must be strings
                fixable = all(isinstance(e, cst.DictElement) and isinstance(e.key, (cst.SimpleString, cst.FormattedString))
                              for e in value.elements)
            self._report(target, value, container, kind, cls_name, ctx, wrap=value if fixable else None)
        for target, (value, container) in record.empties.items():
            kind = _container_kind(record.appended.get(target, set()))
            if kind is None or target in record.registered:
                continue
            self._report(target, value, container, kind, cls_name, ctx, wrap=None, empty=True)
        for target, (value, local) in record.aliases.items():
            kind = _container_kind(record.appended.get(local, set()))
            if kind is None or target in record.registered or local in record.registered:
                continue
            self._report(target, value, "list", kind, cls_name, ctx, wrap=value)

    def _report(self, target: str, value: cst.BaseExpression, container: str, kind: str, cls_name: str,
                ctx: FileContext, wrap: Optional[cst.BaseExpression], empty: bool = False) -> None:
        wanted = {("list", "module"): "ModuleList", ("dict", "module"): "ModuleDict",
                  ("list", "parameter"): "ParameterList", ("dict", "parameter"): "ParameterDict"}[(container, kind)]
        what = "submodules" if kind == "module" else "nn.Parameters"
        plain = "dict" if container == "dict" else "list"
        message = (f"`{target}` of `{cls_name}` keeps {what} in a plain {plain}: they are not registered, so "
                   f"`.parameters()`, `.to(device)`, `.eval()` and `state_dict()` miss them; use `nn.{wanted}`")
        func = render_name(ctx, f"torch.nn.{wanted}")  # ``nn.ModuleList`` as this file spells it
        replacement = None
        if func is not None and (wrap is not None or empty):
            replacement = cst.Call(func=func, args=[] if empty else [cst.Arg(value=wrap)])
        self.report(value, message, replacement=replacement)


def _container_kind(kinds: set) -> Optional[str]:
    kinds = set(kinds)
    if "module" in kinds and "parameter" not in kinds:
        return "module"
    if kinds == {"parameter"}:
        return "parameter"
    return None


def _is_empty_container(value: cst.BaseExpression) -> bool:
    if isinstance(value, (cst.List, cst.Dict)) and not value.elements:
        return True
    return (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("list", "dict")
            and not value.args)


def _is_dict(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Dict) or (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
                                           and value.func.value == "dict")
