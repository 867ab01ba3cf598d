"""Architecture: nn.Module subclasses that break module registration or share state by accident."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, dotted_name, method_name
from analyzers.markdown import code_span
from analyzers.program import mutated_names, stored_attributes
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule

_PARAMETER = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}
_SELF_REGISTRATION = {"add_module", "register_module", "register_parameter", "register_buffer", "setattr"}
_MODULE_LIKE_SUFFIXES = ("Block", "Layer")
_CLONE_NAMES = ("module", "layer", "block")


def _direct_method_class(node: cst.FunctionDef, ctx: FileContext) -> Optional[cst.ClassDef]:
    """The class whose body defines ``node`` directly, or None (functions, nested defs)."""
    cls = ctx.class_def
    if cls is None:
        return None
    block = ctx.parent(node)
    return cls if block is not None and ctx.parent(block) is cls else None


def _nn_name(ctx: FileContext, container: str) -> Optional[str]:
    """How this file spells ``torch.nn.<container>``: ``nn.ModuleList``, ``ModuleList``, ``torch.nn.ModuleList``."""
    names = ctx.imports.names
    for local, full in names.items():
        if full == f"torch.nn.{container}":
            return local
    nn_aliases = sorted((local for local, full in names.items() if full == "torch.nn"), key=lambda n: n != "nn")
    if nn_aliases:
        return f"{nn_aliases[0]}.{container}"
    for local, full in names.items():
        if full == "torch":
            return f"{local}.nn.{container}"
    return None


def _module_kind(expr: Optional[cst.BaseExpression], ctx: FileContext, follow: bool = True) -> Optional[str]:
    """"module" / "parameter" when ``expr`` builds an nn.Module / nn.Parameter, else None."""
    if isinstance(expr, (cst.Name, cst.Attribute)) and follow:
        if (dotted_name(expr) or "").startswith("self."):
            return None  # already an attribute of the module: registered there
        origin = ctx.origin(expr)
        return _module_kind(origin, ctx, follow=False) if origin is not expr else None
    if not isinstance(expr, cst.Call):
        return None
    called = ctx.call_name(expr)
    if called is not None:
        if called in _PARAMETER:
            return "parameter"
        leaf = called.rsplit(".", 1)[-1]
        if called.startswith("torch.nn.") and leaf[:1].isupper():
            return "module"
        if called.startswith("torchvision.models.") and not called.startswith("torchvision.models.feature_extraction"):
            return "module"
        if called == "copy.deepcopy":
            arg = expr.args[0].value if expr.args else None
            name = (dotted_name(arg) or "").rsplit(".", 1)[-1].lower()
            if name in _CLONE_NAMES or name.endswith(("_layer", "_block", "_module")):
                return "module"
            return _module_kind(arg, ctx) if arg is not None else None
    local = dotted_name(expr.func)
    if local is None:
        return None
    leaf = local.rsplit(".", 1)[-1]
    if local in ctx.module_classes_in_file:
        return "module"
    if leaf[:1].isupper() and leaf.endswith(_MODULE_LIKE_SUFFIXES):
        return "module"
    return None


def _kinds(exprs, ctx: FileContext) -> set[Optional[str]]:
    return {_module_kind(e, ctx) for e in exprs}


# ---------------------------------------------------------------------------------------------


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
        cls_name = record[1].name.value
        self.report(node.name, f"`{cls_name}.__init__` never calls `super().__init__()`: nn.Module's parameter, buffer "
                               f"and submodule registries are never created, so assigning submodules raises "
                               f"AttributeError and nothing is registered; call `super().__init__()` first")


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


# ---------------------------------------------------------------------------------------------


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
        list/dict later filled with `.append(Block(...))` / `[key] = nn.Linear(...)`.
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
                    kinds = _kinds((e.value for e in value.elements), ctx)
                elif isinstance(value, (cst.ListComp, cst.GeneratorExp)):
                    kinds = {_module_kind(value.elt, ctx)}
                else:
                    return
            else:
                kinds = {_module_kind(value, ctx)}
            record.appended.setdefault(target, set()).update(kinds)

    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        record = self._record
        if record is None or not isinstance(node.operator, cst.AddAssign):
            return
        target = dotted_name(node.target)
        if target is not None and isinstance(node.value, (cst.List, cst.Tuple)):
            record.appended.setdefault(target, set()).update(_kinds((e.value for e in node.value.elements), ctx))

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
                    record.appended.setdefault(base, set()).add(_module_kind(value, ctx))
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
            kinds = _kinds((e.value for e in value.elements if not isinstance(e, cst.StarredElement)), ctx)
            container = "list"
        elif isinstance(value, cst.ListComp):
            kinds = {_module_kind(value.elt, ctx)}
            container = "list"
        elif isinstance(value, cst.Dict):
            kinds = _kinds((e.value for e in value.elements if isinstance(e, cst.DictElement)), ctx)
            container = "dict"
        elif isinstance(value, cst.DictComp):
            kinds = {_module_kind(value.value, ctx)}
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
        spelled = _nn_name(ctx, wanted)
        replacement = None
        if spelled is not None and (wrap is not None or empty):
            func = cst.parse_expression(spelled)
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


# ---------------------------------------------------------------------------------------------

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
