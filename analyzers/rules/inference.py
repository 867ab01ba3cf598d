"""Inference: models run for validation / prediction in training mode or with autograd on."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import NO_GRAD_CONTEXTS, FileContext, argument, dotted_name, is_false, is_true, method_name
from analyzers.program.flow import subtree
from analyzers.program.library import Does, does, method_does, method_returns_same_module
from analyzers.program.modules import ModuleFacts
from analyzers.program.names import name_is_model_like
from analyzers.program.roles import is_test_code
from analyzers.program.values import changes_in_eval
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule, Valid

# ---------------------------------------------------------------------------------------------
# Names

# torch.nn classes without dropout / batch-norm / parameters worth the name "model"
_NN_NOT_MODELS = {"Softmax", "LogSoftmax", "Sigmoid", "ReLU", "ReLU6", "LeakyReLU", "Tanh", "GELU", "SiLU", "ELU",
                  "Identity", "Flatten", "Unflatten", "Upsample", "Softplus", "Hardtanh", "Mish", "CosineSimilarity",
                  "PairwiseDistance", "Parameter", "ParameterList", "ParameterDict", "ModuleList", "ModuleDict"}

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[._\W]+")
_EVAL_FN_TOKENS = {"val", "valid", "eval", "test", "testing", "inference"}
_EVAL_FN_PREFIXES = ("validat", "evaluat", "predict", "infer")
_VAL_DATA_TOKENS = {"val", "valid", "validation", "eval", "evaluation", "test", "testing", "dev", "holdout"}
_VAL_DATA_JOINED = re.compile(r"^(?:val|valid|test|eval|dev)(?:loader|loaders|dl|set|data|dataset|ds|iter|batches)$")


def _tokens(name: str) -> list[str]:
    return [t for t in _SPLIT.split(_CAMEL.sub("_", name).lower()) if t]


def is_eval_function_name(name: str) -> bool:
    """validate / evaluate / eval_epoch / predict / run_inference / test ... (not pytest ``test_x``)."""
    if name.startswith("test_") or name.startswith("Test"):
        return False
    for token in _tokens(name):
        if token in _EVAL_FN_TOKENS or token.startswith(_EVAL_FN_PREFIXES):
            return True
    return False


def _is_val_data_name(name: str) -> bool:
    return any(t in _VAL_DATA_TOKENS or _VAL_DATA_JOINED.match(t) for t in _tokens(name))


def _val_iter_name(iter_expr: cst.BaseExpression) -> Optional[str]:
    """The validation-data name a ``for`` iterates (``val_loader``, ``loaders['test']``...), or None."""
    if isinstance(iter_expr, cst.Call) and method_name(iter_expr) in ("range", "len"):
        return None
    stack: list[cst.CSTNode] = [iter_expr]
    budget = 40
    while stack and budget:
        budget -= 1
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)):
            dotted = dotted_name(node)
            if dotted is not None:
                if _is_val_data_name(dotted):
                    return dotted
                continue
            stack.append(node.value)
        elif isinstance(node, cst.Subscript):
            for element in node.slice:
                index = getattr(element.slice, "value", None)
                if isinstance(index, cst.SimpleString) and _is_val_data_name(index.value.strip("'\"")):
                    base = dotted_name(node.value) or "..."
                    return f"{base}[{index.value}]"
            stack.append(node.value)
        elif isinstance(node, cst.Call):
            stack.append(node.func)
            stack.extend(a.value for a in node.args)
    return None


# ---------------------------------------------------------------------------------------------
# Facts collected during the walk, shared by TR201 and TR202


class _FnState:
    __slots__ = ("node", "name", "eval_named", "skip", "evals", "nograd_dec", "grad_off", "has_backward",
                 "needs_grad", "val_loops", "cls", "returns_eval", "leaves_eval")

    def __init__(self, node: Optional[cst.FunctionDef], name: str, cls: Optional[cst.ClassDef]) -> None:
        self.node = node
        self.name = name
        self.eval_named = False
        self.skip = False
        self.evals: dict[str, bool] = {}  # receiver -> in eval mode (True) / set back to train (False)
        self.nograd_dec = False
        self.grad_off = False  # torch.set_grad_enabled(False) as a statement
        self.has_backward = False
        self.needs_grad = False  # enable_grad / autograd.grad / requires_grad_ : gradients wanted
        self.val_loops: list[_ValLoop] = []
        self.cls = cls
        self.returns_eval = False  # ``return model.eval()`` / eval() before a return: a loader of eval models
        self.leaves_eval = False  # still has something in eval mode when it ends


class _ValLoop:
    __slots__ = ("node", "name", "has_backward")

    def __init__(self, node: cst.CSTNode, name: str) -> None:
        self.node = node
        self.name = name
        self.has_backward = False


class _ModelCall:
    __slots__ = ("node", "model", "aliases", "stack", "loop", "eval_local", "nograd_local", "cls", "is_global",
                 "eval_chain", "origin_func")

    def __init__(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class _CallSite:
    __slots__ = ("name", "caller", "evaled", "nograd")

    def __init__(self, name: str, caller: _FnState, evaled: bool, nograd: bool) -> None:
        self.name = name
        self.caller = caller
        self.evaled = evaled
        self.nograd = nograd


def _covers(evaled: str, model: str) -> bool:
    return (evaled == "*" or evaled == model or model.startswith(evaled + ".") or evaled.startswith(model + "."))


class _Facts:
    def __init__(self, ctx: FileContext) -> None:
        self.collector: Optional[Rule] = None
        self.module_state = _FnState(None, "<module>", None)
        self.stack: list[_FnState] = [self.module_state]
        self.nograd_withs: list[cst.With] = []
        self.model_calls: list[_ModelCall] = []
        self.sites: dict[str, list[_CallSite]] = {}
        self.functions: dict[str, list[_FnState]] = {}
        self.class_evals: dict[cst.ClassDef, set[str]] = {}
        self.module_evals: set[str] = set()
        self.trained: set[str] = set()  # receivers of an explicit .train() anywhere in the file
        self.skipped_classes: dict[cst.ClassDef, bool] = {}
        self.test_file = is_test_code(ctx)
        self._memo: dict[tuple, bool] = {}

    # ---- structure -----------------------------------------------------------------------
    def enter_function(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        cls = ctx.class_def
        direct_cls = cls if cls is not None and ctx.parent(ctx.parent(node) or node) is cls else None
        state = _FnState(node, node.name.value, direct_cls)
        name = node.name.value
        state.eval_named = is_eval_function_name(name)
        decorators = ctx.decorators_of(node)
        state.skip = name.startswith("test_") or any("fixture" in d or "pytest" in d for d in decorators)
        if direct_cls is not None and self._framework_class(direct_cls, ctx):
            state.skip = True
        state.nograd_dec = any(d in NO_GRAD_CONTEXTS for d in decorators)
        self.stack.append(state)
        self.functions.setdefault(name, []).append(state)

    def leave_function(self) -> None:
        state = self.stack.pop()
        state.leaves_eval = any(state.evals.values())

    def on_return(self, node: cst.Return) -> None:
        state = self.stack[-1]
        if state.node is None or node.value is None:
            return
        if any(state.evals.values()) or _eval_chain(node.value):
            state.returns_eval = True

    def _framework_class(self, cls: cst.ClassDef, ctx: FileContext) -> bool:
        """Lightning modules and HF Trainers put the model in eval mode themselves."""
        known = self.skipped_classes.get(cls)
        if known is None:
            known = False
            for base in ctx.class_bases(cls):
                leaf = base.rsplit(".", 1)[-1]
                if leaf.endswith("LightningModule") or leaf in ("Trainer", "Seq2SeqTrainer"):
                    known = True
            self.skipped_classes[cls] = known
        return known

    def enter_with(self, node: cst.With, ctx: FileContext) -> None:
        for item in node.items:
            call = item.item if isinstance(item.item, cst.Call) else None
            expr = call.func if call is not None else item.item
            name = ctx.qualified_name(expr)
            if name in NO_GRAD_CONTEXTS:
                if name == "torch.set_grad_enabled" and call is not None and is_true(argument(call, 0, "mode")):
                    continue
                self.nograd_withs.append(node)
                return
            if name in ("torch.enable_grad", "torch.autograd.enable_grad") or (
                    name == "torch.set_grad_enabled" and call is not None and is_true(argument(call, 0, "mode"))):
                self.stack[-1].needs_grad = True

    def leave_with(self, node: cst.With) -> None:
        if self.nograd_withs and self.nograd_withs[-1] is node:
            self.nograd_withs.pop()

    def enter_loop(self, node: cst.CSTNode, iter_expr: cst.BaseExpression) -> None:
        name = _val_iter_name(iter_expr)
        if name is not None:
            self.stack[-1].val_loops.append(_ValLoop(node, name))

    def leave_loop(self, node: cst.CSTNode) -> None:
        loops = self.stack[-1].val_loops
        if loops and loops[-1].node is node:
            loops.pop()

    # ---- state at the current point ---------------------------------------------------------
    def nograd_now(self) -> bool:
        if self.nograd_withs:
            return True
        return any(s.nograd_dec or s.grad_off for s in self.stack)

    def evaled_any(self) -> bool:
        return any(v for s in self.stack for v in s.evals.values())

    def _record_eval(self, receiver: str, value: bool, ctx: FileContext, call: cst.Call) -> None:
        state = self.stack[-1]
        if value:
            state.evals[receiver] = True
            if state is self.module_state:
                self.module_evals.add(receiver)
            if (receiver == "self" or receiver.startswith("self.")) and ctx.class_def is not None:
                self.class_evals.setdefault(ctx.class_def, set()).add(receiver)
            return
        self.trained.add(receiver)
        # model.train(): only an unconditional one undoes an earlier eval()
        for ancestor in ctx.ancestors(call):
            if isinstance(ancestor, (cst.If, cst.Else, cst.Try, cst.ExceptHandler, cst.Match, cst.IfExp)):
                return
            if ancestor is state.node or isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                break
        for key in list(state.evals):
            if key == receiver or (receiver == "self" and key.startswith("self.")):
                state.evals[key] = False

    # ---- calls ---------------------------------------------------------------------------------
    def on_call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        state = self.stack[-1]
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            if attr == "eval" and not node.args:
                receiver = dotted_name(func.value)
                if receiver is not None:
                    self._record_eval(receiver, True, ctx, node)
                return
            if attr == "train":
                receiver = dotted_name(func.value)
                if receiver is not None:
                    mode = argument(node, 0, "mode")
                    if is_false(mode):
                        self._record_eval(receiver, True, ctx, node)
                    elif mode is None or is_true(mode):
                        self._record_eval(receiver, False, ctx, node)
                return
            if attr == "backward":
                self._mark_backward(state)
                return
            if attr in ("requires_grad_", "enable_grad", "grad", "set_grad_enabled"):
                self._grad_call(node, attr, ctx, state)
                return
        elif isinstance(func, cst.Name):
            if func.value in ("enable_grad", "grad", "set_grad_enabled"):
                self._grad_call(node, func.value, ctx, state)
                return
        else:
            return
        callee = func.attr.value if isinstance(func, cst.Attribute) else func.value
        low = callee.lower()
        if "eval" in low and not low.startswith("evaluat") and ("mode" in low or low.startswith(("set_", "to_", "_set"))
                                                                or low.endswith("_eval")):
            # set_eval_mode(model) / self.set_eval() helpers
            targets = [dotted_name(a.value) for a in node.args if isinstance(a.value, (cst.Name, cst.Attribute))]
            if isinstance(func, cst.Attribute):
                targets.append(dotted_name(func.value))
            targets = [t for t in targets if t]
            for target in targets or ["*"]:
                self._record_eval(target, True, ctx, node)
            return
        self.sites.setdefault(callee, []).append(_CallSite(callee, state, self.evaled_any(), self.nograd_now()))
        defined = self.functions.get(callee)
        if defined and any(s.leaves_eval for s in defined if s.node is not None and s not in self.stack):
            # a helper defined above that leaves its argument in eval mode (evaluate(model) without train())
            targets = [dotted_name(a.value) for a in node.args if isinstance(a.value, (cst.Name, cst.Attribute))]
            for target in [t for t in targets if t] or ["*"]:
                self._record_eval(target, True, ctx, node)
        if node.args:
            self._maybe_model_call(node, ctx)

    def _mark_backward(self, state: _FnState) -> None:
        state.has_backward = True
        for loop in state.val_loops:
            loop.has_backward = True

    def _grad_call(self, node: cst.Call, attr: str, ctx: FileContext, state: _FnState) -> None:
        if attr == "requires_grad_":
            if not node.args or is_true(argument(node, 0, "requires_grad")):
                state.needs_grad = True
            return
        qualified = ctx.call_name(node) or ""
        if attr == "grad" and qualified in ("torch.autograd.grad",):
            self._mark_backward(state)
        elif attr == "enable_grad" and qualified.startswith("torch."):
            state.needs_grad = True
        elif attr == "set_grad_enabled" and qualified in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled"):
            mode = argument(node, 0, "mode")
            parent = ctx.parent(node)
            if is_false(mode) and isinstance(parent, cst.Expr):
                state.grad_off = True
            elif is_true(mode):
                state.needs_grad = True

    def _in_path(self) -> bool:
        if self.stack[-1].val_loops:
            return True
        return any(s.eval_named for s in self.stack)

    def _maybe_model_call(self, node: cst.Call, ctx: FileContext) -> None:
        if not self._in_path() or self.test_file:
            return
        if any(s.skip for s in self.stack):
            return
        func = node.func
        target = func.value if isinstance(func, cst.Attribute) and func.attr.value == "forward" else func
        if not isinstance(target, (cst.Name, cst.Attribute)):
            return
        model = dotted_name(target)
        if model is None or model == "self" or model.startswith("super"):
            return
        head = model.split(".", 1)[0]
        if ctx.imports.names.get(head) is not None:
            return  # an imported function/module, not a model instance
        if isinstance(target, cst.Name):
            binding = ctx.binding(model)
            if binding is not None and binding.kind in ("def", "import"):
                return
        name_like = name_is_model_like(model)
        origin = ctx.origin(target)
        constructed, eval_chain = _constructs_module(origin, ctx)
        if not (name_like or constructed):
            return
        if isinstance(origin, (cst.Lambda,)):
            return
        if _shape_check(node, target, ctx):
            return
        cls = next((s.cls for s in reversed(self.stack) if s.node is not None), None)
        if head == "self" and cls is not None and (ctx.is_module_subclass(cls) or any(
                ctx.facts(ModuleFacts).is_module_class(base) for base in
                (dotted_name(b.value) for b in cls.bases) if base)):
            # a module's own predict()/inference() helper: the caller decides the mode, unless it loops over data
            if not self.stack[-1].val_loops and not _loops_over_loader(ctx):
                return
        aliases = {model}
        origin_name = dotted_name(origin) if isinstance(origin, (cst.Name, cst.Attribute)) else None
        if origin_name:
            aliases.add(origin_name)
        eval_local = any(v and _covers(k, a) for s in self.stack for k, v in s.evals.items() for a in aliases)
        self.model_calls.append(_ModelCall(
            node=node, model=model, aliases=aliases, stack=tuple(self.stack),
            loop=self.stack[-1].val_loops[-1] if self.stack[-1].val_loops else None,
            eval_local=eval_local, nograd_local=self.nograd_now(), cls=cls,
            is_global=head != "self" and not _bound_locally(head, ctx), eval_chain=eval_chain,
            origin_func=_origin_func(origin),
        ))

    # ---- decisions -------------------------------------------------------------------------
    def path_of(self, call: _ModelCall) -> Optional[str]:
        """Where the call runs, for the message; None when it is not a validation path after all."""
        if call.loop is not None and not call.loop.has_backward:
            return f"the loop over `{call.loop.name}`"
        for state in reversed(call.stack):
            if state.eval_named and not state.has_backward:
                return f"`{state.name}()`"
        return None

    def covered_by_callers(self, state: _FnState, kind: str, visiting: Optional[set] = None) -> bool:
        if state.node is None:
            return False
        key = (id(state), kind)
        if key in self._memo:
            return self._memo[key]
        visiting = visiting or set()
        if id(state) in visiting:
            return False
        visiting.add(id(state))
        result = False
        for site in self.sites.get(state.name, ()):
            if site.caller is state:
                continue
            if (site.evaled if kind == "eval" else site.nograd) or self.covered_by_callers(site.caller, kind, visiting):
                result = True
                break
        self._memo[key] = result
        return result

    def eval_covered(self, call: _ModelCall) -> bool:
        if call.eval_local:
            return True
        # built in eval mode (``Net().eval()``, ``from_pretrained``, ``load_model()`` returning ``model.eval()``)
        # and never put back into training mode in this file
        built_eval = call.eval_chain or (call.origin_func and any(
            s.returns_eval for s in self.functions.get(call.origin_func, ())))
        if built_eval and not any(_covers(t, a) and t != "self" for t in self.trained for a in call.aliases):
            return True
        if call.cls is not None and any(_covers(k, a) for k in self.class_evals.get(call.cls, ()) for a in call.aliases):
            return True
        if call.is_global and any(_covers(k, a) for k in self.module_evals for a in call.aliases):
            return True
        return any(self.covered_by_callers(s, "eval") for s in call.stack)

    def nograd_covered(self, call: _ModelCall) -> bool:
        if call.nograd_local or self.module_state.grad_off:
            return True
        if any(s.needs_grad for s in call.stack if s.node is not None) or call.stack[-1].needs_grad:
            return True
        return any(self.covered_by_callers(s, "nograd") for s in call.stack)


_SYNTHETIC = {"torch.randn", "torch.rand", "torch.randint", "torch.zeros", "torch.ones", "torch.empty", "torch.full"}


def _shape_check(call: cst.Call, target: cst.BaseExpression, ctx: FileContext) -> bool:
    """``def test(): net = ResNet18(); y = net(torch.randn(1, 3, 32, 32)); print(y.size())``: a model built
    in this very function, no weights loaded, run once (no loop) on a random or constant tensor. That checks
    shapes; there are no results whose mode could matter, nor a graph worth freeing."""
    fn = ctx.function_def
    if fn is None or not isinstance(target, cst.Name) or ctx.loops_in_function() or not call.args:
        return False
    binding = ctx.scopes[-1].bindings.get(target.value) if ctx.scopes else None
    if binding is None or binding.kind != "assign" or not isinstance(binding.value, cst.Call):
        return False
    for node in subtree(fn.body):
        if isinstance(node, cst.Call) and "load" in (method_name(node) or "").lower():
            return False  # weights come in: this may be a real evaluation
    value = call.args[0].value
    if isinstance(value, cst.Name):
        bound = ctx.scopes[-1].bindings.get(value.value)
        value = bound.value if bound is not None and bound.kind == "assign" else None
    return isinstance(value, cst.Call) and ctx.call_name(value) in _SYNTHETIC


def _bound_locally(head: str, ctx: FileContext) -> bool:
    for scope in ctx.scopes[1:]:
        if isinstance(scope.node, cst.ClassDef):
            continue
        if head in scope.bindings:
            return True
    return False


def _eval_chain(expr: Optional[cst.BaseExpression]) -> bool:
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        attr = expr.func.attr.value
        if attr == "eval" or (attr == "train" and is_false(argument(expr, 0, "mode"))):
            return True
        if not method_returns_same_module(attr):
            return False
        expr = expr.func.value
    return False


def _origin_func(origin: Optional[cst.BaseExpression]) -> Optional[str]:
    """``load_model`` for ``model = load_model(path).to(device)``."""
    expr = origin
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            method_returns_same_module(expr.func.attr.value):
        expr = expr.func.value
    return method_name(expr) if isinstance(expr, cst.Call) else None


def _loops_over_loader(ctx: FileContext) -> bool:
    for loop in ctx.loops_in_function():
        iter_expr = loop.iter if isinstance(loop, cst.For) else getattr(getattr(loop, "for_in", None), "iter", None)
        if iter_expr is None or isinstance(loop, cst.While):
            continue
        stack = [iter_expr]
        budget = 20
        while stack and budget:
            budget -= 1
            node = stack.pop()
            dotted = dotted_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if dotted is not None:
                if "loader" in dotted.lower() or "dataset" in dotted.lower():
                    return True
            elif isinstance(node, cst.Call):
                stack.extend(a.value for a in node.args)
    return False


def _constructs_module(origin: Optional[cst.BaseExpression], ctx: FileContext) -> tuple[bool, bool]:
    """(origin builds an nn.Module, the chain puts it in eval mode / loads a pretrained HF model)."""
    eval_chain = False
    expr = origin
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            method_returns_same_module(expr.func.attr.value):
        attr = expr.func.attr.value
        if attr == "eval" or (attr == "train" and is_false(argument(expr, 0, "mode"))):
            eval_chain = True
        expr = expr.func.value
    if not isinstance(expr, cst.Call):
        return False, eval_chain
    if isinstance(expr.func, cst.Attribute) and method_does(expr.func.attr.value, Does.RETURNS_EVAL_MODEL):
        return True, True
    called = ctx.call_name(expr)
    if does(called, Does.RETURNS_EVAL_MODEL):
        return True, True
    if called:
        leaf = called.rsplit(".", 1)[-1]
        if called.startswith("torch.nn.") and leaf[:1].isupper():
            return (not leaf.endswith("Loss") and leaf not in _NN_NOT_MODELS), eval_chain
        if called.startswith(("torchvision.models.", "timm.create_model")):
            return True, eval_chain
    local = dotted_name(expr.func)
    if local and local in ctx.module_classes_in_file:
        return True, eval_chain
    return False, eval_chain


class _InferencePathRule(Rule):
    """Shares one set of facts between TR201 and TR202 (collected by whichever runs first)."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        facts = ctx.facts(_Facts)
        if facts.collector is None:
            facts.collector = self  # the first of TR201 / TR202 to run feeds the facts during the walk
        self._owner = facts.collector is self
        self.facts: _Facts = facts

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_function(node, ctx)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_function()

    def visit_With(self, node: cst.With, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_with(node, ctx)

    def leave_With(self, node: cst.With, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_with(node)

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_loop(node, node.iter)

    def leave_For(self, node: cst.For, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_loop(node)

    def visit_ListComp(self, node: cst.ListComp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_loop(node, node.for_in.iter)

    def leave_ListComp(self, node: cst.ListComp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_loop(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.enter_loop(node, node.for_in.iter)

    def leave_GeneratorExp(self, node: cst.GeneratorExp, ctx: FileContext) -> None:
        if self._owner:
            self.facts.leave_loop(node)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if self._owner:
            self.facts.on_call(node, ctx)

    def visit_Return(self, node: cst.Return, ctx: FileContext) -> None:
        if self._owner:
            self.facts.on_return(node)

    def end_file(self, ctx: FileContext) -> None:
        seen: set[tuple] = set()
        for call in self.facts.model_calls:
            where = self.facts.path_of(call)
            if where is None:
                continue
            key = (id(call.stack[-1]), call.model)
            if key in seen:
                continue
            message = self.check(call, where)
            if message:
                seen.add(key)
                self.report(call.node, message)

    def check(self, call: _ModelCall, where: str) -> Optional[str]:  # pragma: no cover - overridden
        raise NotImplementedError


class MissingEvalMode(_InferencePathRule):
    id = "TR201"
    slug = "missing-eval-mode"
    category = Category.INFERENCE
    severity = Severity.HIGH
    summary = "model run for validation/inference without model.eval()"
    what = """
        Flags a model that is called in a validation, evaluation, test or prediction path (a
        function named like `validate`, `evaluate`, `predict`, `infer`, `test`, or a loop over a
        `val`/`test`/`eval`/`dev` loader) when no `model.eval()` (or `model.train(False)`) comes
        before it in that function, in its class, or before the call sites in this file. Lightning
        `LightningModule` hooks are skipped: Lightning switches modes itself. A model whose class
        (found in this repository) has no dropout and no BatchNorm is skipped: eval() changes
        nothing there.
    """
    why = """
        In training mode dropout keeps dropping activations and batch-norm normalizes with the
        statistics of the current batch (and keeps updating its running averages with validation
        data). Metrics become noisy and too pessimistic, predictions depend on the batch they come
        in, and the running statistics are silently corrupted by evaluation data.
    """
    example = """
        def validate(model, loader):
            with torch.no_grad():
                for x, y in loader:
                    loss = criterion(model(x), y)
    """
    fix_example = """
        def validate(model, loader):
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    loss = criterion(model(x), y)
            model.train()
    """
    VALID = [
        # a single nn.Linear built in the file: nothing behaves differently in eval mode
        "import torch\nimport torch.nn as nn\nmodel = nn.Linear(784, 10)\n"
        "def test():\n    with torch.no_grad():\n        for x, y in test_loader:\n            out = model(x)\n",
        # nothing in the model behaves differently in eval mode (no dropout, no BatchNorm)
        "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
        "    def forward(self, x):\n        return self.fc(x)\nnet = Net().to(device)\n"
        "with torch.no_grad():\n    for x, y in val_loader:\n        pred = net(x)\n",
        # eval() first
        "import torch\ndef validate(model, loader):\n    model.eval()\n    with torch.no_grad():\n"
        "        for x, y in loader:\n            out = model(x)\n",
        # train(False)
        "import torch\ndef evaluate(model, loader):\n    model.train(False)\n    with torch.no_grad():\n"
        "        for x in loader:\n            model(x)\n",
        # eval() inside the no_grad block
        "import torch\ndef predict(model, x):\n    with torch.no_grad():\n        model.eval()\n        return model(x)\n",
        # eval done by the caller in this file
        "import torch\ndef evaluate(model, loader):\n    with torch.no_grad():\n        return [model(x) for x in loader]\n"
        "def main(model, loader):\n    model.eval()\n    evaluate(model, loader)\n",
        # Lightning sets eval mode for validation_step / test_step / predict_step
        "import torch\nimport lightning as L\nclass Lit(L.LightningModule):\n    def validation_step(self, batch, i):\n"
        "        x, y = batch\n        return self.model(x)\n    def test_step(self, batch, i):\n        return self.model(batch[0])\n"
        "    def predict_step(self, batch, i):\n        return self.model(batch)\n",
        # pytest tests that only run a model
        "import torch\ndef test_forward_shape():\n    model = torch.nn.Linear(2, 3)\n    assert model(torch.zeros(1, 2)).shape == (1, 3)\n",
        # self.eval() of an enclosing module covers self.model
        "import torch\nimport torch.nn as nn\nclass Wrapper(nn.Module):\n    def evaluate(self, loader):\n        self.eval()\n"
        "        with torch.no_grad():\n            for x in loader:\n                self.model(x)\n",
        # eval() in __init__ of a predictor class
        "import torch\nclass Predictor:\n    def __init__(self, path):\n        self.model = torch.jit.load(path)\n"
        "        self.model.eval()\n    @torch.no_grad()\n    def predict(self, x):\n        return self.model(x)\n",
        # eval'd in the chain
        "import torch\nimport torch.nn as nn\nnet = nn.Sequential(nn.Linear(2, 2), nn.Dropout()).eval()\n"
        "def infer(x):\n    with torch.no_grad():\n        return net(x)\n",
        # training loop over the training data is not an evaluation path
        "import torch\ndef train(model, train_loader, opt):\n    model.train()\n    for x, y in train_loader:\n"
        "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n",
        Valid("import torch\nfrom transformers import AutoModel\nmodel = AutoModel.from_pretrained('bert-base-uncased')\n"
              "def predict(batch):\n    with torch.no_grad():\n        return model(**batch)\n"),
    ]
    INVALID = [
        Invalid("import torch\ndef validate(model, loader):\n    with torch.no_grad():\n        for x, y in loader:\n"
                "            out = model(x)\n", line=5, message="`model`"),
        Invalid("import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n"
                "        super().__init__()\n        self.drop = nn.Dropout(0.5)\n    def forward(self, x):\n"
                "        return self.drop(x)\n"
                "net = Net()\nwith torch.no_grad():\n    for x, y in val_loader:\n        pred = net(x)\n",
                line=12, message="val_loader"),
        Invalid("import torch\nclass Trainer:\n    def evaluate(self):\n        with torch.no_grad():\n"
                "            for batch in self.val_loader:\n                logits = self.model(batch)\n",
                line=6, message="`self.model`"),
        # eval before, then train() again, then a validation loop
        Invalid("import torch\ndef fit(model, train_loader, val_loader, opt):\n    model.eval()\n"
                "    for epoch in range(3):\n        model.train()\n        for x, y in train_loader:\n"
                "            model(x).sum().backward()\n            opt.step()\n        with torch.no_grad():\n"
                "            for x, y in val_loader:\n                model(x)\n", line=11),
        Invalid("import torch as th\ndef predict(encoder, x):\n    with th.inference_mode():\n        return encoder.forward(x)\n",
                line=4, message="encoder"),
    ]

    def check(self, call: _ModelCall, where: str) -> Optional[str]:
        if self.facts.eval_covered(call):
            return None
        if _DOTTED.match(call.model) and not changes_in_eval(self.ctx, cst.parse_expression(call.model), call.node):
            return None  # no dropout and no BatchNorm anywhere in the model: eval() would change nothing
        return (f"`{call.model}` runs in {where} without `{call.model}.eval()` before it: dropout stays active and "
                f"batch-norm normalizes with (and updates its running statistics from) the evaluation batches; "
                f"call `{call.model}.eval()` first")


_DOTTED = re.compile(r"^[A-Za-z_][\w.]*$")


class MissingNoGrad(_InferencePathRule):
    id = "TR202"
    slug = "missing-no-grad"
    category = Category.INFERENCE
    severity = Severity.MEDIUM
    summary = "model run for validation/inference with autograd recording"
    what = """
        Flags a model that is called in a validation, evaluation, test or prediction path (see
        TR201) outside `torch.no_grad()` / `torch.inference_mode()` (as a context manager or a
        decorator) or `torch.set_grad_enabled(False)`, when the same function does not compute
        gradients itself (`.backward()`, `torch.autograd.grad`, `torch.enable_grad()`). A caller in
        this file that enters no-grad around the call counts.
    """
    why = """
        With autograd on, every forward pass records the graph and keeps all intermediate
        activations alive for a backward pass that never comes: evaluation uses several times
        more memory (often the cause of out-of-memory errors during validation) and runs slower.
    """
    example = """
        def evaluate(model, loader):
            model.eval()
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum()
    """
    fix_example = """
        @torch.no_grad()
        def evaluate(model, loader):
            model.eval()
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum()
    """
    VALID = [
        "import torch\n@torch.no_grad()\ndef evaluate(model, loader):\n    model.eval()\n    for x in loader:\n        model(x)\n",
        "import torch\n@torch.inference_mode()\ndef predict(model, x):\n    model.eval()\n    return model(x)\n",
        "import torch\ndef validate(model, loader):\n    model.eval()\n    torch.set_grad_enabled(False)\n"
        "    for x in loader:\n        model(x)\n",
        # no_grad entered by the caller in this file
        "import torch\ndef evaluate(model, loader):\n    model.eval()\n    return [model(x) for x in loader]\n"
        "def main(model, loader):\n    with torch.no_grad():\n        evaluate(model, loader)\n",
        # decorator on the enclosing method
        "import torch\nclass Runner:\n    @torch.no_grad()\n    def validate(self):\n        self.model.eval()\n"
        "        def step(x):\n            return self.model(x)\n        return [step(x) for x in self.val_loader]\n",
        # gradients wanted on purpose (saliency maps, test-time adaptation)
        "import torch\ndef predict_saliency(model, x):\n    model.eval()\n    x.requires_grad_()\n"
        "    model(x).max().backward()\n    return x.grad\n",
        "import torch\ndef infer_with_grad(model, x):\n    model.eval()\n    with torch.enable_grad():\n        return model(x)\n",
        Valid("import torch\nimport pytorch_lightning as pl\nclass Lit(pl.LightningModule):\n    def test_step(self, batch, i):\n"
              "        return self.net(batch)\n"),
    ]
    INVALID = [
        Invalid("import torch\ndef evaluate(model, loader):\n    model.eval()\n    for x, y in loader:\n"
                "        correct = (model(x).argmax(1) == y).sum()\n", line=5, message="`model`"),
        Invalid("import torch\nmodel = torch.nn.Linear(3, 1)\nmodel.eval()\nfor x in test_loader:\n    y = model(x)\n",
                line=5, message="test_loader"),
        Invalid("import torch\nclass Engine:\n    def predict(self, x):\n        self.model.eval()\n"
                "        return self.model(x).softmax(-1)\n", line=5, message="self.model"),
        # enable_grad elsewhere in the file does not count; the call site here is not under no_grad
        Invalid("import torch\ndef evaluate(net, loader):\n    net.eval()\n    return [net(x) for x in loader]\n"
                "def main(net, loader):\n    print(evaluate(net, loader))\n", line=4),
    ]

    def check(self, call: _ModelCall, where: str) -> Optional[str]:
        if self.facts.nograd_covered(call):
            return None
        return (f"`{call.model}` runs in {where} with autograd recording: wrap it in `torch.no_grad()` or "
                f"`torch.inference_mode()` (or decorate the function) so activations are not kept for a backward "
                f"pass that never comes")
