"""Model calls on evaluation paths (a loop over validation data, an ``evaluate()``-like function) and the modes they
run in: whether the model was put in eval mode and whether gradients are off there, along this function, the
functions that call it and how the model was built. Fed during the walk by the inference rules (any one of them),
once per file (``ctx.facts(EvaluationPaths)``)."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import NO_GRAD_CONTEXTS, FileContext, argument, dotted_name, is_false, is_true, method_name
from analyzers.program.builds import BuiltModule, built_module, passed_module
from analyzers.program.flow import ModuleNodes, assignment_before, attribute_values, subtree
from analyzers.program.graphs import output_taken_off_graph
from analyzers.program.library import method_returns_same_module
from analyzers.program.modules import ModuleFacts
from analyzers.program.names import (name_is_model_like, name_says_not_a_model, names_evaluation_data,
                                     names_evaluation_function, names_prediction_method, node_text)
from analyzers.program.roles import collects_tests, is_test_code, main_block
from analyzers.program.state import enters_grad_off
from analyzers.program.values import alias_names, hands_a_model, names_a_class


def val_iter_name(iter_expr: cst.BaseExpression) -> Optional[str]:
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
                if names_evaluation_data(dotted):
                    return dotted
                continue
            stack.append(node.value)
        elif isinstance(node, cst.Subscript):
            for element in node.slice:
                index = getattr(element.slice, "value", None)
                if isinstance(index, cst.SimpleString) and names_evaluation_data(index.value.strip("'\"")):
                    base = dotted_name(node.value) or "..."
                    return f"{base}[{index.value}]"
            stack.append(node.value)
        elif isinstance(node, cst.Call):
            stack.append(node.func)
            stack.extend(a.value for a in node.args)
    return None


class FnState:
    __slots__ = ("node", "name", "eval_named", "skip", "evals", "nograd_dec", "grad_off", "has_backward",
                 "needs_grad", "val_loops", "cls", "returns_eval", "leaves_eval", "returns_eval_at")

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
        self.val_loops: list[ValLoop] = []
        self.cls = cls
        self.returns_eval = False  # ``return model.eval()`` / eval() before a return: a loader of eval models
        self.leaves_eval = False  # still has something in eval mode when it ends
        self.returns_eval_at: set[int] = set()  # ``return text_model, tokenizer``: the tuple items in eval mode


class ValLoop:
    __slots__ = ("node", "name", "has_backward")

    def __init__(self, node: cst.CSTNode, name: str) -> None:
        self.node = node
        self.name = name
        self.has_backward = False


class ModelCall:
    __slots__ = ("node", "model", "aliases", "stack", "loop", "eval_local", "nograd_local", "cls", "is_global",
                 "eval_chain", "origin_func", "after_eval", "unpacked_from", "passed", "data_loop")

    def __init__(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class CallSite:
    __slots__ = ("name", "caller", "evaled", "nograd", "functions")

    def __init__(self, name: str, caller: FnState, evaled: bool, nograd: bool,
                 functions: tuple = ()) -> None:
        self.name = name
        self.caller = caller
        self.evaled = evaled
        self.nograd = nograd
        # per positional argument: "def" (a plain function), the caller's parameter it passes on, or None
        self.functions = functions


def covers(evaled: str, model: str) -> bool:
    return (evaled == "*" or evaled == model or model.startswith(evaled + ".") or evaled.startswith(model + "."))


class EvaluationPaths:
    """The model calls on evaluation paths of one file, and what each function does to train/eval and grad mode."""

    def __init__(self, ctx: FileContext) -> None:
        self.collector: Optional[object] = None  # the rule that feeds these facts during the walk
        self.module_state = FnState(None, "<module>", None)
        self.stack: list[FnState] = [self.module_state]
        self.nograd_withs: list[cst.With] = []
        self.model_calls: list[ModelCall] = []
        self.sites: dict[str, list[CallSite]] = {}
        self.functions: dict[str, list[FnState]] = {}
        self.class_evals: dict[cst.ClassDef, set[str]] = {}
        self.module_evals: set[str] = set()
        self.trained: set[str] = set()  # receivers of an explicit .train() anywhere in the file
        self.trained_in: dict[str, list[FnState]] = {}  # the functions that call it
        self.skipped_classes: dict[cst.ClassDef, bool] = {}
        self.test_file = is_test_code(ctx)
        self._memo: dict[tuple, bool] = {}
        self.ctx = ctx
        self._passed: dict[int, Optional[BuiltModule]] = {}

    # ---- structure -----------------------------------------------------------------------
    def enter_function(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        cls = ctx.class_def
        direct_cls = cls if cls is not None and ctx.parent(ctx.parent(node) or node) is cls else None
        state = FnState(node, node.name.value, direct_cls)
        name = node.name.value
        # ``def test_net(net, image)`` is a test when pytest collects it or it asserts; else it runs a model to test it
        pytest_test = name.startswith("test_") and (collects_tests(ctx) or any(
            isinstance(inner, cst.Assert) for inner in subtree(node.body)))
        state.eval_named = names_evaluation_function(name) or (name.startswith("test_") and not pytest_test)
        decorators = ctx.decorators_of(node)
        state.skip = pytest_test or any("fixture" in d or "pytest" in d for d in decorators)
        if direct_cls is not None and self._framework_class(direct_cls, ctx):
            state.skip = True
        state.nograd_dec = any(d in NO_GRAD_CONTEXTS for d in decorators)
        if any(decorator_evaluates(ctx, dec.decorator) for dec in node.decorators):
            state.evals["*"] = True  # a decorator of this repository runs the function with its model in eval mode
        self.stack.append(state)
        self.functions.setdefault(name, []).append(state)

    def leave_function(self) -> None:
        state = self.stack.pop()
        state.leaves_eval = any(state.evals.values())

    def on_return(self, node: cst.Return, ctx: FileContext) -> None:
        state = self.stack[-1]
        if state.node is None or node.value is None:
            return
        if any(state.evals.values()) or has_eval_chain(node.value):
            state.returns_eval = True
        if isinstance(node.value, cst.Tuple):
            for index, element in enumerate(node.value.elements):
                name = dotted_name(element.value) if isinstance(element.value, (cst.Name, cst.Attribute)) else None
                origin = ctx.origin(element.value) if name else element.value
                built = built_module(ctx, origin)
                if (built is not None and built.eval_mode) or has_eval_chain(origin) or \
                        (name and any(v and covers(k, name) for k, v in state.evals.items())):
                    state.returns_eval_at.add(index)

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
        name = val_iter_name(iter_expr)
        if name is not None:
            self.stack[-1].val_loops.append(ValLoop(node, name))

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
        self.trained_in.setdefault(receiver, []).append(state)
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
                receiver = switched_module(func.value, ctx, node)
                if receiver is not None:
                    self._record_eval(receiver, True, ctx, node)
                return
            if attr == "train":
                receiver = switched_module(func.value, ctx, node)
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
            if attr == "__enter__" and enters_grad_off(node, ctx):
                state.grad_off = True
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
        # ``demo(net.eval(), frames)``: a module handed in eval mode (eval() returns the module) counts as evaled
        handed_evaluated = any(has_eval_chain(arg.value) for arg in node.args)
        self.sites.setdefault(callee, []).append(CallSite(callee, state, self.evaled_any() or handed_evaluated,
                                                          self.nograd_now(), _function_arguments(node, ctx, state)))
        defined = self.functions.get(callee)
        if defined and any(s.leaves_eval for s in defined if s.node is not None and s not in self.stack):
            # a helper defined above that leaves its argument in eval mode (evaluate(model) without train())
            targets = [dotted_name(a.value) for a in node.args if isinstance(a.value, (cst.Name, cst.Attribute))]
            for target in [t for t in targets if t] or ["*"]:
                self._record_eval(target, True, ctx, node)
        if node.args:
            self._maybe_model_call(node, ctx)

    def _mark_backward(self, state: FnState) -> None:
        state.has_backward = True
        for loop in state.val_loops:
            loop.has_backward = True

    def _grad_call(self, node: cst.Call, attr: str, ctx: FileContext, state: FnState) -> None:
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
        in_path = self._in_path()
        # a model put in eval mode in this scope and run in a loop there runs for inference, whatever the names
        # say (``demo()``, a loop over ``dataloader``), unless that scope also trains (path_of checks the backward)
        data_loop = None if in_path or self.evaled_any() else data_loop_of(ctx)
        if not (in_path or self.evaled_any() or data_loop is not None) or self.test_file:
            return
        if any(s.skip for s in self.stack):
            return
        func = node.func
        target = func.value if isinstance(func, cst.Attribute) and func.attr.value == "forward" else func
        # ``self.model.predict(batch)``: a model's prediction method runs its forward pass;
        # taken as one only where this scope put that model in eval mode (below), i.e. the code runs it to infer
        by_method = isinstance(func, cst.Attribute) and func.attr.value != "forward" and \
            isinstance(func.value, (cst.Name, cst.Attribute)) and names_prediction_method(func.attr.value) and \
            name_is_model_like(dotted_name(func.value) or "")
        if by_method:
            target = func.value
        if not isinstance(target, (cst.Name, cst.Attribute)):
            return
        model = dotted_name(target)
        # ``self.eval(); return self.forward(x)``: a module's own method that puts the module in eval mode runs it
        # for inference (a predict() API); anywhere else the module calling itself is its forward pass
        own = model == "self" and self._evaluates_itself(node, ctx)
        if model is None or (model == "self" and not own) or model.startswith("super"):
            return
        head = model.split(".", 1)[0]
        if _lambda_parameter(ctx, node, head):
            return  # ``lambda model, x: model(x)``: an adapter whose caller hands it the model, in whatever mode
        if head == "self":
            # a model an object holds (``self.model``): its owner's caller decides the mode, so what this code does
            # with it (a loop over data keeping only numbers) says nothing on its own
            data_loop = None
            if not (in_path or self.evaled_any() or own):
                return
        if ctx.imports.names.get(head) is not None:
            return  # an imported function/module, not a model instance
        if isinstance(target, cst.Name):
            binding = ctx.binding(model)
            if binding is not None and binding.kind in ("def", "import"):
                return
        name_like = own or name_is_model_like(model)
        origin = ctx.origin(target)
        if origin is not target and isinstance(origin, (cst.Name, cst.Attribute)) and \
                ctx.imports.names.get((dotted_name(origin) or "").split(".", 1)[0]) is not None:
            return  # ``net = d2l.linreg``: what an import names is a function or a class, as when called directly
        built = built_module(ctx, origin)
        constructed = built is not None and built.model
        # a parameter named like nothing in particular: a model when every caller in this file passes one, which
        # only the whole file tells (``runs_a_module``, after the walk)
        passed = not (name_like or constructed) and origin is target and isinstance(target, cst.Name) and \
            getattr(ctx.binding(model), "kind", None) == "param"
        if not (name_like or constructed or passed):
            return
        if isinstance(origin, (cst.Lambda,)) or names_a_class(ctx, target) or hands_a_model(ctx, node):
            # ``Model = MODELS[name]; Model(cfg)`` builds a model from a class; ``unwrap_model(unet)`` is handed one:
            # neither runs a model's forward pass
            return
        if shape_check(node, target, ctx):
            return
        cls = next((s.cls for s in reversed(self.stack) if s.node is not None), None)
        if cls is not None and model.count(".") == 1 and head == "self" and defines_method(cls, model[5:]):
            return  # ``self.restore_model(step)``: a method of this class, not a module held by it
        if cls is not None and model.count(".") == 1 and head == "self":
            values = attribute_values(cls, model[5:])
            if values and all(isinstance(v, (cst.Name, cst.Attribute)) and name_says_not_a_model(dotted_name(v) or "")
                              for v in values):
                return  # ``self.model = model_fn``: what the object holds is the function it was handed, no module
        if head == "self" and not own and cls is not None and (ctx.is_module_subclass(cls) or any(
                ctx.facts(ModuleFacts).is_module_class(base) for base in
                (dotted_name(b.value) for b in cls.bases) if base)):
            # a module's own predict()/inference() helper: the caller decides the mode, unless it loops over data
            if not self.stack[-1].val_loops and not loops_over_loader(ctx):
                return
        aliases = {model, *alias_names(ctx, target)}  # ``model.eval(); runner = model``: the same model
        origin_name = dotted_name(origin) if isinstance(origin, (cst.Name, cst.Attribute)) else None
        if origin_name:
            aliases.add(origin_name)
        eval_local = any(v and covers(k, a) for s in self.stack for k, v in s.evals.items() for a in aliases)
        if by_method and not eval_local:
            return  # a method of a model this code did not put in eval mode: what it does is its class's business
        if not in_path and (not eval_local or not ctx.loops_in_function()) and data_loop is None and not own:
            # after eval(), inference is a forward repeated over data; a single one compares, counts or checks
            # the model (a conversion script, a FLOPs count on a random tensor, a shape self-check)
            return
        # asked only of a model call kept: a constructor's class may be summarized from another file to answer
        eval_chain = (built is not None and built.eval_mode) or has_eval_chain(origin) or \
            constructor_evaluates(ctx, origin)
        binding = ctx.binding(model) if isinstance(target, cst.Name) else None
        unpacked = binding.unpacked_from if binding is not None else None
        self.model_calls.append(ModelCall(
            node=node, model=model, aliases=aliases, stack=tuple(self.stack),
            loop=self.stack[-1].val_loops[-1] if self.stack[-1].val_loops else None,
            eval_local=eval_local, nograd_local=self.nograd_now(), cls=cls,
            is_global=head != "self" and not bound_locally(head, ctx), eval_chain=eval_chain,
            origin_func=origin_func(origin), after_eval=not in_path,
            # ``text_model, tokenizer = load_pair()``: the function and the item of the tuple it returns
            unpacked_from=(method_name(unpacked), binding.element) if isinstance(unpacked, cst.Call) else None,
            passed=target if passed else None,
            # neither named nor put in eval mode: a loop over data whose forward passes path_of weighs after the
            # walk (where their outputs go)
            data_loop=data_loop if not in_path and not eval_local else None,
        ))

    def _evaluates_itself(self, call: cst.Call, ctx: FileContext) -> bool:
        """The call runs ``self`` in a method of a module class that put ``self`` in eval mode, on real input."""
        state = self.stack[-1]
        cls = state.cls
        if cls is None or not state.evals.get("self") or synthetic_input(call, ctx):
            return False
        return ctx.is_module_subclass(cls) or any(ctx.facts(ModuleFacts).is_module_class(base) for base in
                                                  (dotted_name(b.value) for b in cls.bases) if base)

    # ---- decisions -------------------------------------------------------------------------
    def path_of(self, call: ModelCall) -> Optional[str]:
        """Where the call runs, for the message; None when it is not a validation path after all."""
        if call.loop is not None and not call.loop.has_backward:
            return f"the loop over `{call.loop.name}`"
        for state in reversed(call.stack):
            if state.eval_named and not state.has_backward:
                return f"`{state.name}()`"
        if call.data_loop is not None:
            if any(state.has_backward for state in call.stack) or \
                    not output_taken_off_graph(call.node, call.data_loop.body, self.ctx):
                return None
            # the loop keeps only the numbers of each forward pass and nothing around it trains: it runs the
            # model for its results (features, predictions), whatever the loop and the function are called
            return f"the loop over `{node_text(self.ctx, call.data_loop.iter)}`"
        if call.after_eval and not any(state.has_backward for state in call.stack) and \
                not any(covers(t, a) for t in self.trained for a in call.aliases):  # train() again: it trains too
            scope = call.stack[-1]
            where = "the module's code" if scope.node is None else f"`{scope.name}()`"
            return f"{where} after `{call.model}.eval()`"
        return None

    def covered_by_callers(self, state: FnState, kind: str, visiting: Optional[set] = None) -> bool:
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

    def only_functions(self, state: FnState, parameter: str, visiting: Optional[set] = None) -> bool:
        """Every call site of ``state``'s function in this file passes a plain function (``def net(X)``) as
        ``parameter``, itself or through a parameter of its caller that only ever gets one. A site that
        passes anything else, or no site at all, leaves the question open."""
        if state.node is None:
            return False
        params = [p.name.value for p in state.node.params.params]
        if parameter not in params:
            return False
        index = params.index(parameter) - (1 if state.cls is not None and params[:1] == ["self"] else 0)
        visiting = visiting or set()
        if (id(state), parameter) in visiting:
            return False
        visiting.add((id(state), parameter))
        sites = [site for site in self.sites.get(state.name, ()) if site.caller is not state]
        if not sites or index < 0:
            return False
        for site in sites:
            passed = site.functions[index] if index < len(site.functions) else None
            if passed == "def":
                continue
            if passed is None or not self.only_functions(site.caller, passed, visiting):
                return False
        return True

    def handed_from_elsewhere(self, call: ModelCall) -> bool:
        """Is the model a parameter of the function that runs it (or of a function around it), which no call in
        this file fills, itself or through a parameter of its caller that none fills either: a helper whose
        models come from other files (which may switch them to eval mode first, or hand pretrained ones in eval
        mode, or models that eval() does not change), none of which this file shows."""
        head = call.model.split(".", 1)[0]
        if head == "self":
            return self.inherited_from_elsewhere(call)
        for state in reversed(call.stack):
            if state.node is None:
                return False
            if head in [p.name.value for p in state.node.params.params] and head not in ("self", "cls"):
                return self._reached_only_from_elsewhere(state, head, set())
            if any(isinstance(n, cst.Assign) and any(dotted_name(t.target) == head for t in n.targets)
                   for n in subtree(state.node.body)):
                return False
        return False

    def inherited_from_elsewhere(self, call: ModelCall) -> bool:
        """Is the model ``self.<attribute>`` of a class that derives from another, where neither the class nor
        any of its bases defined in this file ever sets that attribute: a base class of another file or of a
        library holds it (a trainer or pipeline base built from a model its caller hands over), and whether that
        code builds it pretrained, switches it to eval mode first, or gives it dropout at all, this file does not
        show."""
        parts = call.model.split(".")
        cls = call.cls
        if len(parts) < 2 or cls is None:
            return False
        attribute = parts[1]
        defined = {node.name.value: node for node in self.ctx.module.body if isinstance(node, cst.ClassDef)}
        todo, seen, derived = [cls], set(), False
        while todo:
            current = todo.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if attribute_values(current, attribute) or _class_body_sets(current, attribute):
                return False
            for base in current.bases:
                name = dotted_name(base.value)
                if name in (None, "object"):
                    continue
                derived = True
                if name in defined:
                    todo.append(defined[name])
        return derived

    def _reached_only_from_elsewhere(self, state: FnState, parameter: str, visiting: set) -> bool:
        params = [p.name.value for p in state.node.params.params]
        index = params.index(parameter) - (1 if state.cls is not None and params[:1] in (["self"], ["cls"]) else 0)
        if (id(state), parameter) in visiting or index < 0:
            return False
        visiting.add((id(state), parameter))
        for site in self.sites.get(state.name, ()):
            if site.caller is state:
                continue
            passed = site.functions[index] if index < len(site.functions) else None
            if passed is None or passed == "def" or site.caller.node is None or \
                    not self._reached_only_from_elsewhere(site.caller, passed, visiting):
                return False
        return True

    def passed_module(self, call: ModelCall) -> Optional[BuiltModule]:
        """For a call of a parameter known by its callers only: the module every caller in this file passes."""
        if call.passed is None:
            return None
        if id(call) not in self._passed:
            self._passed[id(call)] = passed_module(self.ctx, call.passed, call.node)
        return self._passed[id(call)]

    def runs_a_module(self, call: ModelCall) -> bool:
        """The called object is a module: by its name or how it was built, or, for a parameter named like
        nothing in particular, because every call of its function in this file passes one."""
        return call.passed is None or self.passed_module(call) is not None

    def runs_a_function(self, call: ModelCall) -> bool:
        """The called name is a parameter that every call site fills with a plain function: no module, no mode."""
        if "." in call.model:
            return False
        scope = next((s for s in reversed(call.stack) if s.node is not None), None)
        return scope is not None and self.only_functions(scope, call.model)

    def trained_again(self, call: ModelCall) -> bool:
        """``.train()`` on the model after it was built in eval mode: for a name bound in the calling function,
        only a ``train()`` in that function (another function's ``model`` is another binding)."""
        for trained, states in self.trained_in.items():
            if trained == "self" or not any(covers(trained, a) for a in call.aliases):
                continue
            if call.is_global or trained.startswith("self.") or any(s in call.stack for s in states):
                return True
        return False

    def eval_covered(self, call: ModelCall) -> bool:
        if call.eval_local:
            return True
        # built in eval mode (``Net().eval()``, ``from_pretrained``, ``load_model()`` returning ``model.eval()``)
        # and never put back into training mode
        built_eval = call.eval_chain or (call.origin_func and any(
            s.returns_eval for s in self.functions.get(call.origin_func, ()))) or (call.unpacked_from and any(
                call.unpacked_from[1] in s.returns_eval_at for s in self.functions.get(call.unpacked_from[0], ())))
        passed = self.passed_module(call)
        built_eval = built_eval or (passed is not None and passed.eval_mode)
        built_eval = built_eval or self._kept_in_eval_by_its_class(call)
        if built_eval and not self.trained_again(call):
            return True
        if call.cls is not None and any(covers(k, a) for k in self.class_evals.get(call.cls, ()) for a in call.aliases):
            return True
        if call.is_global and any(covers(k, a) for k in self.module_evals for a in call.aliases):
            return True
        return any(self.covered_by_callers(s, "eval") for s in call.stack)

    def _kept_in_eval_by_its_class(self, call: ModelCall) -> bool:
        """``helper.encoder(x)`` after ``helper = Embedder(device)``, where every assignment of ``self.encoder`` in
        the class ``Embedder`` of this file builds it in eval mode (``from_pretrained``, ``Net().eval()``)."""
        head, _, attribute = call.model.partition(".")
        if not attribute or "." in attribute or head in ("self", "cls"):
            return False
        built = assignment_before(self.ctx, call.node, head)
        if not isinstance(built, cst.Call) or not isinstance(built.func, cst.Name):
            return False
        cls = next((node for node in self.ctx.facts(ModuleNodes).of_type(cst.ClassDef)
                    if node.name.value == built.func.value), None)
        if cls is None:
            return False
        values = [node.value for node in subtree(cls) if isinstance(node, cst.Assign)
                  and any(dotted_name(t.target) == f"self.{attribute}" for t in node.targets)]
        built = [built_module(self.ctx, value) for value in values]
        return bool(built) and all(b is not None and b.eval_mode for b in built)

    def nograd_covered(self, call: ModelCall) -> bool:
        if call.nograd_local or self.module_state.grad_off:
            return True
        if any(s.needs_grad for s in call.stack if s.node is not None) or call.stack[-1].needs_grad:
            return True
        return any(self.covered_by_callers(s, "nograd") for s in call.stack)


SYNTHETIC = {"torch.randn", "torch.rand", "torch.randint", "torch.zeros", "torch.ones", "torch.empty", "torch.full"}


def shape_check(call: cst.Call, target: cst.BaseExpression, ctx: FileContext) -> bool:
    """``def test(): net = ResNet18(); y = net(torch.randn(1, 3, 32, 32)); print(y.size())``: a model built
    in this very function, no weights loaded, run once (no loop) on a random or constant tensor. That checks
    shapes; there are no results whose mode could matter, nor a graph worth freeing."""
    fn = ctx.function_def
    # a function, or a script's ``if __name__ == "__main__":`` block (a module's self-check)
    scope = fn if fn is not None else main_block(ctx, call)
    if scope is None or not isinstance(target, cst.Name) or ctx.loops_in_function() or not call.args:
        return False
    binding = ctx.scopes[-1].bindings.get(target.value) if ctx.scopes else None
    if binding is None or binding.kind != "assign" or not isinstance(binding.value, cst.Call):
        return False
    for node in subtree(scope.body):
        if isinstance(node, cst.Call) and "load" in (method_name(node) or "").lower():
            return False  # weights come in: this may be a real evaluation
    return synthetic_input(call, ctx)


def synthetic_input(call: cst.Call, ctx: FileContext) -> bool:
    """The call's first argument is a random or constant tensor (``torch.rand(...)``, or a name bound to one)."""
    if not call.args:
        return False
    value = call.args[0].value
    if isinstance(value, cst.Name):
        bound = ctx.scopes[-1].bindings.get(value.value)
        # ``x = x.cuda()`` / ``x = x.to(device)``: the same numbers elsewhere (the methods a module shares)
        while bound is not None and isinstance(bound.value, cst.Call) and isinstance(bound.value.func, cst.Attribute) \
                and method_returns_same_module(bound.value.func.attr.value) and \
                dotted_name(bound.value.func.value) == value.value:
            bound = bound.previous
        value = bound.value if bound is not None and bound.kind == "assign" else None
    return isinstance(value, cst.Call) and ctx.call_name(value) in SYNTHETIC


def constructor_evaluates(ctx: FileContext, origin: Optional[cst.BaseExpression]) -> bool:
    """``Wrapper(backbone)`` of a repository class whose ``__init__`` puts what it holds in eval mode."""
    if not isinstance(origin, cst.Call) or not isinstance(origin.func, (cst.Name, cst.Attribute)):
        return False
    name = dotted_name(origin.func)
    if not name or not name.rsplit(".", 1)[-1][:1].isupper():
        return False
    found = ctx.facts(ModuleFacts).find_class(name)
    return found is not None and found.init_evaluates


def decorator_evaluates(ctx: FileContext, decorator: cst.BaseExpression) -> bool:
    """``@eval_mode`` where this file defines ``def eval_mode(fn)`` whose wrapper calls ``.eval()`` on one of its
    own parameters (the decorated function's model) before it calls ``fn``."""
    expr = decorator.func if isinstance(decorator, cst.Call) else decorator
    binding = ctx.binding(expr.value) if isinstance(expr, cst.Name) else None
    outer = binding.node if binding is not None and binding.kind == "def" else None
    if not isinstance(outer, cst.FunctionDef):
        return False
    for inner in subtree(outer.body):
        if not isinstance(inner, cst.FunctionDef):
            continue
        params = {p.name.value for p in (*inner.params.params, *inner.params.posonly_params)}
        for call in subtree(inner.body):
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "eval" \
                    and not call.args and isinstance(call.func.value, cst.Name) and call.func.value.value in params:
                return True
    return False


def _class_body_sets(cls: cst.ClassDef, attribute: str) -> bool:
    """``model = None`` or ``model: nn.Module = build()`` in the class body: the class gives the attribute itself."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    for statement in body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and any(dotted_name(t.target) == attribute for t in small.targets):
                return True
            if isinstance(small, cst.AnnAssign) and small.value is not None and dotted_name(small.target) == attribute:
                return True
    return False


def defines_method(cls: cst.ClassDef, name: str) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return any(isinstance(stmt, cst.FunctionDef) and stmt.name.value == name for stmt in body)


def _function_arguments(call: cst.Call, ctx: FileContext, state: FnState) -> tuple:
    """What each positional argument of ``call`` is, as far as a model question needs: ``"def"`` for a name
    bound by ``def`` (a plain function), the name of the caller's parameter it passes on, else None."""
    if not call.args or any(a.keyword is not None or a.star for a in call.args):
        return ()
    params = {p.name.value for p in state.node.params.params} if state.node is not None else set()
    kinds = []
    for arg in call.args:
        value = arg.value
        kind = None
        if isinstance(value, cst.Name):
            binding = ctx.binding(value.value)
            if binding is not None and binding.kind == "def":
                kind = "def"
            elif value.value in params:
                kind = value.value
        kinds.append(kind)
    return tuple(kinds)


def bound_locally(head: str, ctx: FileContext) -> bool:
    for scope in ctx.scopes[1:]:
        if isinstance(scope.node, cst.ClassDef):
            continue
        if head in scope.bindings:
            return True
    return False


def _lambda_parameter(ctx: FileContext, node: cst.CSTNode, name: str) -> bool:
    """Is ``name`` a parameter of a lambda around ``node``? The lambda's body runs where it is called, on what its
    caller hands it (a default ``model_fn=lambda model, x: model(x)`` runs inside the step that set the mode)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            return False
        if isinstance(ancestor, cst.Lambda):
            params = ancestor.params
            if any(param.name.value == name for param in [*params.posonly_params, *params.params,
                                                          *params.kwonly_params]):
                return True
    return False


def has_eval_chain(expr: Optional[cst.BaseExpression]) -> bool:
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        attr = expr.func.attr.value
        if attr == "eval" or (attr == "train" and is_false(argument(expr, 0, "mode"))):
            return True
        if not method_returns_same_module(attr):
            return False
        expr = expr.func.value
    return False


def origin_func(origin: Optional[cst.BaseExpression]) -> Optional[str]:
    """``load_model`` for ``model = load_model(path).to(device)``."""
    expr = origin
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            method_returns_same_module(expr.func.attr.value):
        expr = expr.func.value
    return method_name(expr) if isinstance(expr, cst.Call) else None


def data_loop_of(ctx: FileContext) -> Optional[cst.For]:
    """The innermost ``for`` of this function when it walks over data: an iterable that is not a count
    (``range(n)``, ``len(x)``) nor a literal; None otherwise."""
    loops = ctx.loops_in_function()
    loop = loops[-1] if loops else None
    if not isinstance(loop, cst.For):
        return None
    iterable = loop.iter
    while isinstance(iterable, cst.Call) and method_name(iterable) in ("enumerate", "tqdm", "iter") and iterable.args:
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Call) and method_name(iterable) in ("range", "len", "zip", "items", "keys", "values"):
        return None
    if not isinstance(iterable, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        return None
    return loop


def loops_over_loader(ctx: FileContext) -> bool:
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


def switched_module(receiver: cst.BaseExpression, ctx: FileContext, call: cst.Call) -> Optional[str]:
    """The module (as a dotted name) whose mode ``receiver.eval()`` / ``.train()`` sets: the receiver itself; the
    module under methods that return it (``model.cuda().eval()``, the library table's ``Module`` methods); or a
    container of modules whose every item is switched in a loop over it (``for k in nets: nets[k].eval()``,
    ``[m.eval() for m in nets.values()]``). ``call`` is the switching call, where the walk stands."""
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and \
            method_returns_same_module(receiver.func.attr.value):
        receiver = receiver.func.value
    name = dotted_name(receiver)
    if name is not None and "." not in name:
        over = _iterated_container(call, name, ctx, items=True)  # ``for m in nets.values(): m.eval()``
        return over or name
    if name is not None:
        return name
    if isinstance(receiver, cst.Subscript) and len(receiver.slice) == 1 and \
            isinstance(receiver.slice[0].slice, cst.Index) and isinstance(receiver.slice[0].slice.value, cst.Name):
        container = dotted_name(receiver.value)  # ``nets[k].eval()`` with k running over nets' keys
        key = receiver.slice[0].slice.value.value
        if container is not None and _iterated_container(call, key, ctx, items=False) == container:
            return container
    return None


def _iterated_container(node: cst.CSTNode, variable: str, ctx: FileContext, items: bool) -> Optional[str]:
    """The container (a dotted name) that the loop or comprehension around ``node`` binding ``variable`` runs
    over: its keys (``for k in nets``, ``nets.keys()``) or, with ``items``, its values (``nets.values()``, a list)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return None
        loops = [ancestor] if isinstance(ancestor, cst.For) else \
            list(_comprehension_fors(ancestor.for_in)) if isinstance(ancestor, (cst.ListComp, cst.SetComp,
                                                                                 cst.GeneratorExp, cst.DictComp)) else []
        for loop in loops:
            if not (isinstance(loop.target, cst.Name) and loop.target.value == variable):
                continue
            source = loop.iter
            method = source.func.attr.value if isinstance(source, cst.Call) and \
                isinstance(source.func, cst.Attribute) and not source.args else None
            if method is not None:
                source = source.func.value
            if method == "values" and items or method in (None, "keys") and not items:
                return dotted_name(source)
            return None
    return None


def _comprehension_fors(for_in: cst.CompFor):
    current: Optional[cst.CompFor] = for_in
    while current is not None:
        yield current
        current = current.inner_for_in

