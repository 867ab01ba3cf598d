"""Which ``nn.Module`` an expression builds, as far as the program shows: the one answer the rules ask before
falling back to what a name says."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst
import libcst.matchers as m

from analyzers.context import FileContext, argument, dotted_name, is_false
from analyzers.program.flow import assignment_before, call_site_values
from analyzers.program.library import (Does, builds_library_model, does, method_does, method_returns_same_module,
                                       pretrained_gives_no_module, wrapped_module_argument)


# torch.nn classes without dropout / batch-norm / parameters worth the name "model"
_NN_NOT_MODELS = {"Softmax", "LogSoftmax", "Sigmoid", "ReLU", "ReLU6", "LeakyReLU", "Tanh", "GELU", "SiLU", "ELU",
                  "Identity", "Flatten", "Unflatten", "Upsample", "Softplus", "Hardtanh", "Mish", "CosineSimilarity",
                  "PairwiseDistance", "Parameter", "ParameterList", "ParameterDict", "ModuleList", "ModuleDict"}


@dataclass(frozen=True)
class BuiltModule:
    """What the program can tell about the ``nn.Module`` an expression builds."""

    model: bool  # has layers worth calling a model (not a bare activation, a loss or a parameter container)
    eval_mode: bool  # the chain (``.eval()``, ``.train(False)``) or the loader leaves it in evaluation mode


def built_module(ctx: FileContext, value: Optional[cst.BaseExpression]) -> Optional[BuiltModule]:
    """The module ``value`` builds when the program can tell it builds one: a ``torch.nn`` class, a module class
    of this file, a torchvision / timm model, a loader that returns a model (``from_pretrained``,
    ``torch.jit.load``), through the methods that return the module itself (``Net().to(device).eval()``) and the
    names those are called on. None when nothing says (an unknown call, a parameter)."""
    eval_mode = False
    expr = value
    for _ in range(8):
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
                method_returns_same_module(expr.func.attr.value):
            attr = expr.func.attr.value
            if attr == "eval" or (attr == "train" and is_false(argument(expr, 0, "mode"))):
                eval_mode = True
            expr = ctx.origin(expr.func.value)
            continue
        wrapped = wrapped_module_argument(ctx.call_name(expr)) if isinstance(expr, cst.Call) else None
        inner = argument(expr, *wrapped) if wrapped is not None else None
        if inner is None:
            break
        expr = ctx.origin(inner)  # DataParallel(model), torch.compile(model): the module inside, in its mode
    if not isinstance(expr, cst.Call):
        return None
    if isinstance(expr.func, cst.Attribute) and method_does(expr.func.attr.value, Does.RETURNS_EVAL_MODEL):
        if pretrained_gives_no_module(dotted_name(expr.func.value)):
            return None  # ``AutoTokenizer.from_pretrained(...)``: a tokenizer, no module
        return BuiltModule(True, True)
    called = ctx.call_name(expr)
    if does(called, Does.RETURNS_EVAL_MODEL):
        return BuiltModule(True, True)
    if called:
        leaf = called.rsplit(".", 1)[-1]
        if called.startswith("torch.nn.") and leaf[:1].isupper():
            return BuiltModule(not leaf.endswith("Loss") and leaf not in _NN_NOT_MODELS, eval_mode)
        if called.startswith(("torchvision.models.", "timm.create_model")):
            return BuiltModule(True, eval_mode)
    local = dotted_name(expr.func)
    if local and local in ctx.module_classes_in_file:
        return BuiltModule(True, eval_mode)
    return None


def passed_module(ctx: FileContext, param: cst.BaseExpression, use: cst.CSTNode,
                  depth: int = 0) -> Optional[BuiltModule]:
    """The module a parameter holds when every call of its function in this file passes one the program sees
    built (``test(model, predictor)`` after ``predictor = LinkPredictor(...).to(device)``), through callers'
    own parameters; in eval mode only when every caller's is. None when a call passes something else, passes
    it through ``*args``, or there is no call in the file (callers elsewhere may pass anything)."""
    if depth > 3 or not isinstance(param, cst.Name):
        return None
    fn = next((a for a in ctx.ancestors(use) if isinstance(a, cst.FunctionDef)), None)
    if fn is None or not any(p.name.value == param.value for p in (*fn.params.posonly_params, *fn.params.params,
                                                                       *fn.params.kwonly_params)):
        return None
    if assignment_before(ctx, use, param.value) is not None:
        return None  # rebound in the function: the parameter's value is not what reaches the use
    values = call_site_values(ctx, fn, param.value)
    if not values:
        return None
    found: list[BuiltModule] = []
    for value in values:
        expr: Optional[cst.BaseExpression] = value
        for _ in range(4):  # ``predictor = LinkPredictor(...)`` two lines above the call
            name = dotted_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
            assigned = assignment_before(ctx, value, name) if name else None
            if assigned is None:
                break
            expr = assigned
        built = built_module(ctx, expr) if isinstance(expr, cst.Call) else None
        if built is None and isinstance(expr, cst.Name):
            built = passed_module(ctx, expr, value, depth + 1)
        if built is None or not built.model:
            return None
        found.append(built)
    return BuiltModule(True, all(b.eval_mode for b in found))


_PARAMETER = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
# a class of another file named as a layer, and a deep copy of a name that says it holds one: a module
_MODULE_LIKE_SUFFIXES = ("Block", "Layer")
_CLONE_NAMES = ("module", "layer", "block")


def module_or_parameter(expr: Optional[cst.BaseExpression], ctx: FileContext, follow: bool = True) -> Optional[str]:
    """"module" / "parameter" when ``expr`` builds an ``nn.Module`` / ``nn.Parameter`` (a ``torch.nn`` class, a
    library model builder, a module class of this file, a class named as a block or layer, a deep copy of one), through
    the name it is assigned to; None otherwise, and for ``self.<attr>`` (registered where it is assigned)."""
    if isinstance(expr, (cst.Name, cst.Attribute)) and follow:
        if (dotted_name(expr) or "").startswith("self."):
            return None  # already an attribute of the module: registered there
        origin = ctx.origin(expr)
        return module_or_parameter(origin, ctx, follow=False) if origin is not expr else None
    if not isinstance(expr, cst.Call):
        return None
    called = ctx.call_name(expr)
    if called is not None:
        if called in _PARAMETER:
            return "parameter"
        leaf = called.rsplit(".", 1)[-1]
        if called.startswith("torch.nn.") and leaf[:1].isupper():
            return "module"
        if builds_library_model(called):
            return "module"
        if called == "copy.deepcopy":
            arg = expr.args[0].value if expr.args else None
            name = (dotted_name(arg) or "").rsplit(".", 1)[-1].lower()
            if name in _CLONE_NAMES or name.endswith(("_layer", "_block", "_module")):
                return "module"
            return module_or_parameter(arg, ctx) if arg is not None else None
    local = dotted_name(expr.func)
    if local is None:
        return None
    leaf = local.rsplit(".", 1)[-1]
    if local in ctx.module_classes_in_file:
        return "module"
    if leaf[:1].isupper() and leaf.endswith(_MODULE_LIKE_SUFFIXES):
        return "module"
    return None


# torch.nn classes that hold no parameter and no buffer and compute the same in train() and eval() (activations,
# pooling, padding, reshaping, resampling): a plain list of them loses nothing by not being registered. Not
# PReLU (a weight), Dropout / RReLU (differ in training), the norms (parameters, running statistics), the losses
# (a ``weight`` buffer).
_NN_STATELESS = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Softmax",
    "LogSoftmax", "Softmin", "Softmax2d", "Softplus", "Softsign", "Hardtanh", "Hardswish", "Hardsigmoid",
    "Tanhshrink", "Softshrink", "Hardshrink", "Threshold", "LogSigmoid", "GLU",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "LPPool1d", "LPPool2d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
    "Identity", "Flatten", "Unflatten", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
    "PixelUnshuffle", "ChannelShuffle", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
    "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d",
    "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d",
})


def stateless_module(expr: Optional[cst.BaseExpression], ctx: FileContext, follow: bool = True,
                     _seen: frozenset = frozenset()) -> bool:
    """Does ``expr`` build an ``nn.Module`` that holds nothing to register: no parameter, no buffer, no submodule
    that holds one, and no behaviour that ``train()`` / ``eval()`` switches? A ``torch.nn`` activation, pooling or
    padding layer, or a module class of this file whose ``__init__`` stores only constants, sizes it is given
    (used only in arithmetic) and such stateless layers, and which never reads ``self.training``. False when
    anything is unknown (a parameter, a class of another file, one without its own ``__init__``)."""
    if isinstance(expr, (cst.Name, cst.Attribute)) and follow:
        origin = ctx.origin(expr)
        return origin is not expr and stateless_module(origin, ctx, follow=False, _seen=_seen)
    if not isinstance(expr, cst.Call):
        return False
    called = ctx.call_name(expr) or ""
    if called.startswith("torch.nn."):
        return called.rsplit(".", 1)[-1] in _NN_STATELESS
    local = dotted_name(expr.func)
    if local is None or local not in ctx.module_classes_in_file or local in _seen:
        return False
    cls = next((s for s in ctx.module.body if isinstance(s, cst.ClassDef) and s.name.value == local), None)
    return cls is not None and _holds_nothing(cls, ctx, _seen | {local})


def _holds_nothing(cls: cst.ClassDef, ctx: FileContext, seen: frozenset) -> bool:
    """A module class based on ``nn.Module`` itself whose ``__init__`` only calls ``super().__init__()`` and stores
    constants, numbers it is given (an ``__init__`` parameter that the class only uses as an operand of arithmetic
    or a comparison, never calls or hands on) and stateless modules, and whose code never reads
    ``self.training``."""
    if not cls.bases or any(base != "torch.nn.Module" for base in ctx.class_bases(cls)):
        return False
    init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    if init is None or not isinstance(init.body, cst.IndentedBlock):
        return False
    parameters = {p.name.value for p in init.params.params + init.params.kwonly_params}
    for statement in init.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        for small in statement.body:
            if isinstance(small, cst.Pass) or (isinstance(small, cst.Expr) and (
                    isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
                    or _calls_super_init(small.value))):
                continue
            if isinstance(small, cst.Assign) and all(
                    (dotted_name(t.target) or "").startswith("self.") for t in small.targets) and (
                    _constant(small.value)
                    or (isinstance(small.value, cst.Name) and small.value.value in parameters
                        and all(_only_arithmetic(cls, t.target) for t in small.targets))
                    or stateless_module(small.value, ctx, follow=False, _seen=seen)):
                continue
            return False
    return not m.findall(cls, m.Attribute(value=m.Name("self"), attr=m.Name("training")))


def _only_arithmetic(cls: cst.ClassDef, target: cst.BaseAssignTargetExpression) -> bool:
    """Is every read of the attribute ``target`` (``self.size``) in ``cls`` an operand of arithmetic or of a
    comparison: a number, never a module called or handed on? False when nothing reads it (a module stored and
    never read is still registered)."""
    if not isinstance(target, cst.Attribute) or dotted_name(target.value) != "self":
        return False
    attr = target.attr.value
    operands: set[int] = set()
    for node in m.findall(cls, m.BinaryOperation() | m.UnaryOperation() | m.Comparison()):
        if isinstance(node, cst.BinaryOperation):
            operands.update((id(node.left), id(node.right)))
        elif isinstance(node, cst.UnaryOperation):
            operands.add(id(node.expression))
        else:
            operands.add(id(node.left))
            operands.update(id(c.comparator) for c in node.comparisons)
    reads = [n for n in m.findall(cls, m.Attribute(value=m.Name("self"), attr=m.Name(attr))) if n is not target]
    return bool(reads) and all(id(n) in operands for n in reads)


def _calls_super_init(expr: cst.BaseExpression) -> bool:
    return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "__init__"
            and isinstance(expr.func.value, cst.Call) and dotted_name(expr.func.value.func) == "super")


def _constant(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(expr, cst.Name):
        return expr.value in ("True", "False", "None")
    if isinstance(expr, cst.UnaryOperation):
        return _constant(expr.expression)
    if isinstance(expr, cst.Tuple):
        return all(_constant(e.value) for e in expr.elements)
    return False


def registered_kind(expr: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[str]:
    """What registering ``expr`` in a module keeps: ``module_or_parameter``, with "stateless" for a module that
    holds nothing to register (:func:`stateless_module`: an activation, a pooling layer), whose absence from
    ``.parameters()``, ``state_dict()``, ``.to()`` and ``.eval()`` changes nothing."""
    kind = module_or_parameter(expr, ctx)
    return "stateless" if kind == "module" and stateless_module(expr, ctx) else kind


def module_kinds(exprs, ctx: FileContext) -> set[Optional[str]]:
    """``module_or_parameter`` of each of ``exprs``."""
    return {module_or_parameter(e, ctx) for e in exprs}
