"""What a value is: an optimizer, a scheduler, a grad scaler, a model (and which class built it), a backward
pass or an optimizer step. Each predicate looks at what built the value first and its name last."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, call_receiver, keyword_arg, literal_bool, positional_args, \
    short, string_value
from analyzers.program.flow import ModuleNodes, assignment_before, call_site_values, module_function, parameter, subtree
from analyzers.program.library import (BATCHNORM_BODY_ATTRIBUTES, MODE_FREE_LIBRARY_MODELS, NAN_CONSTANTS, PARAMETER_CLASSES, PARAMETER_ITERATORS, SAME_GRAD_CONVERSIONS, TENSOR_CREATION_OPS, WRAPPER_LAST_NAMES, Does, does, is_library, method_does, method_returns_same_module,
                                       names_an_optimizer_class, wrapped_module_argument, is_data_loader, is_ddp,
                                       library_architecture_with_batchnorm, builds_library_model)
from analyzers.program.builds import built_module
from analyzers.program.modules import MODE_FEATURES, ModuleFacts, torch_layer_features
from analyzers.program.names import (last_name, last_segment, name_is_criterion_like, name_is_loader_like,
                                     name_is_loss_like, name_is_model_like, name_is_optimizer_like,
                                     name_is_recurrent_like, name_is_scaler_like, name_is_scheduler_like)

def _enclosing_function(ctx: FileContext, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            return ancestor
    return None


def constructor(ctx: FileContext, expr: Optional[cst.BaseExpression], use: cst.CSTNode,
                depth: int = 0) -> Optional[cst.Call]:
    """The call that built a model: ``Net(...)`` for ``model`` after ``model = Net().to(device)``, through
    ``.to()``/``.cuda()``/``torch.compile``/DDP wrappers, assignments (also module-level ones read inside a
    function) and parameters whose callers in the file all pass one constructor."""
    if expr is None or depth > 6:
        return None
    if isinstance(expr, cst.Call):
        inner = wrapped_module(expr, ctx)
        if inner is not None:
            return constructor(ctx, inner, use, depth + 1)
        local = dotted_name(expr.func)
        return expr if local is not None and local.rsplit(".", 1)[-1][:1].isupper() else None
    name = dotted_name(expr)
    if name is None:
        return None
    value = assignment_before(ctx, use, name)
    if value is not None:
        return constructor(ctx, value, value, depth + 1)
    fn = _enclosing_function(ctx, use)
    if fn is not None and "." not in name:
        values = call_site_values(ctx, fn, name)
        if values:
            built = [constructor(ctx, v, v, depth + 1) for v in values]
            texts = {ctx.module.code_for_node(b.func) if b is not None else None for b in built}
            if len(texts) == 1 and built[0] is not None:
                return built[0]
    return None


def fresh_model_constructor(expr: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """What ``model`` was built from, when it is surely a fresh model: a torchvision/timm constructor, a module
    class (``Net(...)``, ``nn.Sequential``); None for a helper's result (``build_model(cfg)`` may freeze it)."""
    built = strip_chain(ctx.origin(expr) or expr, ctx)
    for _ in range(3):  # ``model = model.cuda()`` / ``model = model.to(device)``: the model built before
        before = assignment_before(ctx, built, dotted_name(built) or "") if isinstance(
            built, (cst.Name, cst.Attribute)) else None
        if before is None:
            break
        built = strip_chain(before, ctx)
    if not isinstance(built, cst.Call):
        return None
    qualified = ctx.qualified_name(built.func) or ""
    if builds_library_model(qualified):
        return short(ctx, built.func, 40)
    name = dotted_name(built.func)
    if name is None or not name.rsplit(".", 1)[-1][:1].isupper() or names_an_optimizer_class(name):
        return None
    if qualified and not qualified.startswith("torch.nn.") and qualified.split(".", 1)[0] in (
            "transformers", "torch"):
        return None  # a pretrained transformers class may be loaded with frozen parts; torch non-modules
    return name


def model_class(ctx: FileContext, expr: Optional[cst.BaseExpression], use: cst.CSTNode) -> Optional[str]:
    """The repository class a model was constructed from; None when unknown or from a library
    (``torchvision.models.resnet18()``, ``nn.Linear``)."""
    call = constructor(ctx, expr, use)
    if call is None:
        return None
    if is_library(ctx.qualified_name(call.func)):
        return None
    return dotted_name(call.func)


def _local_call_name(call: cst.Call) -> str:
    return dotted_name(call.func) or ""


def _named_or_built(expr: Optional[cst.BaseExpression], ctx: FileContext, named: Callable[[str], bool],
                    built: Callable[[str, str], bool]) -> bool:
    """``expr`` is a name that ``named`` accepts, or a name bound to a call whose (qualified, local) callee
    ``built`` accepts."""
    name = dotted_name(expr)
    if name is None:
        return False
    if named(name):
        return True
    origin = ctx.origin(expr)
    return isinstance(origin, cst.Call) and built(ctx.call_name(origin) or "", _local_call_name(origin))


def is_scheduler(expr: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    """``scheduler``, ``lr_sched`` or a value built by ``torch.optim.lr_scheduler.*`` / a ``*Scheduler(...)``."""
    return _named_or_built(expr, ctx, name_is_scheduler_like, lambda qualified, local: (
        ".lr_scheduler." in qualified or "schedul" in local.lower() or "lr_scheduler" in local))


def makes_iterator(call: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    """``iter(x)`` (the builtin), or a library method documented to return a generator (``model.parameters()``)."""
    if not isinstance(call, cst.Call):
        return False
    if isinstance(call.func, cst.Attribute):
        return method_does(call.func.attr.value, Does.RETURNS_ITERATOR)
    return (isinstance(call.func, cst.Name) and call.func.value == "iter"
            and ctx.binding("iter") is None and "iter" not in ctx.imports.names and len(call.args) == 1)


def calls_recurrent_module(func: cst.BaseExpression, ctx: FileContext) -> bool:
    """A call of the model, or of a callee named like a recurrent layer (``self.lstm``, ``rnn_cell``): what may
    return a hidden state."""
    return is_model_call(func, ctx) or name_is_recurrent_like(dotted_name(func))


def seeds_private_generator(call: cst.Call, ctx: FileContext) -> bool:
    """``g.manual_seed(0)`` where ``g`` is (or ``torch.Generator()`` itself is) a generator of its own, not the
    global one."""
    receiver = call_receiver(call)
    if receiver is None:
        return False
    made = receiver if isinstance(receiver, cst.Call) else ctx.origin(receiver)
    return isinstance(made, cst.Call) and (ctx.call_name(made) or "").endswith("Generator")


def is_loader(expr: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    """A value built by a ``DataLoader``, or named like a loader (``train_loader``, ``dl``)."""
    return _named_or_built(expr, ctx, name_is_loader_like, lambda qualified, local: is_data_loader(qualified))


def is_optimizer(expr: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    """A value built by ``torch.optim.*`` (not a scheduler), or named like an optimizer (``opt``, ``optimizerD``),
    directly or through the name it was assigned from."""
    name = dotted_name(expr)
    if name is None or is_scheduler(expr, ctx):
        return False
    origin = ctx.origin(expr)
    if isinstance(origin, cst.Call):
        qualified = ctx.call_name(origin) or ""
        if qualified.startswith("torch.optim.") and ".lr_scheduler" not in qualified:
            return True
    if name_is_optimizer_like(name):
        return True
    if isinstance(origin, (cst.Name, cst.Attribute)):
        return name_is_optimizer_like(dotted_name(origin))
    return False


def builds_optimizer(call: cst.Call, ctx: FileContext) -> bool:
    """``torch.optim.Adam(...)``, ``optim.SGD(...)``, or a call of a known optimizer class however imported."""
    qualified = ctx.qualified_name(call.func) or ""
    if qualified.startswith("torch.optim.") and ".lr_scheduler" not in qualified:
        return True
    return names_an_optimizer_class(dotted_name(call.func))


class _OptimizedNames:
    def __init__(self, ctx: FileContext) -> None:
        self.names = _optimized_names(ctx)


def _optimized_names(ctx: FileContext) -> Optional[frozenset]:
    mentioned: set[str] = set()
    built = [call for call in ctx.facts(ModuleNodes).of_type(cst.Call) if builds_optimizer(call, ctx)]
    for call in built:
        names = set()
        for arg in call.args:
            values = [arg.value]
            if isinstance(arg.value, cst.Name) and not name_is_model_like(arg.value.value):
                # ``Adam(params)`` after ``params = model.parameters()``: one assignment up
                values.append(assignment_before(ctx, call, arg.value.value))
            names |= {dotted_name(node) for value in values if value is not None for node in subtree(value)
                      if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node)}
        if not any(name_is_model_like(name) for name in names):
            return None  # an optimizer given nothing named like a model: what it trains is unknown
        mentioned |= names
    return frozenset(mentioned) if built else None


def optimized_names(ctx: FileContext) -> Optional[frozenset]:
    """Every name the optimizers built in this file are given (``model.parameters``, ``model``, and what a plain
    ``params`` name was assigned from, one assignment up): a module none of them mention is not trained here (a
    frozen base cast to half, a teacher). None when nothing here builds an optimizer, or one is given nothing
    named like a model."""
    return ctx.facts(_OptimizedNames).names


def is_scaler(expr: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    """``scaler`` / ``grad_scaler`` or a value built by a ``GradScaler(...)``."""
    return _named_or_built(expr, ctx, name_is_scaler_like,
                           lambda qualified, local: (qualified or local).endswith("GradScaler"))


# The backward pass: ``loss.backward()``, ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
# Lightning's ``self.manual_backward(loss)``.
BACKWARD_METHODS = frozenset({"backward", "manual_backward"})


def is_backward(call: cst.Call, ctx: Optional[FileContext] = None) -> bool:
    """``<x>.backward(...)`` / ``<x>.manual_backward(...)`` (a method call: a bare ``backward()`` is not)."""
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value in BACKWARD_METHODS


def is_plain_backward(call: cst.Call) -> bool:
    """``<x>.backward(...)``: autograd's own backward, not a framework's ``manual_backward`` (which scales and
    synchronizes gradients itself)."""
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value == "backward"


def is_optimizer_step(call: cst.Call, ctx: FileContext) -> bool:
    """``opt.step()`` or ``scaler.step(opt)`` (what :func:`optimizer_step` reads)."""
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value == "step" and optimizer_step(call, ctx) is not None


# A callee named ``<verb>_model`` runs or builds a model and returns metrics, a model or a path: not its outputs.
_HELPER_VERBS = {"evaluate", "eval", "validate", "val", "test", "train", "fit", "build", "create", "make", "get",
                 "load", "init", "initialize", "save", "setup", "prepare", "export", "print", "summarize", "count"}


def called_object(func: cst.BaseExpression) -> cst.BaseExpression:
    """The object whose call runs: ``loss`` for ``loss.forward(fx, y)`` (an explicit ``forward`` is the call
    itself, hooks aside), ``func`` for any other callee."""
    if isinstance(func, cst.Attribute) and func.attr.value == "forward":
        return func.value
    return func


def is_model_call(func: cst.BaseExpression, ctx: FileContext) -> bool:
    """``func(...)`` is a forward pass: ``model(x)``, ``self.net(x)``, ``nn.Linear(...)(x)`` through a name, or an
    instance of a module class of this file."""
    name = dotted_name(func)
    if name is None:
        return False
    last = last_segment(name).lower()
    if isinstance(func, cst.Name) and "_" in last and last.split("_", 1)[0] in _HELPER_VERBS and (
            ctx.binding(func.value) is None or ctx.binding(func.value).kind in ("def", "import")):
        # ``evaluate_model(...)``, ``train_model(...)``: a function that takes a model, not a forward pass
        # (``eval_model = copy.deepcopy(model)`` stays a model)
        return False
    if name_is_model_like(name):
        return True
    origin = ctx.origin(func)
    if isinstance(origin, cst.Call):
        qualified = ctx.call_name(origin) or ""
        cls = last_segment(qualified)
        if qualified.startswith("torch.nn.") and cls[:1].isupper() and not cls.endswith("Loss"):
            return True
        local = _local_call_name(origin)
        if local and local in ctx.module_classes_in_file:
            return True
    return False


def names_a_class(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """``expr`` holds a class, not an instance: ``Model = MODELS[name]`` picked out of a dict, list or tuple
    literal whose items are all classes (defined in this file, or imported CapWords names). Calling it builds a
    model; it runs none."""
    origin = _value_of(ctx, expr)
    if not isinstance(origin, cst.Subscript):
        return False
    container = _value_of(ctx, origin.value)
    if not isinstance(container, (cst.Dict, cst.List, cst.Tuple)):
        # a registry we cannot see (``Detector = detector_factory[task]``): the CapWords name the pick is given
        # is PEP 8's spelling of a class, and an instance would not be picked out of a container of classes
        name = expr.value if isinstance(expr, cst.Name) else ""
        return name[:1].isupper() and any(c.islower() for c in name)
    if isinstance(container, cst.Dict):
        items = [element.value for element in container.elements if isinstance(element, cst.DictElement)]
    elif isinstance(container, (cst.List, cst.Tuple)):
        items = [element.value for element in container.elements if isinstance(element, cst.Element)]
    else:
        return False
    return bool(items) and all(_is_class(ctx, item) for item in items)


def _value_of(ctx: FileContext, expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """What produced ``expr``: during the walk the binding in scope, after it the last assignment before it."""
    origin = ctx.origin(expr)
    if isinstance(origin, cst.Name):
        return assignment_before(ctx, expr, origin.value) or origin
    return origin


def _is_class(ctx: FileContext, item: cst.BaseExpression) -> bool:
    """A capitalised name imported or defined by ``class`` at this file's top level: PEP 8's spelling of a class
    (``GCN`` and ``VGG`` too; the item is called, so it is no constant)."""
    name = dotted_name(item)
    if name is None:
        return False
    last = last_segment(name)
    if not last[:1].isupper():
        return False
    head = name.split(".", 1)[0]
    return head in ctx.imports.names or any(isinstance(stmt, cst.ClassDef) and stmt.name.value == name
                                            for stmt in ctx.module.body)


def alias_names(ctx: FileContext, expr: cst.BaseExpression, depth: int = 4) -> list[str]:
    """The names a value passed through by plain assignment before ``expr`` held it: ``["model"]`` for
    ``runner`` after ``runner = model`` (whatever ``model`` was built from). A mode set on any of them
    (``model.eval()`` before the aliasing) is the value's mode."""
    names: list[str] = []
    current: Optional[cst.BaseExpression] = expr
    for _ in range(depth):
        value = ctx.assigned_value(current) if isinstance(current, (cst.Name, cst.Attribute)) else None
        if not isinstance(value, (cst.Name, cst.Attribute)):
            break
        name = dotted_name(value)
        if name is None or name in names:
            break
        names.append(name)
        current = value
    return names


def hands_a_model(ctx: FileContext, call: cst.Call) -> bool:
    """``call`` is given a model as an argument (``accelerator.unwrap_model(unet)``, ``self._wrap_model(self.model)``,
    ``generate_from_model(self.model, batch)``): a helper that acts on the model, not the model's forward pass,
    whatever the callee is called. A forward pass takes data."""
    for arg in call.args:
        value = arg.value
        if not isinstance(value, (cst.Name, cst.Attribute)):
            continue
        name = dotted_name(value)
        if name is not None and name != "self" and (name_is_model_like(name) or _holds_built_model(ctx, value)):
            return True
    return False


def _holds_built_model(ctx: FileContext, value: cst.BaseExpression) -> bool:
    built = built_module(ctx, ctx.origin(value))
    return built is not None and built.model


def wrapped_module(expr: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[cst.BaseExpression]:
    """The module expression a call returns unchanged or wrapped: ``net`` for ``net.to(device)``,
    ``nn.DataParallel(net)``, ``torch.compile(net)``; None when ``expr`` is no such call."""
    if not isinstance(expr, cst.Call):
        return None
    func = expr.func
    if isinstance(func, cst.Attribute) and method_returns_same_module(func.attr.value) and \
            ctx.qualified_name(func) is None:
        return func.value
    if last_name(func) not in WRAPPER_LAST_NAMES and not (
            isinstance(func, cst.Name) and func.value in ctx.imports.names):
        return None  # most calls: no need to resolve the callee (``DDP`` imported under another name still is)
    wrapped = wrapped_module_argument(ctx.qualified_name(func))
    return argument(expr, *wrapped) if wrapped is not None else None


# ---- what eval() changes ----------------------------------------------------------------------------------

def changes_in_eval(ctx: FileContext, model: cst.BaseExpression, use: cst.CSTNode, depth: int = 0) -> bool:
    """Is the model mode-dependent: yes or unknown (True), or no (False: it is known to hold no dropout, no batch
    norm with running statistics and no code of its own reading ``self.training``, so eval() changes nothing)?
    A parameter of the function is answered by the values every call of the function in this file passes."""
    built = constructor(ctx, model, use)
    if built is None:
        return _assigned_features(ctx, dotted_name(model), use, depth)
    features = torch_layer_features(ctx, built)
    if features is None and ctx.qualified_name(built.func) in MODE_FREE_LIBRARY_MODELS:
        return False
    if features is None:
        cls = model_class(ctx, model, use)
        features = ctx.facts(ModuleFacts).features(cls) if cls is not None else None
    return features is None or bool(features & MODE_FEATURES)


def _assigned_features(ctx: FileContext, name: Optional[str], use: Optional[cst.CSTNode] = None,
                       depth: int = 0) -> bool:
    """Fallback through ``model = model.cuda()`` chains: True unless every class ``name`` is built from, in the
    function that binds the name where it is used (or the file), is known to be mode-free."""
    if not name:
        return True
    scope: cst.CSTNode = ctx.module
    for fn in (a for a in (ctx.ancestors(use) if use is not None else ()) if isinstance(a, cst.FunctionDef)):
        if any(p.name.value == name for p in fn.params.params + fn.params.kwonly_params + fn.params.posonly_params):
            # the caller's model: mode-free only when every call in this file passes a mode-free one
            passed = call_site_values(ctx, fn, name) if depth < 3 and name not in ("self", "cls") else None
            return not passed or any(changes_in_eval(ctx, value, value, depth + 1) for value in passed)
        if any(isinstance(n, cst.Assign) and _assigned_value(n, name) is not None for n in subtree(fn.body)):
            scope = fn
            break
    facts = ctx.facts(ModuleFacts)
    seen = False
    assignments = (ctx.facts(ModuleNodes).of_type(cst.Assign) if scope is ctx.module
                   else (n for n in subtree(scope) if isinstance(n, cst.Assign)))
    for node in assignments:
        value = _assigned_value(node, name)
        if value is None:
            continue
        if isinstance(value, cst.Lambda):
            seen = True  # ``net = lambda X: X @ w + b``: a function, not a module; it has no mode to switch
            continue
        # ``model = model.cuda()`` and ``model = CNN().cuda()``: the module the chain starts from
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
                isinstance(value.func.value, (cst.Name, cst.Attribute, cst.Call)) and \
                method_returns_same_module(value.func.attr.value):
            value = value.func.value
        if isinstance(value, (cst.Name, cst.Attribute)) and dotted_name(value) == name:
            continue  # ``model = model.cuda()``
        if isinstance(value, cst.Name) and depth < 3:
            passed = _parameter_values(ctx, node, value.value)
            if passed is not None:
                # ``self.model = model`` in ``__init__(self, model)``: what every call of it in this file passes
                if any(changes_in_eval(ctx, v, v, depth + 1) for v in passed):
                    return True
                seen = True
                continue
        if not isinstance(value, cst.Call):
            return True
        if _reloads_itself(ctx, value, name):
            continue  # ``model = torch.load('net.pkl')`` of the file ``torch.save(model, 'net.pkl')`` writes
        # ``net = nn.Sequential(nn.Linear(...))`` is read from torch's own layers, ``net = Net()`` from the class
        features = torch_layer_features(ctx, value) if isinstance(value.func, cst.Attribute) else \
            facts.features(value.func.value) if isinstance(value.func, cst.Name) else None
        if features is None and isinstance(value.func, cst.Name):
            features = facts.built_features(value.func.value)  # ``net = build_net(...)`` of a factory function
        if features is None or features & MODE_FEATURES:
            return True
        seen = True
    if not seen and "." in name and depth < 3:
        # ``model.encoder`` that nothing assigns, where ``model`` is built as an ``nn.Module``: a submodule or a
        # method of it, which holds no layer, no code and no train/eval switch that ``model`` does not hold
        # itself; mode-free when ``model`` is. The attribute of any other object is not known.
        owner = cst.parse_expression(name.rsplit(".", 1)[0])
        at = use if use is not None else ctx.module
        built = constructor(ctx, owner, at)
        if built is None or not (torch_layer_features(ctx, built) is not None
                                 or ctx.qualified_name(built.func) in MODE_FREE_LIBRARY_MODELS
                                 or ctx.facts(ModuleFacts).is_module_class(dotted_name(built.func) or "")):
            return True
        return changes_in_eval(ctx, owner, at, depth + 1)
    return not seen


def _assigned_value(node: cst.Assign, name: str) -> Optional[cst.BaseExpression]:
    """What ``node`` assigns to ``name``: the whole value, or its element in a tuple assignment of as many values
    (``net, loss = lambda X: ..., squared_loss``); None when it does not assign ``name``."""
    for target in node.targets:
        if dotted_name(target.target) == name:
            return node.value
        if isinstance(target.target, (cst.Tuple, cst.List)) and isinstance(node.value, (cst.Tuple, cst.List)) and \
                len(target.target.elements) == len(node.value.elements):
            for element, value in zip(target.target.elements, node.value.elements):
                if dotted_name(element.value) == name:
                    return None if isinstance(element, cst.StarredElement) or \
                        isinstance(value, cst.StarredElement) else value.value
    return None


def _parameter_values(ctx: FileContext, assignment: cst.Assign, name: str) -> Optional[list[cst.BaseExpression]]:
    """The values the calls of this file pass for ``name`` when it is a parameter of the function that holds
    ``assignment`` (for ``__init__``, the calls of the class); None when it is not one, or a call is not known."""
    parents = ctx.facts(ModuleNodes).parents
    fn = parents.get(id(assignment))
    while fn is not None and not isinstance(fn, cst.FunctionDef):
        fn = parents.get(id(fn))
    params = [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params] if fn is not None else []
    if name in ("self", "cls") or not any(p.name.value == name for p in params):
        return None
    return call_site_values(ctx, fn, name)


def _reloads_itself(ctx: FileContext, value: cst.Call, name: str) -> bool:
    """``name = torch.load(path)`` where every save to that path in this file saves ``name`` itself: the value
    comes back as it was saved (the same model), so it adds nothing to what the other assignments say."""
    from analyzers.program.roles import CheckpointWrites

    if not does(ctx.call_name(value), Does.READS_TORCH_CHECKPOINT):
        return False
    return ctx.facts(CheckpointWrites).saved_objects(value) == {name}


_MAXIMA = {"max", "amax"}
_SAME_VALUES = {"data", "detach", "values", "clone"}


def _values_root(expr: cst.BaseExpression) -> Optional[str]:
    """``x`` for ``x``, ``x.data``, ``x.detach()``, ``self.x``: the value a read of the same numbers starts at."""
    while True:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SAME_VALUES:
            expr = expr.func.value
        elif isinstance(expr, cst.Attribute) and expr.attr.value in _SAME_VALUES:
            expr = expr.value
        else:
            return dotted_name(expr)


def is_maximum_of(value: Optional[cst.BaseExpression], of: cst.BaseExpression, ctx: FileContext) -> bool:
    """``value`` is the maximum of ``of``'s values (``x.max()``, ``x.data.max(1, keepdim=True)[0]``,
    ``torch.amax(x, dim)``), directly or through the name it was assigned to: ``exp(x - value)`` cannot overflow."""
    target = _values_root(of)
    if target is None or value is None:
        return False
    expr = ctx.origin(value) if isinstance(value, (cst.Name, cst.Attribute)) else value
    while isinstance(expr, cst.Subscript) or isinstance(expr, cst.Attribute) and expr.attr.value == "values":
        expr = expr.value
    if not isinstance(expr, cst.Call) or not isinstance(expr.func, cst.Attribute) or \
            expr.func.attr.value not in _MAXIMA:
        return False
    if (ctx.qualified_name(expr.func) or "").startswith("torch."):
        return bool(expr.args) and _values_root(expr.args[0].value) == target
    return _values_root(expr.func.value) == target


def is_ddp_call(call: cst.Call, ctx: FileContext) -> bool:
    """A call that wraps a model in DistributedDataParallel (the table's, or an unresolved ``DDP(...)``)."""
    qualified = ctx.call_name(call)
    if is_ddp(qualified):
        return True
    return qualified is None and (dotted_name(call.func) or "") in ("DDP", "DistributedDataParallel")


DDP_HINT = re.compile(r"DistributedDataParallel|DDP")  # the source text is_ddp_call needs: a rule's source_hint


def is_loop_variable(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    name = dotted_name(expr)
    binding = ctx.binding(name) if name else None
    return binding is not None and binding.kind == "for"


def optimizer_keys(expr: cst.BaseExpression, ctx: FileContext) -> frozenset:
    """Names an optimizer may be referred to by: its own last segment and its alias's origin."""
    name = dotted_name(expr)
    keys = {last_segment(name)} if name else set()
    origin = ctx.origin(expr)
    if origin is not expr and isinstance(origin, (cst.Name, cst.Attribute)):
        keys.add(last_segment(dotted_name(origin)))
    return frozenset(k for k in keys if k)


@dataclass
class Step:
    node: cst.Call
    optimizer: cst.BaseExpression
    display: str
    keys: frozenset
    vague: bool  # a loop variable / subscript: cannot tell which optimizer
    has_args: bool  # ``opt.step(closure)``
    via_scaler: bool


def optimizer_step(call: cst.Call, ctx: FileContext) -> Optional[Step]:
    """``opt.step()`` or ``scaler.step(opt)`` (callers check the method name is "step" first)."""
    receiver = call_receiver(call)
    if receiver is None:
        return None
    if is_scaler(receiver, ctx):
        args = positional_args(call)
        target = args[0].value if args else argument(call, 0, "optimizer")
        if target is None:
            return None
        name = dotted_name(target)
        return Step(call, target, name or "optimizer", optimizer_keys(target, ctx) if name else frozenset(),
                     name is None or is_loop_variable(target, ctx), False, True)
    if not is_optimizer(receiver, ctx):
        return None
    name = dotted_name(receiver) or "optimizer"
    return Step(call, receiver, name, optimizer_keys(receiver, ctx), is_loop_variable(receiver, ctx), bool(call.args), False)


def strip_chain(expr: cst.BaseExpression, ctx: FileContext) -> cst.BaseExpression:
    """``resnet50(...).to(device)`` / ``nn.DataParallel(net)``: the module under the moves and wrappers."""
    for _ in range(6):
        inner = wrapped_module(expr, ctx)
        if inner is None:
            break
        chained = isinstance(expr.func, cst.Attribute) and method_returns_same_module(expr.func.attr.value)
        # through a wrapper (DDP, compile), the name it wraps is followed to what built it
        expr = ctx.origin(inner) or inner if not chained and isinstance(inner, (cst.Name, cst.Attribute)) else inner
    return expr


def batchnorm_evidence(expr: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """What shows that the module ``expr`` holds BatchNorm layers, as a phrase for a message (``"a resnet50, which
    holds BatchNorm"``, ``"`layer4` of `Net`, which builds BatchNorm"``), or None when the program does not show it:
    the library builder it comes from (library.library_architecture_with_batchnorm), the torch layer it is, or the
    repository class that builds it, followed through moves and wrappers, and one attribute deep
    (``model.backbone``)."""
    built = strip_chain(ctx.origin(expr) or expr, ctx)
    if isinstance(built, cst.Call):
        return _built_with_batchnorm(built, ctx)
    path = dotted_name(expr)
    if path is None or "." not in path:
        return None
    root, _, part = path.rpartition(".")
    owner = strip_chain(ctx.origin(cst.parse_expression(root)) or expr, ctx)
    if not isinstance(owner, cst.Call):
        return None
    architecture = _library_architecture(owner, ctx)
    if architecture is not None:
        return f"`{part}` of {_with_article(architecture)}, which holds BatchNorm" \
            if part in BATCHNORM_BODY_ATTRIBUTES else None
    cls = dotted_name(owner.func)
    if cls is None or not cls.rsplit(".", 1)[-1][:1].isupper():
        return None
    facts = ctx.facts(ModuleFacts)
    summary = facts.find_class(cls)
    layer = summary.layers.get(part) if summary is not None else None
    if layer is None:
        return None
    if "batchnorm" in layer.kinds or any("batchnorm" in (facts.features(kind) or ()) for kind in layer.classes):
        return f"`{part}` of `{cls}`, which builds BatchNorm"
    return None


def _library_architecture(call: cst.Call, ctx: FileContext) -> Optional[str]:
    return library_architecture_with_batchnorm(ctx.qualified_name(call.func),
                                               string_value(argument(call, 0, "model_name")))


def _with_article(architecture: str) -> str:
    return f"{'an' if architecture[:1].lower() in 'aeiou' else 'a'} {architecture}"  # an efficientnet_b0, a resnet50


def _built_with_batchnorm(call: cst.Call, ctx: FileContext) -> Optional[str]:
    architecture = _library_architecture(call, ctx)
    if architecture is not None:
        return f"{_with_article(architecture)}, which holds BatchNorm"
    features = torch_layer_features(ctx, call)
    if features is not None:
        return "its BatchNorm layers" if "batchnorm" in features else None
    cls = dotted_name(call.func)
    if cls is None or not cls.rsplit(".", 1)[-1][:1].isupper() or ctx.qualified_name(call.func) is not None:
        return None
    features = ctx.facts(ModuleFacts).features(cls)
    return f"`{cls}`, which builds BatchNorm" if features and "batchnorm" in features else None


# builtins that hand back (one of) the tensors they are given, or an iterator over them
TENSOR_PASSING_BUILTINS = {"sum", "max", "min", "abs", "zip", "enumerate", "list", "tuple", "reversed", "sorted",
                           "iter", "next", "pow", "divmod"}


def returns_tensor_of_args(call: cst.Call, ctx: FileContext) -> bool:
    """Whether ``call`` is known to compute its result from its tensor arguments as tensors: a torch function
    (``torch.exp``, ``F.relu``, ``Variable``), a torch object built earlier (``criterion = nn.MSELoss()``), a
    forward pass (``model(x)``, ``self.fc(x)``), or a builtin that passes its arguments through (``sum``,
    ``zip``). Any other call (``replay_buffer.sample(batch_size)``, a helper of unknown code) may as well return
    NumPy arrays or numbers: unknown, not a tensor."""
    func = called_object(call.func)
    if isinstance(func, cst.Name) and func.value in TENSOR_PASSING_BUILTINS and ctx.binding(func.value) is None:
        return True
    if (ctx.qualified_name(func) or "").startswith("torch") or (ctx.origin_call_name(func) or "").startswith("torch"):
        return True
    if (dotted_name(func) or "").startswith("self."):
        return True  # the module's own layers and methods
    return is_model_call(func, ctx)


# methods only a torch tensor has (NumPy arrays, lists and numbers have none of them): calling one shows the
# receiver is a tensor
TENSOR_ONLY_METHODS = {"cpu", "cuda", "detach", "numpy", "unsqueeze", "permute", "contiguous", "dim", "masked_fill",
                       "expand", "half", "float", "requires_grad_", "backward", "softmax", "log_softmax"}


def leaf_requiring_grad(call: cst.Call, ctx: FileContext) -> Optional[str]:
    """What kind of leaf tensor that requires grad ``call`` makes (``nn.Parameter(w)``, ``x.requires_grad_()``,
    ``torch.zeros(3, requires_grad=True)``), in words; None when it makes none, or the program cannot tell."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "requires_grad_":
        flag = argument(call, 0, "requires_grad")
        return "a leaf tensor that requires grad" if flag is None or literal_bool(flag) is True else None
    called = ctx.call_name(call)
    if called in PARAMETER_CLASSES:
        flag = argument(call, 1, "requires_grad")
        return None if flag is not None and literal_bool(flag) is False else "an nn.Parameter"
    if called in TENSOR_CREATION_OPS:
        flag = keyword_arg(call, "requires_grad")
        if flag is not None and literal_bool(flag.value) is True:
            return "a leaf tensor created with requires_grad=True"
    return None


def tracks_gradients_by_default(expr: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[bool]:
    """Does the tensor ``expr`` names record autograd operations before anyone sets its ``requires_grad``?

    True for an ``nn.Parameter`` (built in the file, or yielded by ``.parameters()``), False for a tensor a
    creation op made without ``requires_grad=True`` (the library table's ``TENSOR_CREATION_OPS``); None when the
    program cannot tell (a parameter of the function, an attribute, a value from elsewhere). Asked during the
    walk: a name's value is the binding that reaches the point being visited.
    """
    for _ in range(4):
        if not isinstance(expr, cst.Name):
            break
        binding = ctx.binding(expr.value)
        if binding is None or binding.value is None:
            return None
        if binding.kind == "for":
            iterable = binding.value
            if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute) and \
                    iterable.func.attr.value in PARAMETER_ITERATORS and isinstance(binding.node.target, cst.Name):
                return True
            return None
        if binding.kind not in ("assign", "annassign") or binding.previous is not None:
            return None  # rebound: which value reaches here depends on the path
        expr = binding.value
    converted = False
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in SAME_GRAD_CONVERSIONS:
        expr, converted = expr.func.value, True  # ``torch.zeros(n, d).float()``: the created tensor's flag
    if not isinstance(expr, cst.Call):
        return None
    qualified = ctx.call_name(expr)
    if qualified in PARAMETER_CLASSES and not converted:
        flag = argument(expr, 1, "requires_grad")
        return True if flag is None else literal_bool(flag)
    if qualified in TENSOR_CREATION_OPS:
        flag = keyword_arg(expr, "requires_grad")
        return False if flag is None else literal_bool(flag.value)
    return None


def called_functions(ctx: FileContext, call: cst.Call) -> tuple[str, ...]:
    """The qualified names of the functions ``call`` may run: its own, or, for a local name bound to a choice
    between functions (``read = load_safetensors if safe else torch.load``), each branch's that is known."""
    name = ctx.call_name(call)
    if name is not None:
        return (name,)
    if isinstance(call.func, cst.Name):
        binding = ctx.binding(call.func.value)
        if binding is not None and binding.kind == "assign" and isinstance(binding.value, cst.IfExp):
            choice = binding.value
            return tuple(found for found in (ctx.qualified_name(branch) for branch in (choice.body, choice.orelse))
                         if found)
    return ()


def unpacked_keyword(ctx: FileContext, call: cst.Call, keyword: str) -> Optional[cst.BaseExpression]:
    """The value ``call`` passes for ``keyword`` through ``**options``, where ``options`` is bound to a dict literal
    or ``dict(...)`` (or a choice between such), the first one that holds the key; None when none does or it is
    not known."""
    for arg in call.args:
        if arg.star != "**" or not isinstance(arg.value, cst.Name):
            continue
        binding = ctx.binding(arg.value.value)
        value = binding.value if binding is not None and binding.kind == "assign" else None
        for option in (value.body, value.orelse) if isinstance(value, cst.IfExp) else (value,):
            if isinstance(option, cst.Dict):
                for element in option.elements:
                    if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString) and \
                            element.key.evaluated_value == keyword:
                        return element.value
            elif isinstance(option, cst.Call) and dotted_name(option.func) == "dict":
                found = keyword_arg(option, keyword)
                if found is not None:
                    return found.value
    return None


def forwards_callers_keywords(ctx: FileContext, call: cst.Call) -> bool:
    """Does ``call`` hand on the keywords its own function was called with (``def load(f, **kwargs): return
    torch.load(f, **kwargs)``)? Then any keyword the call does not spell itself may come from those callers: which
    ones is their choice, not something this call decides. A ``**`` parameter the function rebinds first is its
    own dict, not its callers' keywords."""
    nodes = ctx.facts(ModuleNodes)
    fn = nodes.parents.get(id(call))
    while fn is not None and not isinstance(fn, (cst.FunctionDef, cst.Lambda)):
        fn = nodes.parents.get(id(fn))
    star = fn.params.star_kwarg if fn is not None else None
    if not isinstance(star, cst.Param):
        return False
    name = star.name.value
    if not any(arg.star == "**" and isinstance(arg.value, cst.Name) and arg.value.value == name for arg in call.args):
        return False
    rebound = (target for node in subtree(fn) if isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign))
               for target in [node.target] if isinstance(target, cst.Name))
    return all(target.value != name for target in rebound)


def nan_constant_source(expr: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """``torch`` / ``numpy`` / ``math`` / ``float`` when ``expr`` is a NaN constant (``float("nan")``, ``np.nan``),
    else None."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "float" and \
            len(expr.args) == 1 and ctx.binding("float") is None:
        text = string_value(expr.args[0].value)
        if text is not None and text.strip().lower() in ("nan", "+nan", "-nan"):
            return "float"
        return None
    if isinstance(expr, (cst.Attribute, cst.Name)):
        return NAN_CONSTANTS.get(ctx.qualified_name(expr) or "")
    return None


def tensor_operation_operand(expr: cst.BaseExpression, ctx: FileContext, operation: str) -> Optional[cst.BaseExpression]:
    """``x`` of torch's ``operation`` applied to it: ``torch.exp(x)`` or a tensor's own ``x.exp()`` (a method no
    import resolves); None for anything else, ``math.exp(x)`` and ``np.exp(x)`` included."""
    if not isinstance(expr, cst.Call) or not isinstance(expr.func, (cst.Attribute, cst.Name)):
        return None
    qualified = ctx.qualified_name(expr.func)
    if qualified == f"torch.{operation}":
        return expr.args[0].value if expr.args and not expr.args[0].star else None
    if qualified is None and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == operation \
            and not expr.args:
        return expr.func.value
    return None


_COMPARISON_OPERATORS = (cst.Equal, cst.NotEqual, cst.LessThan, cst.GreaterThan, cst.LessThanEqual,
                         cst.GreaterThanEqual)
_COMPARISON_METHODS = {"eq", "ne", "lt", "gt", "le", "ge"}
# methods that keep a count a count: moving it, reshaping it, casting it to another integer type
_COUNT_KEEPING = {"cpu", "cuda", "squeeze", "view", "reshape", "detach", "long", "int", "to"}


def _compares(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Comparison):
        return all(isinstance(target.operator, _COMPARISON_OPERATORS) for target in expr.comparisons)
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
        expr.func.attr.value in _COMPARISON_METHODS


def counts_matches(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """An integer tensor counting matches: ``(pred == y).sum()``, ``torch.sum(a == b)``, ``pred.eq(y).sum()``,
    moved or reshaped after (``.cpu()``, ``.view(-1)``...); not one summed with a floating ``dtype=``."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in _COUNT_KEEPING and not expr.args:
        expr = expr.func.value
    while isinstance(expr, cst.Attribute) and expr.attr.value == "data":
        expr = expr.value
    if not isinstance(expr, cst.Call) or keyword_arg(expr, "dtype") is not None:
        return False
    if ctx.qualified_name(expr.func) in ("torch.sum", "torch.count_nonzero"):
        return bool(expr.args) and _compares(expr.args[0].value)
    return isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("sum", "count_nonzero") and \
        ctx.qualified_name(expr.func) is None and _compares(expr.func.value)


# reductions whose tensor method, called without arguments, returns a 0-dim tensor
_FULL_REDUCTIONS = {"sum", "mean", "max", "min", "prod", "norm", "std", "var", "item"}


def zero_dim_origin(expr: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """Why ``expr`` is a 0-dim tensor: it is a loss (named as one, or what a loss function returns), or a full
    reduction such as ``x.sum()``, or the result of a function of this file that returns one (called by its name,
    or through a parameter every caller fills with such a function: ``f(True)`` in ``def search(f)`` called as
    ``search(closure)``); None when nothing says so."""
    name = dotted_name(expr)
    if name is not None and name_is_loss_like(name):
        return "a loss"
    value = ctx.origin(expr) if name is not None else expr
    return _zero_dim_value(value, ctx, 0) if isinstance(value, cst.Call) else None


def _zero_dim_value(value: Optional[cst.BaseExpression], ctx: FileContext, depth: int) -> Optional[str]:
    """:func:`zero_dim_origin` for a value read anywhere in the file (a ``return`` of another function): names are
    followed through their assignment before the read, not through the walk's scopes."""
    if isinstance(value, cst.Name) and depth:
        if name_is_loss_like(value.value):
            return "a loss"
        value = assignment_before(ctx, value, value.value)
    if not isinstance(value, cst.Call):
        return None
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value in _FULL_REDUCTIONS and not value.args and \
            ctx.qualified_name(func) is None:
        return f"a full reduction (`.{func.attr.value}()`)"
    if name_is_criterion_like(dotted_name(called_object(func))):
        return "a loss"
    if depth >= 2:
        return None
    functions = functions_called(value, ctx)
    if not functions:
        return None
    from analyzers.program.graphs import FunctionShapes  # graphs reads values: imported where it is needed
    shapes = ctx.facts(FunctionShapes)
    reasons = set()
    for fn in functions:
        returns = shapes.own_returns(fn)
        found = {_zero_dim_value(node.value, ctx, depth + 1) for node in returns}
        if not returns or None in found:
            return None
        reasons |= found
    named = ", ".join(f"`{fn.name.value}`" for fn in functions)
    return f"what {named} {'returns' if len(functions) == 1 else 'return'}: {sorted(reasons)[0]}"


def functions_called(call: cst.Call, ctx: FileContext) -> list[cst.FunctionDef]:
    """The functions of this file a call by a bare name runs: the one that name is bound to, or, for a parameter of
    the function around the call, the functions every call of that function passes for it (a closure handed to a
    search helper). Empty when any of them is not known."""
    if not isinstance(call.func, cst.Name):
        return []
    name = call.func.value
    owner = _function_around(call, ctx)
    if owner is not None and parameter(owner, name) is not None:
        values = call_site_values(ctx, owner, name)
        if not values:
            return []
        found = [_function_named(value, ctx) for value in values]
        return found if all(found) else []
    fn = _function_named(call.func, ctx)
    return [fn] if fn is not None else []


def _function_around(node: cst.CSTNode, ctx: FileContext) -> Optional[cst.FunctionDef]:
    """The innermost function around ``node`` by the whole file's parents (the node may lie past the walk)."""
    parents = ctx.facts(ModuleNodes).parents
    current = parents.get(id(node))
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = parents.get(id(current))
    return current


def _function_named(expr: cst.BaseExpression, ctx: FileContext) -> Optional[cst.FunctionDef]:
    """The function a bare name read at ``expr`` is bound to by a ``def`` of this file: one of the enclosing
    functions' own (a closure), else one at module level."""
    if not isinstance(expr, cst.Name):
        return None
    scope = _function_around(expr, ctx)
    while scope is not None:
        if parameter(scope, expr.value) is not None:
            return None
        local = next((node for node in scope.body.body
                      if isinstance(node, cst.FunctionDef) and node.name.value == expr.value), None)
        if local is not None:
            return local
        scope = _function_around(scope, ctx)
    return module_function(ctx, expr.value)
