"""Numerics: activations fed to losses that apply them again, log of softmax, NumPy in forward."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

import re
import libcst as cst

from analyzers.context import (
    Binding,
    FileContext,
    short,
    argument,
    dotted_name,
    keyword_arg,
    positional_args,
)
from analyzers.markdown import code_span, named
from analyzers.program.flow import assignment_before, call_site_values, subtree
from analyzers.program.library import is_library, method_returns_same_module
from analyzers.program.modules import ModuleFacts
from analyzers.program.names import last_name
from analyzers.program.values import wrapped_module
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule

# ---------------------------------------------------------------------------------------------
# Shared dataflow: "which activation produced this value?"

_ACT_FUNCS = {
    "torch.softmax": "softmax",
    "torch.nn.functional.softmax": "softmax",
    "torch.special.softmax": "softmax",
    "torch.Tensor.softmax": "softmax",
    "torch.log_softmax": "log_softmax",
    "torch.nn.functional.log_softmax": "log_softmax",
    "torch.special.log_softmax": "log_softmax",
    "torch.Tensor.log_softmax": "log_softmax",
    "torch.sigmoid": "sigmoid",
    "torch.nn.functional.sigmoid": "sigmoid",
    "torch.special.expit": "sigmoid",
    "torch.Tensor.sigmoid": "sigmoid",
}
_ACT_MODULES = {
    "torch.nn.Softmax": "softmax",
    "torch.nn.modules.activation.Softmax": "softmax",
    "torch.nn.modules.Softmax": "softmax",
    "torch.nn.LogSoftmax": "log_softmax",
    "torch.nn.modules.activation.LogSoftmax": "log_softmax",
    "torch.nn.modules.LogSoftmax": "log_softmax",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.Sigmoid": "sigmoid",
}
_TENSOR_METHODS = {"softmax": "softmax", "log_softmax": "log_softmax", "sigmoid": "sigmoid"}
_SEQUENTIAL = {"torch.nn.Sequential", "torch.nn.modules.container.Sequential", "torch.nn.modules.Sequential"}
_FOLLOWED_KINDS = ("assign", "annassign", "walrus")
_CONDITIONAL = tuple(c for c in (cst.If, cst.ExceptHandler, getattr(cst, "MatchCase", None)) if c is not None)


def _is_conditional(binding: Binding, use: cst.CSTNode, ctx: FileContext) -> bool:
    """The assignment sits in an ``if``/``except`` branch that does not also enclose ``use``."""
    for ancestor in ctx.ancestors(binding.node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module, cst.Lambda)):
            return False
        if isinstance(ancestor, _CONDITIONAL) and not ctx.inside(use, ancestor):
            return True
    return False


def _resolve(expr: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode,
             depth: int = 6) -> Optional[cst.BaseExpression]:
    """Follow unconditional name/attribute assignments to the producing expression."""
    return _follow(expr, ctx, use, None, depth)[0]


def _follow(expr, ctx: FileContext, use: cst.CSTNode, inside: Optional[tuple[str, Binding]], depth: int = 6):
    """``_resolve`` that knows which binding's value it is reading: in ``D = D.to(device)`` the ``D`` on the
    right is the binding before this one. Returns (expression, the binding it came from)."""
    for _ in range(depth):
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return expr, inside
        name = dotted_name(expr)
        if name is None:
            return expr, inside
        binding = inside[1].previous if inside is not None and inside[0] == name else ctx.binding(name)
        if binding is not None and binding.value is None and binding.element == 0:
            # ``output, hidden = model(x)``: the first element is what a model's forward returns first
            if _is_conditional(binding, use, ctx):
                return None, inside
            return binding.unpacked_from, (name, binding)
        if binding is None or binding.value is None or binding.kind not in _FOLLOWED_KINDS:
            return expr, inside
        if _is_conditional(binding, use, ctx):
            return None, inside
        inside = (name, binding)
        expr = binding.value
    return expr, inside


def _module_value(expr: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The constructor call of a module object, through ``.to(device)`` / ``torch.compile`` / DDP,
    also when the wrapped module is reassigned to its own name (``D = D.to(device)``)."""
    expr, inside = _follow(expr, ctx, use, None)
    for _ in range(6):
        inner = wrapped_module(expr, ctx)
        if inner is None:
            return expr
        expr, inside = _follow(inner, ctx, use, inside)
    return expr


@dataclass
class _Act:
    kind: str  # softmax | log_softmax | sigmoid | class
    producer: cst.Call  # the call that produced the value
    inline: bool  # the expression examined *is* the producer (not reached through a name)
    form: str  # function | method | module | class
    class_name: Optional[str] = None


def _module_kind(target: Optional[cst.BaseExpression], ctx: FileContext) -> tuple[Optional[str], Optional[str]]:
    """(activation kind, local class name) of a module object's constructor call."""
    if not isinstance(target, cst.Call):
        return None, None
    name = ctx.call_name(target)
    if name in _ACT_MODULES:
        return _ACT_MODULES[name], None
    if name in _SEQUENTIAL:
        layers = positional_args(target)
        if layers and not layers[-1].star and isinstance(layers[-1].value, cst.Call):
            return _ACT_MODULES.get(ctx.call_name(layers[-1].value) or ""), None
        return None, None
    if not is_library(name):
        # a class of this repository (defined here, or imported from a sibling module)
        local = dotted_name(target.func)
        if local and local.rsplit(".", 1)[-1][:1].isupper():
            return "class", local
    return None, None


def _call_activation(call: cst.Call, ctx: FileContext, use: cst.CSTNode) -> tuple[Optional[str], str, Optional[str]]:
    """(kind, form, class name) for a call producing an activation output, or (None, "", None)."""
    func = call.func
    name = last_name(func)
    if isinstance(func, cst.Call):  # nn.Softmax(dim=1)(x)
        kind, cls = _module_kind(func, ctx)
        return (kind, "class" if kind == "class" else "module", cls) if kind else (None, "", None)
    if name is None:
        return None, "", None
    qualified = ctx.qualified_name(func)
    if qualified is not None:
        if qualified in _ACT_FUNCS:
            return _ACT_FUNCS[qualified], "function", None
        if qualified.split(".", 1)[0] in ("torch", "numpy", "scipy", "jax", "tensorflow", "sklearn"):
            return None, "", None
    receiver = func.value if isinstance(func, cst.Attribute) else None
    is_self = isinstance(receiver, cst.Name) and receiver.value == "self"
    if name in _TENSOR_METHODS and receiver is not None and not is_self and qualified is None:
        positional = len(positional_args(call))
        if (name == "sigmoid" and not call.args) or (name != "sigmoid" and positional <= 1 and call.args):
            return _TENSOR_METHODS[name], "method", None
    if name == "forward" and receiver is not None:
        func = receiver  # model.forward(x) is model(x)
    if isinstance(func, cst.Name) and func.value == "self":
        cls = ctx.class_def
        return ("class", "class", cls.name.value) if cls is not None else (None, "", None)
    if isinstance(func, (cst.Name, cst.Attribute)):
        module = _module_value(func, ctx, use)
        kind, cls = _module_kind(module, ctx)
        if kind:
            return kind, "class" if kind == "class" else "module", cls
        if isinstance(module, cst.Name) and ctx.function_def is not None:
            binding = ctx.binding(module.value)
            if binding is not None and binding.kind == "param":
                # ``def train(model, ...)``: what the model is depends on the callers; decided at the end
                return "param", "class", module.value
    return None, "", None


_SHAPE_METHODS = {"view", "reshape", "squeeze", "unsqueeze", "flatten", "contiguous", "view_as", "reshape_as"}


def _unshaped(expr: cst.BaseExpression, ctx: FileContext) -> cst.BaseExpression:
    """``criterion(output.squeeze(), y)``: reshaping keeps what the values are."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in _SHAPE_METHODS and ctx.qualified_name(expr.func) is None:
        expr = expr.func.value
    return expr


def activation_of(expr: Optional[cst.BaseExpression], ctx: FileContext, use: cst.CSTNode) -> Optional[_Act]:
    """Which activation (or which local model class) produced ``expr``, if known."""
    if expr is None:
        return None
    value = _resolve(_unshaped(expr, ctx), ctx, use)
    if value is not None:
        value = _unshaped(value, ctx)  # ``outputs = model(x).squeeze()``
    if not isinstance(value, cst.Call):
        return None
    kind, form, cls = _call_activation(value, ctx, use)
    if kind is None:
        return None
    return _Act(kind, value, value is expr, form, cls)


class _ForwardActivations:
    """Per-file record of local classes whose ``forward`` always returns an activation output."""

    def __init__(self) -> None:
        self.kinds: dict[str, Optional[str]] = {}  # class name -> kind (None: forward returns other things)
        self.bases: dict[str, list[str]] = {}
        self.returns: dict[cst.FunctionDef, list[Optional[str]]] = {}

    @staticmethod
    def forward_of(ctx: FileContext) -> Optional[cst.FunctionDef]:
        fn = ctx.function
        cls = ctx.class_def
        if isinstance(fn, cst.FunctionDef) and fn.name.value == "forward" and cls is not None:
            block = ctx.parent(fn)
            if block is not None and ctx.parent(block) is cls:
                return fn
        return None

    def visit_class(self, node: cst.ClassDef) -> None:
        self.bases[node.name.value] = [b for b in (last_name(a.value) for a in node.bases) if b]

    def visit_return(self, node: cst.Return, ctx: FileContext) -> None:
        fn = self.forward_of(ctx)
        if fn is None:
            return
        act = activation_of(node.value, ctx, node)
        self.returns.setdefault(fn, []).append(act.kind if act is not None and act.kind != "class" else None)

    def leave_function(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        if self.forward_of(ctx) is not node:
            return
        kinds = self.returns.pop(node, [])
        kind = kinds[0] if kinds and all(k == kinds[0] for k in kinds) else None
        self.kinds[ctx.class_def.name.value] = kind

    def kind(self, cls: str, seen: Optional[set] = None) -> Optional[str]:
        if cls in self.kinds:
            return self.kinds[cls]
        seen = seen or set()
        if cls in seen or cls not in self.bases:
            return None
        seen.add(cls)
        for base in self.bases[cls]:
            if base in self.bases:
                return self.kind(base, seen)
        return None


_KIND_TEXT = {"softmax": "softmax", "log_softmax": "log_softmax", "sigmoid": "sigmoid"}


class _ActivationIntoLoss(Rule):
    """Base: an activation output passed as the ``input`` of a loss that applies it itself."""

    fix_safety = "unsafe"  # dropping the activation changes the loss values (that is the point)

    #: qualified loss class / function name -> display name
    LOSS_MODULES: ClassVar[dict[str, str]] = {}
    LOSS_FUNCS: ClassVar[dict[str, str]] = {}
    #: which producer kinds each loss (display name) objects to
    KINDS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._forwards = _ForwardActivations()
        self._criteria: set[str] = set()  # dotted names ever assigned a loss object
        self._criteria_last: set[str] = set()
        self._func_last = {q.rsplit(".", 1)[-1] for q in self.LOSS_FUNCS}
        self._module_last = {q.rsplit(".", 1)[-1] for q in self.LOSS_MODULES}
        self._deferred: list[tuple] = []

    # ---- per-file facts ----------------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef, ctx: FileContext) -> None:
        self._forwards.visit_class(node)

    def visit_Return(self, node: cst.Return, ctx: FileContext) -> None:
        self._forwards.visit_return(node, ctx)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        self._forwards.leave_function(node, ctx)

    def leave_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        self._note_criterion([t.target for t in node.targets], node.value, ctx)

    def leave_AnnAssign(self, node: cst.AnnAssign, ctx: FileContext) -> None:
        if node.value is not None:
            self._note_criterion([node.target], node.value, ctx)

    def _note_criterion(self, targets, value, ctx: FileContext) -> None:
        if not isinstance(value, cst.Call):
            return
        last = last_name(value.func)
        if last not in self._module_last and not method_returns_same_module(last) and \
                ctx.imports.names.get(last or "") not in self.LOSS_MODULES:
            return
        if self._loss_module(_module_value(value, ctx, value), ctx) is None:
            return
        for target in targets:
            name = dotted_name(target)
            if name:
                self._criteria.add(name)
                self._criteria_last.add(name.rsplit(".", 1)[-1])

    def _loss_module(self, expr, ctx: FileContext) -> Optional[str]:
        if isinstance(expr, cst.Call):
            return self.LOSS_MODULES.get(ctx.call_name(expr) or "")
        return None

    # ---- the check ---------------------------------------------------------------------
    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = last_name(func)
        loss = None
        names = ctx.imports.names
        if last in self._func_last or names.get(last or "") in self.LOSS_FUNCS:
            loss = self.LOSS_FUNCS.get(ctx.qualified_name(func) or "")
            crit_text = loss
        elif last in self._criteria_last and dotted_name(func) in self._criteria:
            loss = self._loss_module(_module_value(func, ctx, node), ctx)
            crit_text = dotted_name(func)
        elif isinstance(func, cst.Call) and (last_name(func.func) in self._module_last or
                                             names.get(last_name(func.func) or "") in self.LOSS_MODULES):
            loss = self._loss_module(func, ctx)
            crit_text = loss
        if loss is None:
            return
        value = argument(node, 0, "input")
        act = activation_of(value, ctx, node)
        if act is None:
            return
        if act.kind in ("class", "param"):
            self._deferred.append((node, value, act, crit_text, loss, ctx.function_def))
            return
        if act.kind in self.KINDS.get(loss, ()):
            self._emit(node, value, act, act.kind, crit_text, loss, None)

    def end_file(self, ctx: FileContext) -> None:
        for node, value, act, crit_text, loss, fn in self._deferred:
            cls = act.class_name
            if act.kind == "param":
                cls = self._class_passed_to(fn, act.class_name, ctx)
                if cls is None:
                    continue
            kind = self._forwards.kind(cls) or ctx.facts(ModuleFacts).forward_activation(cls)
            if kind in self.KINDS.get(loss, ()):
                self._emit(node, value, act, kind, crit_text, loss, cls)

    def _class_passed_to(self, fn, parameter: str, ctx: FileContext) -> Optional[str]:
        """The one model class every call of ``fn`` in this file passes for ``parameter``, if there is one."""
        if fn is None:
            return None
        values = call_site_values(ctx, fn, parameter)
        if not values:
            return None
        classes = set()
        for value in values:
            if isinstance(value, cst.Name) and ctx.binding(value.value) is None:
                value = assignment_before(ctx, value, value.value) or value  # a local of the calling function
            kind, cls = _module_kind(_module_value(value, ctx, value), ctx)
            if kind != "class":
                return None
            classes.add(cls)
        return classes.pop() if len(classes) == 1 else None

    def _emit(self, call, value, act: _Act, kind: str, crit_text: str, loss: str, cls: Optional[str]) -> None:
        ctx = self.ctx
        shown = short(ctx, value)
        if cls is not None and act.inline:
            source = f"{code_span(shown)} is the output of {cls}, and {cls}.forward returns {kind}(...)"
        elif cls is not None:
            source = f"{code_span(shown)} comes from {code_span(short(ctx, act.producer))}, and {cls}.forward returns {kind}(...)"
        elif act.inline:
            source = f"{code_span(shown)} is a {kind} output"
        else:
            source = f"{code_span(shown)} comes from {code_span(short(ctx, act.producer))}"
        crit = f"`{crit_text}` ({loss})" if crit_text != loss else f"{loss}"
        message, severity = self.describe(crit, source, kind, loss)
        # the other site: where the activation is applied (often the line to change), so a pull request
        # that only touches forward's return is still told about the loss it feeds
        related = []
        if cls is not None:
            line = ctx.facts(ModuleFacts).forward_site(cls)
            if line is not None:
                related.append((line, f"`{cls}.forward` returns {kind}(...) here"))
        elif not act.inline:
            related.append((act.producer, f"the {kind} is applied here"))
        self.report(value, message, replacement=self.fix(act, kind, cls), severity=severity, related=related)

    def describe(self, crit: str, source: str, kind: str, loss: str) -> tuple[str, Optional[Severity]]:
        raise NotImplementedError

    def fix(self, act: _Act, kind: str, cls: Optional[str]) -> Optional[cst.CSTNode]:
        return None


_CE_MODULES = {"torch.nn.CrossEntropyLoss": "CrossEntropyLoss",
               "torch.nn.modules.loss.CrossEntropyLoss": "CrossEntropyLoss",
               "torch.nn.NLLLoss": "NLLLoss", "torch.nn.modules.loss.NLLLoss": "NLLLoss"}
_CE_FUNCS = {"torch.nn.functional.cross_entropy": "F.cross_entropy", "torch.nn.functional.nll_loss": "F.nll_loss"}


class SoftmaxBeforeCrossEntropy(_ActivationIntoLoss):
    id = "TR401"
    source_hint = re.compile(r"ross_?[Ee]ntropy|NLLLoss|nll_loss")  # the loss is named in this file (import or call)
    slug = "softmax-before-cross-entropy"
    category = Category.NUMERICS
    severity = Severity.HIGH
    summary = "softmax output passed to CrossEntropyLoss, which applies log_softmax itself"
    what = """
        Flags a softmax output (`F.softmax`, `torch.softmax`, `x.softmax(dim)`, an
        `nn.Softmax` module, a `Sequential` ending in `nn.Softmax`, or a model defined in the
        file whose `forward` returns softmax) passed as the input of `nn.CrossEntropyLoss` /
        `F.cross_entropy`, and softmax probabilities passed to `NLLLoss` / `F.nll_loss`.
        A `log_softmax` output passed to CrossEntropyLoss is reported at low severity as
        redundant.
    """
    why = """
        `CrossEntropyLoss` expects raw logits: it applies `log_softmax` internally. Feeding it
        probabilities squashes the logits into [0, 1], so the loss can never approach zero,
        its gradients shrink as the model grows confident and training stalls or converges
        to a worse model, without any error. `NLLLoss` expects log-probabilities, so
        probabilities there give a wrong loss.
    """
    example = """
        probs = F.softmax(model(x), dim=1)
        loss = criterion(probs, y)  # criterion = nn.CrossEntropyLoss()
    """
    fix_example = """
        logits = model(x)
        loss = criterion(logits, y)
        probs = F.softmax(logits, dim=1)  # only for metrics / predictions
    """
    LOSS_MODULES = _CE_MODULES
    LOSS_FUNCS = _CE_FUNCS
    KINDS = {"CrossEntropyLoss": ("softmax", "log_softmax"), "F.cross_entropy": ("softmax", "log_softmax"),
             "NLLLoss": ("softmax",), "F.nll_loss": ("softmax",)}
    VALID = [
        # logits into the loss, softmax only for metrics
        """
        import torch.nn as nn
        import torch.nn.functional as F
        criterion = nn.CrossEntropyLoss()
        logits = model(x)
        loss = criterion(logits, y)
        probs = F.softmax(logits, dim=1)
        pred = probs.argmax(dim=1)
        """,
        # log_softmax + NLLLoss is the intended pairing
        """
        import torch.nn as nn
        import torch.nn.functional as F
        criterion = nn.NLLLoss()
        loss = criterion(F.log_softmax(out, dim=1), y)
        """,
        # softmax rebound to something else before the loss
        """
        import torch
        import torch.nn.functional as F
        out = F.softmax(logits, dim=-1)
        out = head(features)
        loss = F.cross_entropy(out, y)
        """,
        # forward returns logits in training, probabilities at inference
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Net(nn.Module):
            def forward(self, x):
                x = self.fc(x)
                if self.training:
                    return x
                return F.softmax(x, dim=1)
        model = Net()
        criterion = nn.CrossEntropyLoss()
        loss = criterion(model(x), y)
        """,
        # softmax only on the inference branch
        """
        import torch.nn.functional as F
        out = model(x)
        if not training:
            out = F.softmax(out, dim=1)
        loss = F.cross_entropy(out, y)
        """,
        # a different criterion object
        """
        import torch.nn as nn
        criterion = nn.MSELoss()
        loss = criterion(probs.softmax(1), y)
        """,
        # a custom class with its own softmax method that is not a tensor
        """
        import torch
        import torch.nn as nn
        class Head(nn.Module):
            def softmax(self, x):
                return x
            def forward(self, x):
                return self.softmax(x)
        loss = nn.CrossEntropyLoss()(Head()(x), y)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            criterion = nn.CrossEntropyLoss()
            probs = F.softmax(logits, dim=1)
            loss = criterion(probs, y)
            """,
            line=6, message="`criterion` (CrossEntropyLoss)",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = F.cross_entropy(F.softmax(out, 1), target)
            """,
            line=4, message="F.cross_entropy",
        ),
        Invalid(
            """
            import torch as th
            loss = th.nn.functional.cross_entropy(input=out.softmax(dim=-1), target=y)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            class Classifier(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(10, 3)
                    self.softmax = nn.Softmax(dim=1)
                def forward(self, x):
                    return self.softmax(self.fc(x))
            model = Classifier().to("cuda")
            criterion = nn.CrossEntropyLoss()
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
            """,
            line=15, message="Classifier.forward returns softmax",
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn import CrossEntropyLoss
            class Trainer:
                def __init__(self):
                    self.loss_fn = CrossEntropyLoss(label_smoothing=0.1)
                    self.head = nn.Sequential(nn.Linear(4, 2), nn.Softmax(dim=-1))
                def step(self, x, y):
                    return self.loss_fn(self.head(x), y)
            """,
            line=9, message="`self.loss_fn` (CrossEntropyLoss)",
        ),
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            criterion = nn.CrossEntropyLoss()
            loss = criterion(F.log_softmax(logits, dim=1), y)
            """,
            line=5, message="NLLLoss",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = F.nll_loss(torch.softmax(logits, dim=1), y)
            """,
            line=4, message="log-probabilities",
        ),
        Invalid(
            """
            import torch
            import lightning as L
            import torch.nn.functional as F
            class Lit(L.LightningModule):
                def forward(self, x):
                    return F.softmax(self.net(x), dim=1)
                def training_step(self, batch, idx):
                    x, y = batch
                    logits = self(x)
                    return F.cross_entropy(logits, y)
            """,
            line=11, message="Lit.forward returns softmax",
        ),
    ]

    def describe(self, crit, source, kind, loss):
        if loss in ("NLLLoss", "F.nll_loss"):
            return (f"{crit} receives probabilities: {source}; NLLLoss expects log-probabilities, so the loss "
                    f"is wrong. Use log_softmax (or pass raw logits to CrossEntropyLoss)"), None
        if kind == "log_softmax":
            return (f"{crit} receives a log_softmax output: {source}; CrossEntropyLoss applies log_softmax "
                    f"itself, so this is redundant work. Use NLLLoss with log_softmax, or drop log_softmax "
                    f"and pass raw logits"), Severity.LOW
        return (f"{crit} receives probabilities: {source}; CrossEntropyLoss applies log_softmax itself, so "
                f"softmax is applied twice, the loss saturates and gradients vanish. Pass the raw logits and "
                f"keep softmax for predictions/metrics"), None


class SigmoidBeforeBCE(_ActivationIntoLoss):
    id = "TR402"
    source_hint = re.compile(r"BCELoss|binary_cross_entropy")  # the loss is named in this file (import or call)
    slug = "sigmoid-before-bce"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "sigmoid followed by BCELoss instead of BCEWithLogitsLoss"
    what = """
        Flags a sigmoid output (`torch.sigmoid`, `F.sigmoid`, `x.sigmoid()`, an `nn.Sigmoid`
        module, or a model defined in the file whose `forward` returns sigmoid) passed to
        `nn.BCELoss` / `F.binary_cross_entropy`.
    """
    why = """
        `sigmoid` saturates to exactly 0.0 or 1.0 in float32 (and much sooner in float16), and
        `BCELoss` then takes `log(0)`: PyTorch clamps the log at -100, so the loss and its
        gradient become meaningless for confident mistakes. `BCEWithLogitsLoss` fuses the two
        with the log-sum-exp trick and stays exact; it is also the only one allowed under
        autocast.
    """
    example = """
        criterion = nn.BCELoss()
        loss = criterion(torch.sigmoid(logits), y)
    """
    fix_example = """
        criterion = nn.BCEWithLogitsLoss()
        loss = criterion(logits, y)
    """
    LOSS_MODULES = {"torch.nn.BCELoss": "BCELoss", "torch.nn.modules.loss.BCELoss": "BCELoss"}
    LOSS_FUNCS = {"torch.nn.functional.binary_cross_entropy": "F.binary_cross_entropy"}
    KINDS = {"BCELoss": ("sigmoid",), "F.binary_cross_entropy": ("sigmoid",)}
    VALID = [
        """
        import torch
        import torch.nn as nn
        criterion = nn.BCEWithLogitsLoss()
        loss = criterion(logits, y)
        probs = torch.sigmoid(logits)
        """,
        # probabilities that do not come from a sigmoid (e.g. a mixture) are fine for BCELoss
        """
        import torch
        import torch.nn as nn
        criterion = nn.BCELoss()
        loss = criterion(mix_weights * p1 + (1 - mix_weights) * p2, y)
        """,
        """
        import torch
        import torch.nn.functional as F
        p = torch.sigmoid(logits)
        p = p.clamp(1e-6, 1 - 1e-6)
        loss = F.binary_cross_entropy(p.clamp(1e-6, 1 - 1e-6), y)
        """,
    ]
    INVALID = [
        # a Sequential ending in Sigmoid, moved to the device under its own name
        Invalid("""
            import torch.nn as nn
            D = nn.Sequential(nn.Linear(784, 1), nn.Sigmoid())
            D = D.to(device)
            criterion = nn.BCELoss()
            d_loss = criterion(D(images), real_labels)
            """, line=6, message="BCELoss"),
        # forward returns the Sequential's output reshaped, on both data-parallel branches
        Invalid("""
            import torch.nn as nn
            class Discriminator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.main = nn.Sequential(nn.Conv2d(3, 1, 4), nn.Sigmoid())
                def forward(self, x):
                    if x.is_cuda and self.ngpu > 1:
                        output = nn.parallel.data_parallel(self.main, x, range(self.ngpu))
                    else:
                        output = self.main(x)
                    return output.view(-1, 1).squeeze(1)
            netD = Discriminator().to(device)
            criterion = nn.BCELoss()
            errD = criterion(netD(real), label)
            """, line=15, message="Discriminator.forward returns sigmoid"),
        # a tuple return (output, hidden), unpacked, squeezed
        Invalid("""
            import torch.nn as nn
            class RNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lstm = nn.LSTM(8, 8, batch_first=True)
                    self.fc = nn.Linear(8, 1)
                    self.sig = nn.Sigmoid()
                def forward(self, x, hidden):
                    out, hidden = self.lstm(x, hidden)
                    out = self.sig(self.fc(out))
                    out = out[:, -1]
                    return out, hidden
            net = RNN()
            criterion = nn.BCELoss()
            for inputs, labels in loader:
                output, h = net(inputs, h)
                loss = criterion(output.squeeze(), labels.float())
            """, line=18),
        # the model arrives as a parameter; the caller passes the class
        Invalid("""
            import torch.nn as nn
            class Siamese(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 1)
                    self.sigmoid = nn.Sigmoid()
                def forward(self, a, b):
                    output = self.fc(a - b)
                    output = self.sigmoid(output)
                    return output
            def train(args, model, loader, optimizer):
                criterion = nn.BCELoss()
                for x1, x2, y in loader:
                    loss = criterion(model(x1, x2).squeeze(), y)
            def main():
                model = Siamese().to(device)
                train(args, model, loader, optimizer)
            """, line=15, message="Siamese.forward returns sigmoid"),
        Invalid(
            """
            import torch
            import torch.nn as nn
            criterion = nn.BCELoss()
            loss = criterion(torch.sigmoid(logits), y)
            """,
            line=5, message="`criterion` (BCELoss)",
        ),
        Invalid(
            """
            import torch.nn.functional as F
            probs = logits.sigmoid()
            loss = F.binary_cross_entropy(probs, target, reduction="sum")
            """,
            line=4, message="BCEWithLogitsLoss",
        ),
        Invalid(
            """
            from torch import nn
            class Disc(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
                def forward(self, x):
                    return self.net(x)
            D = Disc()
            adv_loss = nn.BCELoss()
            loss = adv_loss(D(fake), valid)
            """,
            line=11, message="Disc.forward returns sigmoid",
        ),
    ]

    def describe(self, crit, source, kind, loss):
        return (f"{crit} receives a sigmoid output: {source}; sigmoid + BCELoss is numerically unstable "
                f"(log(0) once the sigmoid saturates). Pass the logits to BCEWithLogitsLoss / "
                f"F.binary_cross_entropy_with_logits instead"), None


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


# ---------------------------------------------------------------------------------------------
# TR404


class LogOfSoftmax(Rule):
    id = "TR404"
    slug = "log-of-softmax"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "torch.log(softmax(x)) instead of log_softmax(x)"
    what = """
        Flags `torch.log(...)` / `.log()` applied directly to a softmax output
        (`F.softmax`, `torch.softmax`, `x.softmax(dim)`, an `nn.Softmax` module), inline or
        through a variable. A log taken after adding an epsilon or clamping is not flagged.
    """
    why = """
        softmax underflows to exactly 0 for strongly negative logits, and `log(0)` is `-inf`,
        which turns the loss and every gradient into NaN. `log_softmax` computes the same
        value with the log-sum-exp trick: it is exact, stable and faster.
    """
    example = """
        log_probs = torch.log(F.softmax(logits, dim=1))
    """
    fix_example = """
        log_probs = F.log_softmax(logits, dim=1)
    """
    VALID = [
        """
        import torch
        import torch.nn.functional as F
        log_probs = F.log_softmax(logits, dim=1)
        """,
        # an epsilon or a clamp is an intentional guard
        """
        import torch
        import torch.nn.functional as F
        probs = F.softmax(logits, dim=1)
        ent = -(probs * torch.log(probs + 1e-8)).sum(1)
        """,
        """
        import torch
        probs = torch.softmax(logits, -1)
        lp = probs.clamp(min=1e-6).log()
        """,
        # log of something else; math.log is not a tensor op
        """
        import math
        import torch
        x = torch.log(torch.exp(a) + 1)
        y = math.log(softmax_temperature)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            log_probs = torch.log(F.softmax(logits, dim=1))
            """,
            line=4, message="F.log_softmax",
            fixed="""
            import torch
            import torch.nn.functional as F
            log_probs = F.log_softmax(logits, dim=1)
            """,
        ),
        Invalid(
            """
            import torch
            lp = torch.log(x.softmax(-1))
            """,
            line=3,
            fixed="""
            import torch
            lp = x.log_softmax(-1)
            """,
        ),
        Invalid(
            """
            import torch as th
            lp = th.softmax(scores, dim=-1).log()
            """,
            line=3,
            fixed="""
            import torch as th
            lp = th.log_softmax(scores, dim=-1)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            probs = F.softmax(logits, dim=-1)
            kl = (probs * torch.log(probs)).sum(-1)
            """,
            line=5, message="`probs`",
        ),
        Invalid(
            """
            import torch
            from torch.nn.functional import softmax
            lp = torch.log(softmax(x, dim=1))
            """,
            line=4,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if last_name(func) != "log":
            return
        qualified = ctx.qualified_name(func)
        if qualified == "torch.log":
            if len(node.args) > 2 or any(a.star for a in node.args):
                return
            value = argument(node, 0, "input")
            form = "function"
        elif qualified is None and isinstance(func, cst.Attribute) and not node.args:
            value = func.value
            form = "method"
        else:
            return
        act = activation_of(value, ctx, node)
        if act is None or act.kind != "softmax":
            return
        log_text = "torch.log(...)" if form == "function" else ".log()"
        if act.inline:
            subject = f"{code_span(short(ctx, act.producer))}"
        else:
            subject = f"{code_span(short(ctx, value))} (from {code_span(short(ctx, act.producer))})"
        replacement = self._fix(node, act, ctx) if act.inline and keyword_arg(node, "out") is None else None
        suggestion = short(ctx, replacement) if replacement is not None else "log_softmax(...)"
        self.report(node, f"{log_text} of the softmax output {subject}: softmax underflows to 0 and log(0) "
                          f"gives -inf/NaN gradients; use {suggestion}, which is exact and stable",
                    replacement=replacement)

    @staticmethod
    def _fix(log_call: cst.Call, act: _Act, ctx: FileContext) -> Optional[cst.Call]:
        call = act.producer
        func = call.func
        if act.form == "method" and isinstance(func, cst.Attribute):
            new_func = func.with_changes(attr=cst.Name("log_softmax"))
        elif act.form == "function" and isinstance(func, cst.Attribute) and func.attr.value == "softmax":
            new_func = func.with_changes(attr=cst.Name("log_softmax"))
        elif act.form == "function" and isinstance(func, cst.Name):
            wanted = (ctx.qualified_name(func) or "").rsplit(".", 1)[0] + ".log_softmax"
            local = next((n for n, q in ctx.imports.names.items() if q == wanted), None)
            if local is None:
                return None
            new_func = cst.Name(local)
        else:
            return None
        return call.with_changes(func=new_func, lpar=log_call.lpar, rpar=log_call.rpar)


# ---------------------------------------------------------------------------------------------
# TR405

_SHAPE_ATTRS = {"shape", "device", "dtype", "ndim", "is_cuda", "requires_grad", "layout", "is_sparse", "names"}
_SCALAR_METHODS = {"size", "dim", "numel", "item", "tolist", "numpy", "element_size", "get_device", "nelement",
                   "dim_order", "stride", "data_ptr", "is_contiguous", "is_floating_point"}
_SCALAR_BUILTINS = {"len", "isinstance", "type", "int", "float", "bool", "str", "id", "hasattr", "getattr", "print"}
_SCALAR_ANNOTATIONS = {"int", "float", "bool", "str", "tuple", "Tuple", "list", "List", "dict", "Dict"}
_NP_CONVERSIONS = {"array", "asarray", "asanyarray", "ascontiguousarray", "copy", "float32", "float64"}
_NP_TO_TORCH = {"power": "pow", "concatenate": "cat", "absolute": "abs", "arctan": "atan", "arcsin": "asin",
                "arccos": "acos", "arctan2": "atan2", "dot": "matmul", "expand_dims": "unsqueeze",
                "transpose": "permute", "swapaxes": "transpose", "maximum": "maximum", "minimum": "minimum"}
_NOT_LOSS_PREFIXES = ("plot", "print", "log_", "show", "save", "record", "track", "report", "write", "visual",
                      "draw", "display", "update", "reset", "get_", "load", "summar", "average", "avg", "smooth",
                      "eval", "val", "test", "compute_val", "compute_test", "compute_eval")


@dataclass
class _NumpyState:
    node: cst.FunctionDef
    kind: Optional[str]  # forward | loss | None
    label: str
    tainted: set[str] = field(default_factory=set)
    # in forward: names computed by the module's own layers (a gradient reaches parameters through them)
    activations: set[str] = field(default_factory=set)
    on_raw_input: set = field(default_factory=set)  # findings on the input, before any layer ran
    calls_layers: bool = False
    found: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    statements: set = field(default_factory=set)
    uses_torch: bool = False


def _detached_side_output(found: cst.CSTNode, ctx: FileContext) -> bool:
    """A NumPy copy returned next to the result, after an explicit ``.detach()`` / ``.data``: a second output
    (replay priorities, statistics) that the author took out of autograd on purpose, not part of the loss."""
    element = ctx.parent(found)
    tup = ctx.parent(element) if isinstance(element, cst.Element) else None
    if not isinstance(tup, cst.Tuple) or not isinstance(ctx.parent(tup), cst.Return) or tup.elements[0] is element:
        return False
    node = found
    while isinstance(node, (cst.Call, cst.Attribute)):
        if isinstance(node, cst.Call):
            node = node.func
            continue
        if node.attr.value in ("data", "detach"):
            return True
        node = node.value
    return False


class NumpyInForward(Rule):
    id = "TR405"
    source_hint = re.compile(r"numpy|np\.")  # ``.numpy()`` or a NumPy call
    slug = "numpy-in-forward"
    category = Category.NUMERICS
    severity = Severity.HIGH
    summary = "NumPy on tensors inside forward() or a loss function breaks autograd"
    what = """
        Flags `.numpy()` and NumPy calls (`np.exp`, `np.log`, `np.sum`, `np.array(t)`,
        `np.asarray`...) on tensors inside the `forward` of an `nn.Module` subclass or inside a
        loss function (a function whose name contains "loss", or a `*Loss` class). NumPy on
        shapes and constants (`np.sqrt(self.d_model)`, `np.prod(x.shape)`, `np.pi`) is fine, and
        so is NumPy on the raw input of a module that runs its own layers on another path
        (pre-processing, or an inference dispatcher handing the input to ONNX Runtime / OpenCV),
        and anything in an inference-only `forward` (`@torch.inference_mode()`, `@torch.no_grad()`).
    """
    why = """
        Autograd only records torch operations. A value that goes through NumPy is a plain
        array: nothing upstream of it receives a gradient, so the layers before it silently
        stop learning (or the loss cannot be backpropagated at all). It also forces a
        GPU→CPU copy and a device synchronisation on every call.
    """
    example = """
        def forward(self, x):
            h = self.fc(x)
            return torch.tensor(np.exp(h.detach().numpy()))
    """
    fix_example = """
        def forward(self, x):
            h = self.fc(x)
            return torch.exp(h)
    """
    VALID = [
        # type dispatch over outputs of other runtimes
        """
        import numpy as np
        import torch.nn as nn
        class Backend(nn.Module):
            def forward(self, im):
                y = self.model(im)
                y = [x if isinstance(x, np.ndarray) else x.numpy() for x in y]
                return y
        """,
        # an inference dispatcher: the input goes to another runtime on one branch, to the layers on another
        """
        import torch
        import torch.nn as nn
        class Backend(nn.Module):
            def forward(self, im):
                if self.pt:
                    y = self.model(im)
                elif self.onnx:
                    im = im.cpu().numpy()
                    y = self.session.run(None, {"images": im})
                return y
        """,
        """
        import numpy as np
        import torch
        import torch.nn as nn
        class Attn(nn.Module):
            def forward(self, q, k):
                scores = q @ k.transpose(-2, -1) / np.sqrt(self.d_k)
                n = np.prod(q.shape[:-1])
                return scores * np.pi / n
        """,
        # numpy outside forward / in evaluation helpers
        """
        import numpy as np
        import torch
        def evaluate(model, x):
            preds = model(x).detach().cpu().numpy()
            return np.mean(preds)
        """,
        # scalar parameters and sizes
        """
        import numpy as np
        import torch.nn as nn
        class PE(nn.Module):
            def forward(self, x, scale: float = 1.0):
                seq = x.size(1)
                pos = np.arange(seq)
                return x + self.table[:seq] * np.log(scale)
        """,
        # prioritized replay: the loss, and beside it the detached per-sample errors as new priorities
        """
        import torch
        def weighted_td_loss(q, target, weights):
            td = torch.nn.functional.smooth_l1_loss(q, target, reduction="none")
            weighted = weights * td
            return torch.mean(weighted), (weighted + 1e-6).detach().cpu().numpy()
        """,
        # a loss-plotting helper is not a loss function
        """
        import numpy as np
        import torch
        def plot_losses(losses):
            smooth = np.convolve(losses, np.ones(5) / 5)
            plt.plot(smooth)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import numpy as np
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def forward(self, x):
                    h = self.fc(x)
                    return torch.from_numpy(np.exp(h.detach().numpy()))
            """,
            line=8, message="Net.forward",
        ),
        Invalid(
            """
            import numpy
            import torch
            from torch import nn
            class Gate(nn.Module):
                def forward(self, x, mask=None):
                    w = self.proj(x)
                    w = numpy.tanh(w)
                    return x * torch.as_tensor(w)
            """,
            line=8, message="`w`",
        ),
        Invalid(
            """
            import numpy as np
            import torch
            def focal_loss(logits, targets, gamma=2.0):
                p = torch.sigmoid(logits)
                weight = np.power(1 - p, gamma)
                return (weight * targets).mean()
            """,
            line=6, message="focal_loss",
        ),
        Invalid(
            """
            import numpy as np
            import torch
            import torch.nn as nn
            class DiceLoss(nn.Module):
                def forward(self, pred, target):
                    inter = np.sum(pred * target)
                    return 1 - 2 * inter / (pred.sum() + target.sum())
            """,
            line=7, message="DiceLoss.forward",
        ),
        Invalid(
            """
            import numpy as np
            import torch.nn as nn
            class M(nn.Module):
                def forward(self, x):
                    arr = x.cpu().numpy()
                    out = np.exp(arr)
                    return x
            """,
            line=6, message="x.cpu().numpy()",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._states: list[_NumpyState] = []
        self._numpy_names = {local for local, q in ctx.imports.names.items() if q == "numpy" or q.startswith("numpy.")}

    def _kind(self, node: cst.FunctionDef, ctx: FileContext) -> tuple[Optional[str], str]:
        cls = ctx.class_def
        block = ctx.parent(node)
        method = cls is not None and block is not None and ctx.parent(block) is cls
        name = node.name.value
        if method:
            label = f"{cls.name.value}.{name}"
            is_module = ctx.is_module_subclass(cls)
            if name == "forward" and is_module:
                return "forward", label
            if "loss" in cls.name.value.lower() and name in ("forward", "__call__"):
                return "loss", label
        else:
            label = name
        lowered = name.lower()
        if "loss" in lowered and not lowered.lstrip("_").startswith(_NOT_LOSS_PREFIXES):
            return "loss", label
        return None, label

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        kind, label = self._kind(node, ctx)
        state = _NumpyState(node, kind, label)
        if kind is not None:
            params = node.params
            skip_first = label != node.name.value  # a method: drop self
            ordered = list(params.posonly_params) + list(params.params)
            if skip_first and ordered:
                ordered = ordered[1:]
            for param in ordered + list(params.kwonly_params):
                if _scalar_param(param):
                    continue
                state.tainted.add(param.name.value)
        self._states.append(state)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        state = self._states.pop()
        if state.kind == "loss" and not state.uses_torch:
            return
        for found, message in state.found:
            if _detached_side_output(found, ctx):
                continue  # ``return loss, td.detach().cpu().numpy()``: priorities / stats beside the loss, on purpose
            if state.calls_layers and found in state.on_raw_input:
                # NumPy on the raw input of a module that runs its own layers elsewhere: pre-processing or a
                # hand-off to another runtime (ONNX Runtime, OpenCV), not a cut in this module's gradient path
                continue
            self.report(found, message)

    def _state(self) -> Optional[_NumpyState]:
        if self._states and self._states[-1].kind is not None and self.ctx.function is self._states[-1].node:
            return self._states[-1]
        return None

    def leave_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        state = self._state()
        if state is not None:
            self._taint([t.target for t in node.targets], node.value, state)

    def leave_AnnAssign(self, node: cst.AnnAssign, ctx: FileContext) -> None:
        state = self._state()
        if state is not None and node.value is not None:
            self._taint([node.target], node.value, state)

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        state = self._state()
        if state is not None:
            self._taint([node.target], node.iter, state)

    def _taint(self, targets, value, state: _NumpyState) -> None:
        tensor = self._uses_tensor(value, state)
        activation = state.kind == "forward" and self._is_activation(value, state)
        for target in targets:
            for name in _target_names(target):
                if tensor:
                    state.tainted.add(name)
                else:
                    state.tainted.discard(name)
                if activation:
                    state.activations.add(name)
                else:
                    state.activations.discard(name)

    @staticmethod
    def _is_activation(expr: cst.CSTNode, state: _NumpyState) -> bool:
        """Computed by a layer of this module (``self.fc(x)``), or from such a value."""
        for node in subtree(expr):
            if isinstance(node, cst.Name) and node.value in state.activations:
                return True
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                receiver = node.func.value
                while isinstance(receiver, cst.Attribute):
                    receiver = receiver.value
                if isinstance(receiver, cst.Name) and receiver.value == "self" and \
                        isinstance(node.func.value, cst.Name):
                    return True  # self.layer(x)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                    isinstance(node.func.value, cst.Attribute) and dotted_name(node.func.value) and \
                    dotted_name(node.func.value).startswith("self."):
                return True  # self.blocks.forward(x) / self.head.fc(x)
        return False

    def _uses_tensor(self, expr: cst.CSTNode, state: _NumpyState) -> Optional[str]:
        """The first tensor-valued name used in ``expr`` outside shape/scalar/NumPy contexts."""
        if not state.tainted:
            return None
        stack: list[cst.CSTNode] = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Name):
                if node.value in state.tainted:
                    return node.value
                continue
            if isinstance(node, cst.Attribute):
                if node.attr.value not in _SHAPE_ATTRS:
                    stack.append(node.value)
                continue
            if isinstance(node, cst.Call):
                func = node.func
                last = last_name(func)
                if isinstance(func, cst.Attribute) and last in _SCALAR_METHODS:
                    continue
                if isinstance(func, cst.Name) and last in _SCALAR_BUILTINS:
                    continue
                if self._is_numpy(func):
                    continue  # reported on its own
                stack.extend(reversed([func] + [a.value for a in node.args]))
                continue
            if isinstance(node, cst.Arg):
                stack.append(node.value)
                continue
            if isinstance(node, (cst.Lambda, cst.SimpleString, cst.FormattedString)):
                continue
            stack.extend(reversed(node.children))
        return None

    def _is_numpy(self, func: cst.BaseExpression) -> bool:
        if not self._numpy_names:
            return False
        head = func
        while isinstance(head, cst.Attribute):
            head = head.value
        return isinstance(head, cst.Name) and head.value in self._numpy_names and \
            (self.ctx.qualified_name(func) or "").startswith("numpy")

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not self._states:
            return
        state = self._state()
        if state is None:
            return
        func = node.func
        if state.kind == "forward" and isinstance(func, cst.Attribute) and \
                (dotted_name(func.value) or "").startswith("self") and func.attr.value not in _SCALAR_METHODS:
            state.calls_layers = True
        if state.kind == "loss" and not state.uses_torch:
            name = ctx.call_name(node) if isinstance(func, (cst.Name, cst.Attribute)) else None
            if name is not None and name.startswith("torch"):
                state.uses_torch = True
        last = last_name(func)
        if last == "numpy" and isinstance(func, cst.Attribute) and not node.args:
            if ctx.qualified_name(func) is None:
                self._found(state, node, f"{code_span(short(ctx, node))} in {state.label} converts a tensor to NumPy: "
                                         f"no gradient flows back through it, and it forces a device sync; "
                                         f"keep the computation in torch")
            return
        if not self._is_numpy(func):
            return
        for arg in node.args:
            tensor = self._uses_tensor(arg.value, state)
            if tensor is not None:
                np_name = dotted_name(func)
                if last in _NP_CONVERSIONS:
                    advice = f"keep `{tensor}` a tensor"
                else:
                    advice = f"use torch.{_NP_TO_TORCH.get(last, last)} instead"
                self._found(state, node, f"`{np_name}(...)` in {state.label} runs NumPy on {named('tensor', tensor)}: "
                                         f"autograd does not track NumPy, so no gradient flows back through it; "
                                         f"{advice}")
                return

    def _found(self, state: _NumpyState, node: cst.Call, message: str) -> None:
        if any(isinstance(a, (cst.IfExp, cst.If)) and "isinstance" in self.ctx.module.code_for_node(a.test)
               for a in self.ctx.ancestors(node)):
            return  # type dispatch (``x if isinstance(x, np.ndarray) else x.numpy()``): other runtimes' outputs
        if self.ctx.in_no_grad() or any("inference" in d or "no_grad" in d
                                        for d in self.ctx.decorators_of(state.node)):
            return  # no gradient is wanted there (a loss for logging, an inference-only forward)
        if state.kind == "forward" and not self._is_activation(node, state):
            state.on_raw_input.add(node)
        statement = self.ctx.statement_of(node)
        if statement in state.statements:
            return
        state.statements.add(statement)
        state.found.append((node, message))


def _scalar_param(param: cst.Param) -> bool:
    annotation = param.annotation.annotation if param.annotation is not None else None
    if isinstance(annotation, cst.Name) and annotation.value in _SCALAR_ANNOTATIONS:
        return True
    default = param.default
    if isinstance(default, (cst.Integer, cst.Float, cst.SimpleString, cst.Tuple)):
        return True
    if isinstance(default, cst.UnaryOperation) and isinstance(default.expression, (cst.Integer, cst.Float)):
        return True
    return isinstance(default, cst.Name) and default.value in ("True", "False")


def _target_names(target: cst.BaseExpression):
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_names(target.value)
