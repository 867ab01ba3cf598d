"""Training-loop rules: optimizer bookkeeping, schedulers, loss accumulation, train/eval modes.

Every rule here collects small facts while the engine walks the file (which loop a call sits
in, which function, what a name was last assigned from) and decides at ``end_file``. Loops are
identified by their node; a fact's "loop stack" is the tuple of ``for``/``while`` loops of the
same function that enclose it, outermost first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    call_receiver,
    dotted_name,
    is_false,
    iter_names,
    keyword_arg,
    method_name,
    positional_args,
    short,
    string_value,
)
from analyzers.markdown import code_span, named
from analyzers.program.flow import subtree
from analyzers.program.library import is_library
from analyzers.program.loops import LoopStack, loop_stack
from analyzers.program.modules import ModuleFacts
from analyzers.program.names import last_segment
from analyzers.program.roles import LightningClasses
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import (BACKWARD_METHODS, is_model_call, is_optimizer, is_plain_backward, is_scaler,
                                      is_scheduler)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule

# ---------------------------------------------------------------------------------------------
# Shared classification helpers (each looks at one expression's immediate structure only)

_OUTPUT_NAMES = {"out", "output", "outputs", "logits", "pred", "preds", "prediction", "predictions",
                 "y_pred", "y_hat", "yhat", "scores", "recon", "reconstruction"}
_RNN_CLASSES = {"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell", "Transformer", "TransformerEncoder",
                "TransformerEncoderLayer", "TransformerDecoder", "TransformerDecoderLayer", "MultiheadAttention"}
_CLIP_HINTS = ("clip_grad", "grad_clip", "gradient_clip", "clip_gradient", "max_grad_norm", "clip_norm",
               "clipnorm", "clip_by_norm", "clip_value")
_DETACHING_METHODS = {"item", "detach", "tolist", "numpy", "detach_"}
_DETACHING_FUNCS = {"float", "int", "round", "len", "str", "bool"}
# tensor -> tensor methods that keep the autograd graph of their receiver
_GRAPH_KEEPING_METHODS = {"mean", "sum", "cpu", "cuda", "to", "float", "double", "half", "clone", "squeeze",
                          "unsqueeze", "view", "reshape", "mul", "div", "add", "sub", "sqrt", "abs", "exp", "log",
                          "pow", "contiguous", "flatten", "norm", "max", "min"}
_LOG_SINKS = {"print", "log", "info", "debug", "warning", "warn", "set_postfix", "set_postfix_str",
              "set_description", "add_scalar", "add_scalars", "log_metrics", "log_metric", "log_dict", "write",
              "append"}
_SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}
_MATH_MODULES = {"math", "np", "numpy", "torch", "F", "cmath", "jnp"}
_RANK_HINTS = ("rank", "main", "master", "process_zero", "is_zero")


def _is_loop_variable(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    name = dotted_name(expr)
    binding = ctx.binding(name) if name else None
    return binding is not None and binding.kind == "for"


def _keys(expr: cst.BaseExpression, ctx: FileContext) -> frozenset:
    """Names an optimizer may be referred to by: its own last segment and its alias's origin."""
    name = dotted_name(expr)
    keys = {last_segment(name)} if name else set()
    origin = ctx.origin(expr)
    if origin is not expr and isinstance(origin, (cst.Name, cst.Attribute)):
        keys.add(last_segment(dotted_name(origin)))
    return frozenset(k for k in keys if k)


@dataclass
class _Step:
    node: cst.Call
    optimizer: cst.BaseExpression
    display: str
    keys: frozenset
    vague: bool  # a loop variable / subscript: cannot tell which optimizer
    has_args: bool  # ``opt.step(closure)``
    via_scaler: bool


def _optimizer_step(call: cst.Call, ctx: FileContext) -> Optional[_Step]:
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
        return _Step(call, target, name or "optimizer", _keys(target, ctx) if name else frozenset(),
                     name is None or _is_loop_variable(target, ctx), False, True)
    if not is_optimizer(receiver, ctx):
        return None
    name = dotted_name(receiver) or "optimizer"
    return _Step(call, receiver, name, _keys(receiver, ctx), _is_loop_variable(receiver, ctx), bool(call.args), False)


def _is_criterion_call(call: cst.Call, ctx: FileContext) -> bool:
    """A loss computation: ``criterion(out, y)``, ``F.cross_entropy(...)``, ``nn.MSELoss()(...)``."""
    name = dotted_name(call.func)
    if name is not None:
        last = last_segment(name).lower()
        if "loss" in last or "criterion" in last:
            return True
        qualified = ctx.qualified_name(call.func) or ""
        if qualified.startswith("torch.nn.functional.") and (
                "loss" in qualified or "entropy" in qualified or qualified.endswith(("kl_div", "margin_ranking"))):
            return True
    origin = ctx.origin(call.func)
    if isinstance(origin, cst.Call):
        qualified = ctx.call_name(origin) or ""
        if qualified.startswith("torch.nn.") and qualified.endswith("Loss"):
            return True
    return False


def _value_kind(value: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> Optional[str]:
    """"loss" / "model" when ``value`` evaluates to a tensor that carries an autograd graph."""
    if value is None or depth > 4:
        return None
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Name) and func.value in _DETACHING_FUNCS:
            return None
        method = method_name(value)
        receiver = call_receiver(value)
        if receiver is not None and method in _DETACHING_METHODS:
            return None
        if receiver is not None and method in _GRAPH_KEEPING_METHODS:
            inner = _expr_kind(receiver, ctx, depth + 1)
            if inner is not None:
                return inner
            if ctx.qualified_name(receiver) != "torch":
                return None
        if _is_criterion_call(value, ctx):
            return "loss"
        if is_model_call(func, ctx):
            return "model"
        qualified = ctx.qualified_name(func) or ""
        if qualified in ("torch.mean", "torch.sum", "torch.stack", "torch.cat"):
            args = positional_args(value)
            return _expr_kind(args[0].value, ctx, depth + 1) if args else None
        return None
    if isinstance(value, cst.BinaryOperation):
        return _expr_kind(value.left, ctx, depth + 1) or _expr_kind(value.right, ctx, depth + 1)
    if isinstance(value, cst.UnaryOperation):
        return _expr_kind(value.expression, ctx, depth + 1)
    if isinstance(value, (cst.Name, cst.Attribute)):
        return _expr_kind(value, ctx, depth + 1)
    if isinstance(value, cst.Subscript):
        return _value_kind(value.value, ctx, depth + 1)
    return None


def _expr_kind(expr: cst.BaseExpression, ctx: FileContext, depth: int = 0) -> Optional[str]:
    """Like :func:`_value_kind` for an expression read now (names resolved through bindings)."""
    if depth > 4:
        return None
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return _value_kind(expr, ctx, depth)
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("data", "grad"):
        return None
    name = dotted_name(expr)
    if name is None:
        # ``model(x).loss``
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            return "loss" if _value_kind(expr.value, ctx, depth + 1) else None
        return None
    binding = ctx.binding(name)
    if binding is None:
        if isinstance(expr, cst.Attribute) and "loss" in expr.attr.value.lower():
            # ``outputs.loss`` with ``outputs = model(**batch)``
            return "loss" if _expr_kind(expr.value, ctx, depth + 1) else None
        return None
    if in_no_grad_block(ctx, binding.node):
        return None
    if binding.kind in ("assign", "annassign", "walrus"):
        if binding.value is None:
            # ``logits, loss = model(x, y)``: tuple unpacking of a model/criterion call
            node = binding.node
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and "loss" in last_segment(name).lower():
                return "loss" if _value_kind(node.value, ctx, depth + 1) else None
            return None
        if binding.value is expr:
            return None
        return _value_kind(binding.value, ctx, depth + 1)
    if binding.kind == "augassign" and isinstance(binding.node, cst.AugAssign):
        kind = _value_kind(binding.node.value, ctx, depth + 1)
        if kind is not None:
            return kind
        return "loss" if "loss" in last_segment(name).lower() and not _detached_value(binding.node.value) else None
    return None


def _detached_value(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Name) and value.func.value in _DETACHING_FUNCS:
            return True
        return method_name(value) in _DETACHING_METHODS and call_receiver(value) is not None
    return isinstance(value, (cst.Integer, cst.Float))


def _names_used(expr: cst.CSTNode, ctx: FileContext) -> set:
    """Dotted names in ``expr``, plus one level through the names' last assignments."""
    names = set(iter_names(expr))
    for name in list(names):
        value = ctx.assigned_value(name)
        if value is not None and not isinstance(value, cst.AugAssign):
            names.update(iter_names(value))
        elif isinstance(value, cst.AugAssign):
            names.update(iter_names(value.value))
    return names


def _is_rank_test(test: cst.BaseExpression) -> bool:
    return any(any(h in n.lower() for h in _RANK_HINTS) for n in iter_names(test))


def _guard_between(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext, *, except_handlers: bool = False) -> bool:
    """An ``if`` (other than a rank check) or, optionally, an ``except`` between ``node`` and ``loop``."""
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.If) and not _is_rank_test(ancestor.test):
            return True
        if isinstance(ancestor, cst.IfExp):
            return True
        if except_handlers and isinstance(ancestor, (cst.ExceptHandler, cst.ExceptStarHandler)):
            return True
    return False


def _lightning_classes(ctx: FileContext) -> set:
    return ctx.facts(LightningClasses).names


def _in_lightning(ctx: FileContext) -> bool:
    if not ctx.classes:
        return False
    lightning = _lightning_classes(ctx)
    for cls in ctx.classes:
        if cls.name.value in lightning:
            return True
        for base in ctx.class_bases(cls):
            if last_segment(base) == "LightningModule":
                return True
    return False


def _fn_name(ctx: FileContext) -> Optional[str]:
    fn = ctx.function_def
    return fn.name.value if fn is not None else None


def _closure(direct: set, calls: dict) -> set:
    """Functions (by name) that do something directly or call one that does, transitively."""
    result = set(direct)
    changed = True
    while changed:
        changed = False
        for fn, called in calls.items():
            if fn not in result and called & result:
                result.add(fn)
                changed = True
    return result


# ---------------------------------------------------------------------------------------------
# TR101


class MissingZeroGrad(Rule):
    id = "TR101"
    source_hint = re.compile(r"\.step\s*\(")  # an optimizer step
    slug = "missing-zero-grad"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = "optimizer stepped in a loop but its gradients are never zeroed"
    what = """
        Flags an optimizer whose `step()` (or `scaler.step(optimizer)`) runs inside a loop when
        nothing in that loop clears the gradients: no `optimizer.zero_grad()`, no
        `model.zero_grad()`, no `p.grad = None`, and no helper called in the loop that does it.
        Also flags a `train_step`-style function that steps an optimizer and never zeroes it
        anywhere in the file.
    """
    why = """
        `.backward()` adds into `.grad`; it does not overwrite it. Without zeroing, every update
        uses the sum of the gradients of all previous batches, so the effective learning rate
        grows with the step count and training diverges or silently degrades. With two
        optimizers (GANs, actor-critic), forgetting one of them is an easy mistake.
    """
    example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    fix_example = """
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    VALID = [
        # zero at the top of the iteration
        """
        import torch
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
        """,
        # zero after step, at the loop end; model.zero_grad() counts
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            model.zero_grad()
        """,
        # gradient accumulation
        """
        import torch
        from torch import optim
        optimizer = optim.AdamW(model.parameters())
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        # trainer class: self.optimizer zeroed via a helper defined in this file
        """
        import torch
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.optimizer = torch.optim.Adam(model.parameters())
            def reset(self):
                self.optimizer.zero_grad()
            def fit(self, loader):
                while True:
                    for batch in loader:
                        self.reset()
                        loss = self.model(batch).mean()
                        loss.backward()
                        self.optimizer.step()
        """,
        # helper whose name says it zeroes
        """
        import torch
        for batch in loader:
            zero_grad_all(models)
            loss = compute(batch)
            loss.backward()
            opt_g.step()
        """,
        # grads set to None by hand
        """
        import torch
        for batch in loader:
            for p in model.parameters():
                p.grad = None
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()
        """,
        """
        import torch
        for batch in loader:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
            model(batch).sum().backward()
            optimizer.step()
        """,
        # zeroed in the outer loop that wraps the inner stepping loop
        """
        import torch
        for epoch in range(10):
            optimizer.zero_grad()
            for batch in loader:
                model(batch).sum().backward()
                optimizer.step()
        """,
        # AMP
        """
        import torch
        scaler = torch.cuda.amp.GradScaler()
        for x, y in loader:
            opt.zero_grad()
            with torch.autocast("cuda"):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        """,
        # not optimizers
        """
        import torch
        for epoch in range(10):
            train(model)
            scheduler.step()
        while not done:
            obs, reward, done, info = env.step(action)
        """,
        # Lightning zeroes for you
        """
        import torch
        import lightning as L
        class Model(L.LightningModule):
            def training_step(self, batch, idx):
                opt = self.optimizers()
                for chunk in batch:
                    self.manual_backward(self.loss(chunk))
                    opt.step()
        """,
        # LBFGS closure zeroes inside
        """
        import torch
        for i in range(20):
            def closure():
                optimizer.zero_grad()
                loss = model(x).sum()
                loss.backward()
                return loss
            optimizer.step(closure)
        """,
        # a step outside any loop in a function that is not a train_step
        """
        import torch
        def update(optimizer, loss):
            loss.backward()
            optimizer.step()
        """,
        # several optimizers zeroed and stepped through a loop variable
        """
        import torch
        for batch in loader:
            for o in (opt_g, opt_d):
                o.zero_grad()
            loss = gan_loss(batch)
            loss.backward()
            for o in (opt_g, opt_d):
                o.step()
        """,
        # no backward in the loop: gradients are assigned by hand, nothing accumulates
        """
        import torch
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(5):
            w.grad = torch.ones_like(w)
            opt.step()
        for _ in range(5):
            opt.step()
        """,
        # train_step that is zeroed by its caller in this file
        """
        import torch
        def train_step(batch):
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
        for batch in loader:
            optimizer.zero_grad()
            train_step(batch)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=7, message="`optimizer` is stepped",
        ),
        # GAN: D is zeroed, G is not
        Invalid(
            """
            import torch
            from torch.optim import Adam
            opt_g = Adam(gen.parameters())
            opt_d = Adam(disc.parameters())
            for real in loader:
                opt_d.zero_grad()
                d_loss = d_criterion(disc(real), disc(gen(noise)))
                d_loss.backward()
                opt_d.step()
                g_loss = g_criterion(disc(gen(noise)))
                g_loss.backward()
                opt_g.step()
            """,
            line=13, message="opt_g",
        ),
        # zeroed once before the loop only
        Invalid(
            """
            import torch
            def train(model, loader, optimizer):
                optimizer.zero_grad()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
            """,
            line=8, message="optimizer",
        ),
        # trainer class with self.optimizer and an AMP scaler
        Invalid(
            """
            import torch
            class Trainer:
                def fit(self, loader):
                    for epoch in range(self.epochs):
                        for x, y in loader:
                            with torch.autocast("cuda"):
                                loss = self.criterion(self.model(x), y)
                            self.scaler.scale(loss).backward()
                            self.scaler.step(self.optimizer)
                            self.scaler.update()
            """,
            line=10, message="self.optimizer",
        ),
        # while True loop, optim imported as a module alias
        Invalid(
            """
            import torch.optim as optim
            adam = optim.Adam(net.parameters())
            step = 0
            while True:
                net(next(it)).sum().backward()
                adam.step()
                step += 1
            """,
            line=7, message="adam",
        ),
        # a per-batch step function that never zeroes
        Invalid(
            """
            import torch
            def train_step(model, batch, optimizer):
                loss = model(batch).mean()
                loss.backward()
                optimizer.step()
                return loss.item()
            """,
            line=6, message="train_step",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.steps: list[tuple[_Step, LoopStack, object, Optional[str]]] = []
        self.zeros: list[tuple[Optional[frozenset], LoopStack, object]] = []  # keys None: any optimizer
        self.loop_calls: list[tuple[str, LoopStack, object]] = []
        self.calls: dict[str, set] = {}
        self.zeroing_functions: set = set()
        self.backwards: list[tuple[LoopStack, object]] = []
        self.backward_functions: set = set()

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None:
            return
        fn_name = _fn_name(ctx)
        if fn_name is not None:
            self.calls.setdefault(fn_name, set()).add(name)
        if name in BACKWARD_METHODS:
            self.backwards.append((loop_stack(ctx), ctx.function))
            if fn_name is not None:
                self.backward_functions.add(fn_name)
            return
        if name == "step":
            if _in_lightning(ctx):
                return
            step = _optimizer_step(node, ctx)
            if step is not None:
                stack = loop_stack(ctx)
                root = (dotted_name(step.optimizer) or "").split(".", 1)[0]
                if root and stack:
                    # ``for opt in self.optimizers: opt.step()`` iterates optimizers, not batches
                    stack = tuple(lp for lp in stack
                                  if not (isinstance(lp, cst.For) and root in set(iter_names(lp.target))))
                self.steps.append((step, stack, ctx.function, fn_name))
            return
        if name == "zero_grad" or name == "zero_" and _is_grad_attr(call_receiver(node)):
            receiver = call_receiver(node)
            keys = None
            if name == "zero_grad" and receiver is not None and dotted_name(receiver) is not None and \
                    is_optimizer(receiver, ctx) and not _is_loop_variable(receiver, ctx):
                keys = _keys(receiver, ctx)
            self.zeros.append((keys, loop_stack(ctx), ctx.function))
            if fn_name is not None:
                self.zeroing_functions.add(fn_name)
            return
        if ctx.loops:
            stack = loop_stack(ctx)
            if stack:
                self.loop_calls.append((name, stack, ctx.function))

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        # ``p.grad = None`` (or any other assignment that replaces the gradient)
        if any(_is_grad_attr(t.target) for t in node.targets):
            self.zeros.append((None, loop_stack(ctx), ctx.function))
            fn_name = _fn_name(ctx)
            if fn_name is not None:
                self.zeroing_functions.add(fn_name)

    def end_file(self, ctx: FileContext) -> None:
        if not self.steps:
            return
        zeroing = _closure(self.zeroing_functions, self.calls)
        backward = _closure(self.backward_functions, self.calls)
        reported: set = set()
        for step, loops, fn, fn_name in self.steps:
            if step.has_args:
                continue
            key = (id(fn), step.display)
            if key in reported:
                continue
            if loops:
                if self._zeroed_in(step, loops, fn, zeroing) or not self._backward_in(loops, fn, backward):
                    continue  # no backward in the loop: nothing accumulates (e.g. gradients set by hand)
                reported.add(key)
                self.report(step.node, self._loop_message(step))
            elif fn_name is not None and _is_train_step_name(fn_name):
                if self._zeroed_anywhere(step, zeroing, fn_name) or fn_name not in backward:
                    continue
                reported.add(key)
                self.report(step.node, (
                    f"{named('optimizer', step.display)} is stepped in `{fn_name}()` but its gradients are never "
                    f"zeroed there or anywhere else in this file; every call adds the new gradients to the old ones: "
                    f"call {code_span(step.display + '.zero_grad()')} before the backward pass"))

    @staticmethod
    def _matches(step: _Step, keys: Optional[frozenset]) -> bool:
        return keys is None or step.vague or not step.keys or bool(keys & step.keys)

    def _zeroed_in(self, step: _Step, loops: LoopStack, fn, zeroing: set) -> bool:
        loop_ids = {id(lp) for lp in loops}
        for keys, zloops, zfn in self.zeros:
            if zfn is fn and any(id(lp) in loop_ids for lp in zloops) and self._matches(step, keys):
                return True
        for name, cloops, cfn in self.loop_calls:
            if cfn is fn and (name in zeroing or _zeroing_name(name)) and any(id(lp) in loop_ids for lp in cloops):
                return True
        return False

    def _backward_in(self, loops: LoopStack, fn, backward: set) -> bool:
        loop_ids = {id(lp) for lp in loops}
        for bloops, bfn in self.backwards:
            if bfn is fn and any(id(lp) in loop_ids for lp in bloops):
                return True
        return any(cfn is fn and name in backward and any(id(lp) in loop_ids for lp in cloops)
                   for name, cloops, cfn in self.loop_calls)

    def _zeroed_anywhere(self, step: _Step, zeroing: set, fn_name: str) -> bool:
        if fn_name in zeroing:
            return True
        if any(self._matches(step, keys) for keys, _, _ in self.zeros):
            return True
        return any(_zeroing_name(name) for names in self.calls.values() for name in names)

    @staticmethod
    def _loop_message(step: _Step) -> str:
        how = f"via {code_span(f'scaler.step({step.display})')} " if step.via_scaler else ""
        return (f"{named('optimizer', step.display)} is stepped {how}inside a loop but its gradients are never "
                f"zeroed in that loop: each update uses the gradients of all previous iterations summed; call "
                f"{code_span(step.display + '.zero_grad()')} once per iteration")


def _is_grad_attr(expr: Optional[cst.BaseExpression]) -> bool:
    """``p.grad`` or ``p.grad.data``."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "data":
        expr = expr.value
    return isinstance(expr, cst.Attribute) and expr.attr.value == "grad"


def _zeroing_name(name: str) -> bool:
    lowered = name.lower()
    return "zero_grad" in lowered or "reset_grad" in lowered or "clear_grad" in lowered


def _is_train_step_name(name: str) -> bool:
    lowered = name.lower()
    return bool(re.search(r"train\w*step", lowered)) or lowered in ("train_batch", "train_on_batch")


# ---------------------------------------------------------------------------------------------
# TR102


class SchedulerStepBeforeOptimizer(Rule):
    id = "TR102"
    slug = "scheduler-step-before-optimizer"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    requires = "torch"
    summary = "lr_scheduler.step() called before optimizer.step() in the same iteration"
    what = """
        Flags `scheduler.step()` that comes before `optimizer.step()` in the body of the same
        loop, for a scheduler from `torch.optim.lr_scheduler` (or a variable named like one).
    """
    why = """
        Since PyTorch 1.1 the scheduler must be stepped after the optimizer. Stepping it first
        skips the first value of the schedule (warm-up starts one step late, step decays come
        one step early) and PyTorch warns about it on the first iteration.
    """
    example = """
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            scheduler.step()
            optimizer.step()
    """
    fix_example = """
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            scheduler.step()
    """
    VALID = [
        """
        import torch
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            scheduler.step()
        """,
        # per-epoch scheduler in the outer loop, after the inner batch loop
        """
        import torch
        from torch.optim.lr_scheduler import StepLR
        sched = StepLR(opt, step_size=10)
        for epoch in range(epochs):
            for x, y in loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
            sched.step()
        """,
        # the previous iteration's step comes textually after in another loop
        """
        import torch
        for epoch in range(epochs):
            lr_scheduler.step()
            train_one_epoch(model, optimizer)
        """,
        # two optimizers: the scheduler follows the one it drives
        """
        import torch
        for batch in loader:
            opt_d.step()
            sched_d.step()
            opt_g.step()
            sched_g.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                scheduler.step()
                optimizer.step()
            """,
            line=6, message="scheduler.step() runs before optimizer.step()",
        ),
        Invalid(
            """
            import torch
            from torch.optim import lr_scheduler
            warm = lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 100))
            while step < max_steps:
                warm.step()
                loss = model(next(it)).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            """,
            line=6, message="warm.step()",
        ),
        Invalid(
            """
            import torch
            class Trainer:
                def fit(self):
                    for batch in self.loader:
                        self.optimizer.zero_grad()
                        self.scaler.scale(self.loss(batch)).backward()
                        if self.lr_scheduler is not None:
                            self.lr_scheduler.step()
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
            """,
            line=9, message="self.lr_scheduler",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.events: dict[int, list[tuple[str, cst.Call, str]]] = {}

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) != "step" or not ctx.loops:
            return
        stack = loop_stack(ctx)
        if not stack:
            return
        receiver = call_receiver(node)
        if receiver is None:
            return
        events = self.events.setdefault(id(stack[-1]), [])
        if is_scheduler(receiver, ctx):
            events.append(("sched", node, dotted_name(receiver) or "scheduler"))
            return
        step = _optimizer_step(node, ctx)
        if step is not None:
            events.append(("opt", node, step.display))

    def end_file(self, ctx: FileContext) -> None:
        for events in self.events.values():
            kinds = [kind for kind, _, _ in events]
            if "opt" not in kinds or kinds[0] != "sched":
                continue
            _, node, sched = events[0]
            optimizer = next(name for kind, _, name in events if kind == "opt")
            self.report(node, (f"{sched}.step() runs before optimizer.step() ({optimizer}) in the same iteration: "
                               f"the first learning rate of the schedule is skipped; call {sched}.step() after "
                               f"{optimizer}.step()"))


# ---------------------------------------------------------------------------------------------
# TR103


class MissingGradClippingRNN(Rule):
    id = "TR103"
    source_hint = re.compile(r"backward|\.step\s*\(")  # a training step (the RNN may live in another file)
    slug = "missing-grad-clipping-rnn"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    requires = "torch"
    summary = "recurrent/attention model trained without gradient clipping"
    what = """
        Flags a file that trains, in a loop, a vanilla `nn.RNN`, or a language or translation
        model (a head with one output per vocabulary token) built on `nn.LSTM`/`nn.GRU` or
        `nn.Transformer*`/`nn.MultiheadAttention` — in the file or in a model class of the
        repository it imports — while nothing in the file clips gradients (`clip_grad_norm_`,
        `clip_grad_value_`, a trainer's gradient-clipping option). Short-sequence classifiers
        (an LSTM over MNIST rows, a ViT) and L-BFGS training are not flagged. Reported once, on the first optimizer
        step in a loop.
    """
    why = """
        Recurrent networks and transformers are prone to exploding gradients: one bad batch
        produces a huge update and the loss turns into NaN. Clipping the gradient norm (typically
        to 0.5-1.0) is the standard safeguard and costs almost nothing.
    """
    example = """
        self.rnn = nn.LSTM(128, 256)
        ...
        loss.backward()
        optimizer.step()
    """
    fix_example = """
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
    """
    VALID = [
        # a short-sequence LSTM classifier (MNIST rows): clipping is optional there
        """
        import torch
        import torch.nn as nn
        class RNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(28, 128, batch_first=True)
                self.fc = nn.Linear(128, 10)
        model = RNN()
        for images, labels in train_loader:
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        """,
        # L-BFGS bounds its own steps with a line search
        """
        import torch
        import torch.nn as nn
        rnn = nn.RNN(1, 51)
        optimizer = torch.optim.LBFGS(rnn.parameters(), lr=0.8)
        for i in range(15):
            optimizer.step(closure)
        """,
        """
        import torch
        import torch.nn as nn
        model = nn.LSTM(10, 20)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x)[0], y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        """,
        # AMP: unscale then clip
        """
        import torch
        from torch import nn
        from torch.nn.utils import clip_grad_norm_
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8), 6)
        for batch in loader:
            opt.zero_grad()
            scaler.scale(enc(batch).sum()).backward()
            scaler.unscale_(opt)
            clip_grad_norm_(enc.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
        """,
        # no RNN in this file
        """
        import torch
        model = torch.nn.Linear(10, 2)
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        # an RNN but no training loop (inference only)
        """
        import torch
        rnn = torch.nn.GRU(8, 16)
        with torch.no_grad():
            for x in data:
                out, h = rnn(x)
        """,
        # clipping configured through a variable/option
        """
        import torch
        model = torch.nn.LSTM(4, 4)
        for batch in loader:
            opt.zero_grad()
            model(batch)[0].sum().backward()
            accelerator.clip_grad_value_(model.parameters(), cfg.grad_clip)
            opt.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.LSTM(10, 20, batch_first=True)
                    self.head = nn.Linear(20, vocab_size)
            model = Net()
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=14, message="nn.LSTM",
        ),
        Invalid(
            """
            from torch import nn
            attn = nn.MultiheadAttention(64, 4)
            head = nn.Linear(64, vocab_size)
            for epoch in range(3):
                for x in loader:
                    opt.zero_grad()
                    attn(x, x, x)[0].sum().backward()
                    opt.step()
                    opt.step()
            """,
            line=9, message="nn.MultiheadAttention",
        ),
        # backward in a loop, optimizer stepped elsewhere
        Invalid(
            """
            import torch
            rnn = torch.nn.RNN(8, 8)
            for x in loader:
                rnn(x)[0].sum().backward()
            """,
            line=5, message="nn.RNN",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.built: dict[str, str] = {}  # feature -> what was built ("nn.RNN", "nn.Transformer")
        self.project_classes: set[str] = set()  # model classes of this repository built here
        self.vocab_output = False
        self.first_step: Optional[cst.Call] = None
        self.first_backward: Optional[cst.Call] = None

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name in _RNN_CLASSES or name == "Linear":
            qualified = ctx.call_name(node) or ""
            if qualified.startswith("torch.nn."):
                if name == "Linear":
                    positional = positional_args(node)
                    out = keyword_arg(node, "out_features")
                    size = out.value if out is not None else (positional[1].value if len(positional) > 1 else None)
                    self.vocab_output |= any(w in (dotted_name(size) or "").lower() for w in _VOCABULARY_WORDS)
                else:
                    feature = "vanilla-rnn" if name in ("RNN", "RNNCell") else \
                        "transformer" if name not in ("LSTM", "GRU", "LSTMCell", "GRUCell") else "recurrent"
                    self.built.setdefault(feature, f"nn.{name}")
            return
        if name is not None and name[:1].isupper() and isinstance(node.func, (cst.Name, cst.Attribute)):
            qualified = ctx.call_name(node)
            if not is_library(qualified):
                self.project_classes.add(dotted_name(node.func) or name)
            return
        if name == "step":
            if self.first_step is None and ctx.loops and loop_stack(ctx) and _optimizer_step(node, ctx):
                self.first_step = node
        elif name in BACKWARD_METHODS:
            if self.first_backward is None and ctx.loops and loop_stack(ctx):
                self.first_backward = node

    def end_file(self, ctx: FileContext) -> None:
        target = self.first_step or self.first_backward
        if target is None:
            return
        source = ctx.source.lower()
        if any(hint in source for hint in _CLIP_HINTS) or "lbfgs" in source:
            return  # clipped already; or L-BFGS, whose line search bounds its own steps
        built = dict(self.built)
        vocab_output = self.vocab_output
        facts = ctx.facts(ModuleFacts)
        for cls in sorted(self.project_classes):  # the model may be defined in model.py beside this script
            features = facts.features(cls) or set()
            for feature in ("vanilla-rnn", "transformer", "recurrent"):
                if feature in features:
                    built.setdefault(feature, cls)
            vocab_output |= "vocab-output" in features
        # Exploding gradients are a real risk for vanilla RNNs, transformers and recurrent language models
        # (long sequences, one logit per token); a short-sequence LSTM/GRU classifier rarely needs clipping.
        if "vanilla-rnn" in built:
            what, kind = built["vanilla-rnn"], "a vanilla RNN"
        elif "transformer" in built and vocab_output:
            what, kind = built["transformer"], "a transformer language or translation model"
        elif "recurrent" in built and vocab_output:
            what, kind = built["recurrent"], "a recurrent language model"
        else:
            return
        self.report(target, (f"this file trains {kind} ({code_span(what)}) but never clips gradients: vanilla RNNs, "
                             f"recurrent language models and transformers are prone to exploding gradients; call "
                             f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) before the optimizer step"))


_VOCABULARY_WORDS = ("vocab", "ntoken", "n_token", "num_token")


# ---------------------------------------------------------------------------------------------
# TR104


class LossAccumulatedWithGraph(Rule):
    id = "TR104"
    slug = "loss-accumulated-with-graph"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = "loss tensor accumulated across iterations without .item()/.detach()"
    what = """
        Flags `total += loss`, `total = total + loss` and `losses.append(loss)` inside a loop when
        `loss` is a tensor still attached to the autograd graph (the result of a criterion, of an
        `F.*` loss, of the model, or `.mean()`/`.sum()` of those) and the accumulator outlives
        the iteration. Not flagged: `.item()`, `.detach()`, `float(loss)`, `loss.data`, code under
        `torch.no_grad()`, totals that are backpropagated or returned, and multi-term losses
        built from a fresh variable in the same iteration.
    """
    why = """
        Each accumulated loss keeps a reference to its whole computation graph, including all
        saved activations of that forward pass. Memory grows with every iteration until the
        epoch ends or the process runs out of GPU memory - the classic "memory leak" in PyTorch
        training loops.
    """
    example = """
        total_loss = 0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            total_loss += loss
    """
    fix_example = """
        total_loss = 0.0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            total_loss += loss.item()
    """
    VALID = [
        """
        import torch
        total = 0.0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            total += loss.item()
        """,
        """
        import torch
        losses = []
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            losses.append(loss.detach())
            running = running + float(loss)
            history.append(loss.detach().cpu())
            total = total + loss.data
        """,
        # under no_grad
        """
        import torch
        @torch.no_grad()
        def evaluate(model, loader):
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                total += loss
            return total / len(loader)
        with torch.no_grad():
            for x, y in val_loader:
                val_loss = criterion(model(x), y)
                val_total += val_loss
        """,
        # accumulating on purpose, then backpropagating the total
        """
        import torch
        import torch.nn.functional as F
        total_loss = 0
        for pred, target in zip(preds, targets):
            l = F.mse_loss(pred, target)
            total_loss = total_loss + l
        total_loss.backward()
        """,
        """
        import torch
        for batch in loader:
            losses = []
            for head in heads:
                loss = criterion(head(batch), batch.y)
                losses.append(loss)
            torch.stack(losses).sum().backward()
        """,
        # multi-term loss: the accumulator is rebuilt in each iteration
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            reg_loss = l2_criterion(model)
            loss += 0.1 * reg_loss
            loss.backward()
        """,
        # a helper returning the summed loss
        """
        import torch
        def multi_loss(outputs, targets):
            total = 0
            for out, t in zip(outputs, targets):
                part = criterion(out, t)
                total += part
            return total
        """,
        # floats from a helper: not known to be tensors
        """
        import torch
        epoch_loss = 0
        for batch in loader:
            loss = train_step(batch)
            epoch_loss += loss
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            total_loss = 0
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss
            print(total_loss / len(loader))
            """,
            line=9, message="total_loss += loss",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            def train(model, loader, opt):
                losses = []
                for x, y in loader:
                    opt.zero_grad()
                    loss = F.cross_entropy(model(x), y).mean()
                    loss.backward()
                    opt.step()
                    losses.append(loss)
                return sum(l.item() for l in losses)
            """,
            line=11, message="losses.append(loss)",
        ),
        Invalid(
            """
            import torch
            running = 0
            for epoch in range(3):
                for batch in loader:
                    outputs = model(**batch)
                    loss = outputs.loss
                    loss.backward()
                    running = running + loss * batch["x"].size(0)
            """,
            line=9, message="running",
        ),
        Invalid(
            """
            import torch
            class Trainer:
                def train_epoch(self):
                    self.epoch_loss = 0
                    for x, y in self.loader:
                        loss = self.criterion(self.model(x), y)
                        self.scaler.scale(loss).backward()
                        self.epoch_loss += loss
            """,
            line=9, message="self.epoch_loss += loss",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        # node, accumulator, loss name, (message template, accumulator target), function
        self.candidates: list[tuple[cst.CSTNode, str, str, tuple, object]] = []
        self.backward_names: dict[int, set] = {}
        self.returned_names: dict[int, set] = {}

    def _check(self, node: cst.CSTNode, acc_expr: cst.BaseExpression, value: cst.BaseExpression,
               shown: str, ctx: FileContext) -> None:
        stack = loop_stack(ctx)
        if not stack:
            return
        loss_expr = _loss_operand(value)
        if loss_expr is None:
            return
        base = acc_expr
        while isinstance(base, cst.Subscript):
            base = base.value
        acc = dotted_name(base)
        if acc is None:
            return
        kind = _expr_kind(loss_expr, ctx)
        loss_name = dotted_name(loss_expr) or "loss"
        if kind is None or kind == "model" and "loss" not in last_segment(loss_name).lower():
            return
        binding = ctx.binding(acc)
        if binding is not None and binding.kind != "param" and ctx.inside(binding.node, stack[-1]):
            return  # rebuilt in this iteration (multi-term loss, per-iteration list)
        if ctx.in_no_grad():
            return
        self.candidates.append((node, acc, loss_name, (shown, acc_expr), ctx.function))

    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        if isinstance(node.operator, cst.AddAssign) and ctx.loops:
            self._check(node, node.target, node.value, "{acc} += {loss}", ctx)

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        if not ctx.loops or len(node.targets) != 1 or not isinstance(node.value, cst.BinaryOperation):
            return
        value = node.value
        if not isinstance(value.operator, cst.Add):
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        if dotted_name(value.left) == target:
            self._check(node, node.targets[0].target, value.right, "{acc} = {acc} + {loss}", ctx)
        elif dotted_name(value.right) == target:
            self._check(node, node.targets[0].target, value.left, "{acc} = {loss} + {acc}", ctx)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name == "append":
            if ctx.loops and len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
                receiver = call_receiver(node)
                if receiver is not None:
                    self._check(node, receiver, node.args[0].value, "{acc}.append({loss})", ctx)
        elif name in BACKWARD_METHODS or name == "grad" and ctx.call_name(node) == "torch.autograd.grad":
            names = self.backward_names.setdefault(id(ctx.function), set())
            receiver = call_receiver(node)
            if receiver is not None:
                names.update(_names_used(receiver, ctx))
            for arg in node.args:
                names.update(_names_used(arg.value, ctx))

    def visit_Return(self, node: cst.Return, ctx: FileContext) -> None:
        if node.value is not None:
            names = self.returned_names.setdefault(id(ctx.function), set())
            _returned_tensors(node.value, ctx, names, 0)

    def end_file(self, ctx: FileContext) -> None:
        for node, acc, loss_name, (template, acc_expr), fn in self.candidates:
            if acc in self.backward_names.get(id(fn), ()) or acc in self.returned_names.get(id(fn), ()):
                continue
            target = dotted_name(acc_expr) or ctx.module.code_for_node(acc_expr)  # reporting: render once
            shown = template.format(acc=target, loss=loss_name)
            self.report(node, (f"{shown} keeps the autograd graph of every iteration alive ({loss_name} is never "
                               f"detached): memory grows each step; accumulate {loss_name}.item() "
                               f"or {loss_name}.detach() instead"))


def _returned_tensors(expr: cst.BaseExpression, ctx: FileContext, out: set, depth: int) -> None:
    """Names whose tensor value a ``return`` hands back as is (``total``, ``total / n``, ``sum(losses)``)."""
    if depth > 3:
        return
    if isinstance(expr, (cst.Name, cst.Attribute)):
        name = dotted_name(expr)
        if name is None:
            return
        out.add(name)
        value = ctx.assigned_value(name)
        if value is not None and not isinstance(value, cst.AugAssign) and value is not expr:
            _returned_tensors(value, ctx, out, depth + 1)
    elif isinstance(expr, (cst.Tuple, cst.List)):
        for element in expr.elements:
            _returned_tensors(element.value, ctx, out, depth + 1)
    elif isinstance(expr, cst.Dict):
        for element in expr.elements:
            if isinstance(element, cst.DictElement):
                _returned_tensors(element.value, ctx, out, depth + 1)
    elif isinstance(expr, cst.BinaryOperation):
        _returned_tensors(expr.left, ctx, out, depth + 1)
        _returned_tensors(expr.right, ctx, out, depth + 1)
    elif isinstance(expr, cst.Call):
        name = method_name(expr)
        receiver = call_receiver(expr)
        if receiver is not None and name in ("mean", "sum", "float"):
            _returned_tensors(receiver, ctx, out, depth + 1)
        elif name in ("sum", "stack", "cat", "mean"):
            for arg in expr.args:
                _returned_tensors(arg.value, ctx, out, depth + 1)


def _loss_operand(value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The loss-like name in ``loss`` / ``loss * n`` / ``n * loss`` (bare names only)."""
    if isinstance(value, (cst.Name, cst.Attribute)):
        return value
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
        for side in (value.left, value.right):
            if isinstance(side, (cst.Name, cst.Attribute)) and "loss" in last_segment(dotted_name(side)).lower():
                return side
    return None


# ---------------------------------------------------------------------------------------------
# TR105


class PerStepSyncForLogging(Rule):
    id = "TR105"
    slug = "per-step-sync-for-logging"
    category = Category.TRAINING
    severity = Severity.LOW
    requires = "torch"
    summary = "loss.item()/print(loss) every training step only for logging forces a GPU sync"
    what = """
        Flags `loss.item()`, `loss.cpu()`, `loss.numpy()` or printing the loss tensor in every
        iteration of a training loop (a loop that calls `.backward()`), when the value only goes
        to `print`, a logger, `tqdm.set_postfix`, `wandb.log`, `writer.add_scalar` or a list, and
        the call is not behind an `if step % N == 0:`-style guard.
    """
    why = """
        Reading a CUDA tensor on the host waits for every queued kernel to finish, so the CPU
        cannot run ahead and queue the next step. Doing it every iteration can cost a noticeable
        share of throughput for small and medium models. Logging every N steps, or accumulating
        on the device and reading once, avoids the stall.
    """
    example = """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: {loss.item():.4f}")
    """
    fix_example = """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % log_every == 0:
                print(f"step {step}: {loss.item():.4f}")
    """
    VALID = [
        # the step already reads a value on the host every iteration: one more read changes nothing
        """
        import torch
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
            print(loss.item())
        """,
        # nothing in the file uses a GPU
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(loss.item())
        """,
        # behind a logging-interval guard
        """
        import torch
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(loss.item())
                wandb.log({"loss": loss.item()})
        """,
        # feeds control flow
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            if loss.item() < best:
                best = loss.item()
            total += loss.item()
        """,
        # per-epoch logging after the batch loop
        """
        import torch
        for epoch in range(10):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
            print(f"epoch {epoch} loss {loss.item():.3f}")
        """,
        # not a training loop
        """
        import torch
        with torch.no_grad():
            for x, y in loader:
                loss = criterion(model(x), y)
                print(loss.item())
        """,
        # printing a float
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            loss_value = loss.item()
            print(loss_value)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(f"step {step}: {loss.item():.4f}")
            """,
            line=8, message="loss.item()",
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            from tqdm import tqdm
            pbar = tqdm(loader)
            for x, y in pbar:
                loss = criterion(model(x), y)
                loss.backward()
                pbar.set_postfix(loss=loss.item())
                writer.add_scalar("loss", loss.detach().cpu().numpy(), step)
            """,
            line=9, message="set_postfix", count=2,
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            for batch in loader:
                loss = criterion(model(batch.x), batch.y)
                loss.backward()
                print("loss", loss)
            """,
            line=7, message="print",
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            def train(model, loader):
                history = []
                for x, y in loader:
                    loss = model(x, y).mean()
                    scaler.scale(loss).backward()
                    history.append(loss.item())
                    if is_main_process:
                        logger.info("loss %.4f", loss.item())
            """,
            line=9, message="history", count=2,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.events: list[tuple[cst.CSTNode, int, int, str]] = []  # node, id(loop), id(sink call), message
        self.backward_loops: set = set()
        # every unguarded host read in each loop (``acc.item()`` too): one more changes nothing when
        # the step already waits for the GPU elsewhere
        self.syncs: dict[int, set[int]] = {}

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None or not ctx.loops:
            return
        if name in BACKWARD_METHODS:
            stack = loop_stack(ctx)
            if stack:
                self.backward_loops.add(id(stack[-1]))
            return
        if name in _SYNC_METHODS:
            stack = loop_stack(ctx)
            parent = ctx.parent(node)
            chained = isinstance(parent, cst.Attribute) and parent.attr.value in _SYNC_METHODS  # x.cpu().numpy()
            if stack and call_receiver(node) is not None and not node.args and not chained and \
                    not _guard_between(node, stack[-1], ctx):
                self.syncs.setdefault(id(stack[-1]), set()).add(id(node))
            if not _in_lightning(ctx):
                self._sync_call(node, name, ctx)
        elif name in _LOG_SINKS and name != "append":
            receiver = call_receiver(node)
            if not (receiver is not None and dotted_name(receiver) in _MATH_MODULES) and not _in_lightning(ctx):
                self._printed_tensor(node, name, ctx)

    def _sync_call(self, node: cst.Call, name: str, ctx: FileContext) -> None:
        receiver = call_receiver(node)
        if receiver is None or node.args:
            return
        parent = ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr.value in _SYNC_METHODS:
            return  # the outer call of ``loss.detach().cpu().numpy()`` reports
        root = receiver
        while isinstance(root, cst.Call) and call_receiver(root) is not None and \
                method_name(root) in ("detach", "cpu", "float", "double", "mean", "sum", "clone"):
            root = call_receiver(root)
        if isinstance(root, cst.Attribute) and root.attr.value == "data":
            root = root.value
        root_name = dotted_name(root)
        if root_name is None or "loss" not in last_segment(root_name).lower():
            return
        stack = loop_stack(ctx)
        if not stack:
            return
        found = _sink_of(node, ctx)
        if found is None or _guard_between(node, stack[-1], ctx):
            return
        sink, sink_node = found
        shown = f"{root_name}.{name}()"
        self.events.append((node, id(stack[-1]), id(sink_node), (
            f"{shown} runs every training step only to be logged via {sink}(): each call blocks until the GPU "
            f"catches up; log every N steps (e.g. `if step % log_every == 0:`) or accumulate on the device")))

    def _printed_tensor(self, node: cst.Call, name: str, ctx: FileContext) -> None:
        for arg in node.args:
            value = arg.value
            exprs = [value]
            if isinstance(value, cst.FormattedString):
                exprs = [part.expression for part in value.parts if isinstance(part, cst.FormattedStringExpression)]
            for expr in exprs:
                if not isinstance(expr, (cst.Name, cst.Attribute)):
                    continue
                shown = dotted_name(expr)
                if shown is None or "loss" not in last_segment(shown).lower() or _expr_kind(expr, ctx) is None:
                    continue
                stack = loop_stack(ctx)
                if not stack or _guard_between(node, stack[-1], ctx):
                    return
                self.events.append((expr, id(stack[-1]), id(node), (
                    f"`{name}()` of the {named('tensor', shown)} every training step converts it on the host and "
                    f"forces a GPU sync each iteration; log every N steps, and log {code_span(shown + '.item()')} "
                    f"rather than the tensor")))
                return

    def end_file(self, ctx: FileContext) -> None:
        if "cuda" not in ctx.source and "device" not in ctx.source:
            return  # nothing here runs on a GPU: reading a CPU tensor waits for nothing
        flagged = {id(node) for node, _, _, _ in self.events}
        reported: set = set()
        for node, loop, sink, message in self.events:
            if self.syncs.get(loop, set()) - flagged:
                continue  # the step already syncs elsewhere (``acc.item()``, ``epoch_loss += loss.item()``)
            if loop in self.backward_loops and sink not in reported:
                reported.add(sink)  # one finding per logging call, however many values it reads
                self.report(node, message)


def _sink_of(node: cst.CSTNode, ctx: FileContext) -> Optional[tuple[str, cst.Call]]:
    """The logging call that consumes ``node``'s value within its statement, if any."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.Call):
            name = method_name(ancestor)
            if name in _LOG_SINKS:
                receiver = call_receiver(ancestor)
                if name == "log" and receiver is not None and dotted_name(receiver) in _MATH_MODULES:
                    return None  # ``math.log(loss.item())`` computes, it does not log
                return dotted_name(ancestor.func) or name, ancestor
        elif isinstance(ancestor, (cst.Comparison, cst.BooleanOperation, cst.IfExp)):
            return None
        elif isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return None
    return None


# ---------------------------------------------------------------------------------------------
# TR115

_TIMERS = {"time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.time_ns",
           "time.perf_counter_ns", "timeit.default_timer"}
_COLLECTIVE_NAMES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "all_reduce_coalesced")
_COLLECTIVES = {f"torch.distributed.{name}" for name in _COLLECTIVE_NAMES}
# Streams and events: code that overlaps copies with compute may need the synchronize for correctness.
_STREAMS = re.compile(r"Stream\s*\(|\.stream\s*\(|Event\s*\(|record_stream|wait_stream|non_blocking\s*=\s*True\)\.cpu|"
                      r"to\([^)]*cpu[^)]*non_blocking")
# Where a reduced value may go when it is only reported: a logger, a progress bar, a meter, a list.
_REPORTING = _LOG_SINKS | {"update", "add_scalar", "item"}


def _every_iteration(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext) -> bool:
    """``node`` runs on every pass of ``loop``: no ``if`` body between them (an ``if``'s test always runs)."""
    below = node
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return True
        if isinstance(ancestor, (cst.If, cst.IfExp)) and below is not ancestor.test and \
                not (isinstance(ancestor, cst.If) and _is_rank_test(ancestor.test)):
            return False
        below = ancestor
    return True


@dataclass
class _SyncCandidate:
    node: cst.Call
    loop: cst.CSTNode
    kind: str  # "synchronize" | "collective" | "helper"
    reduced: Optional[str]  # the name that holds the reduced value (collectives)
    helper: Optional[str]  # the same-file function called (helpers)


class PerStepSynchronizeForLogging(Rule):
    id = "TR115"
    slug = "per-step-synchronize-for-logging"
    category = Category.TRAINING
    severity = Severity.LOW
    requires = "torch"
    summary = "torch.cuda.synchronize() / an all_reduce of the loss every training step only to time or log it"
    source_hint = re.compile(r"synchronize\s*\(|all_reduce|all_gather|\breduce\s*\(")
    what = """
        Flags, in a training loop (a loop that calls `.backward()`) and not behind an
        `if step % N == 0:`-style guard:
        - `torch.cuda.synchronize()` followed in the same iteration by a timer read
          (`time.time()`, `time.perf_counter()`...) or a logging call, when nothing else in the
          step reads a value on the host (a step that calls `loss.item()` already waits for the
          GPU, so one more wait costs nothing; TR105 covers that read);
        - `dist.all_reduce` / `all_gather` (or a helper of the same file that calls one) of the
          loss, when the reduced value is only logged, put in a meter, or appended.
        Files that use CUDA streams or events are left alone: there a synchronize may order work.
    """
    why = """
        `torch.cuda.synchronize()` blocks the CPU until every queued kernel has finished, so the
        next step cannot be queued while this one runs; a collective on every step adds a
        round trip across all ranks (and, with `.item()`, a host read). Doing either on every
        iteration only for a log line or a step timer costs throughput for small and medium
        models. Synchronize and reduce on the steps you log, or accumulate on the device and
        reduce once per logging interval.
    """
    example = """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            step_times.append(time.time() - start)
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            meter.update(reduced.item() / world_size)
    """
    fix_example = """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % log_every == 0:
                torch.cuda.synchronize()
                step_times.append(time.time() - start)
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                meter.update(reduced.item() / world_size)
    """
    VALID = [
        # the step already waits for the GPU (loss.item() for a NaN check): the synchronize adds nothing
        """
        import math, time
        import torch
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            if not math.isfinite(loss.item()):
                raise SystemExit(1)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            print(f"step took {time.time() - start:.3f}s")
        """,
        # behind a logging-interval guard or an opt-in flag
        """
        import time
        import torch
        import torch.distributed as dist
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if args.synchronize_step:
                torch.cuda.synchronize()
            t = time.time()
            if step % 50 == 0:
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                print(reduced.item())
        """,
        # gradients reduced by hand (that is training, not logging); a reduced loss that drives early stopping
        """
        import torch
        import torch.distributed as dist
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            optimizer.step()
            total_loss = loss.detach().clone()
            dist.all_reduce(total_loss)
            if total_loss < best:
                break
        """,
        # CUDA streams: the synchronize may order work
        """
        import time
        import torch
        copy_stream = torch.cuda.Stream()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            torch.cuda.synchronize()
            print(time.time())
        """,
        # a throughput benchmark: each pass runs forward and backward once to be timed, nothing is trained
        """
        import time
        import torch
        for width in (256, 512, 1024):
            net = make_mlp(width).cuda()
            batch = torch.randn(64, width, device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            net(batch).sum().backward()
            torch.cuda.synchronize()
            timings[width] = time.perf_counter() - t0
        """,
        # not a training loop
        """
        import time
        import torch
        with torch.no_grad():
            for x in loader:
                model(x)
                torch.cuda.synchronize()
                print(time.time())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import time
            import torch
            for i, (images, target) in enumerate(train_loader):
                output = model(images.cuda(non_blocking=True))
                loss = criterion(output, target.cuda(non_blocking=True))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                batch_time.update(time.time() - end)
                end = time.time()
            """,
            line=10, message="`torch.cuda.synchronize()` every training step",
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            def reduce_tensor(tensor, world_size):
                rt = tensor.clone()
                dist.all_reduce(rt, op=dist.ReduceOp.SUM)
                return rt / world_size
            def train_one_epoch(model, loader, optimizer, world_size):
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    reduced_loss = reduce_tensor(loss.data, world_size)
                    losses.update(reduced_loss.item(), x.size(0))
            """,
            line=13, message="`reduce_tensor(loss.data, world_size)`",
        ),
        Invalid(
            """
            import torch.distributed as dist
            while step < max_steps:
                loss = model(next(it)).mean()
                loss.backward()
                opt.step()
                log_loss = loss.detach()
                dist.all_reduce(log_loss)
                wandb.log({"loss": log_loss.item() / dist.get_world_size()})
                step += 1
            """,
            line=8, message="all-reduces `log_loss`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[_SyncCandidate] = []
        self.backward_loops: set[int] = set()
        self.host_reads: dict[int, int] = {}  # id(loop) -> unguarded ``.item()`` / ``.cpu()``... in it
        self.helpers: set[str] = set()  # functions of this file that run a collective
        self.step_loops: set[int] = set()  # loops that step an optimizer (``opt.step()``, ``scaler.step(opt)``)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else None
        # only these names can be a synchronize or a collective: the others skip the name resolution
        qualified = ctx.call_name(node) if last in _COLLECTIVE_NAMES or last == "synchronize" else None
        if qualified in _COLLECTIVES and isinstance(ctx.function, cst.FunctionDef):
            self.helpers.add(ctx.function.name.value)
        if not ctx.loops:
            return
        name = method_name(node)
        if name == "step" and isinstance(func, cst.Attribute):
            self.step_loops.update(id(loop) for loop in loop_stack(ctx))
            return
        if qualified is None and name not in BACKWARD_METHODS and name not in _SYNC_METHODS and \
                not (isinstance(func, cst.Name) and node.args):
            return  # nothing this rule looks at: skip the loop bookkeeping
        stack = loop_stack(ctx)
        if not stack:
            return
        loop = stack[-1]
        if name in BACKWARD_METHODS:
            self.backward_loops.add(id(loop))
            return
        if name in _SYNC_METHODS and not node.args and call_receiver(node) is not None and \
                _every_iteration(node, loop, ctx):
            self.host_reads[id(loop)] = self.host_reads.get(id(loop), 0) + 1
            return
        if qualified == "torch.cuda.synchronize":
            kind, reduced, helper = "synchronize", None, None
        elif qualified in _COLLECTIVES:
            kind, reduced, helper = "collective", self._loss_name(node), None
            if reduced is None:
                return
        elif isinstance(node.func, cst.Name) and node.args and self._loss_name(node) is not None:
            target = self._assigned_to(node, ctx)
            if target is None:
                return
            kind, reduced, helper = "helper", target, node.func.value
        else:
            return
        if _guard_between(node, loop, ctx) or _in_lightning(ctx):
            return
        self.candidates.append(_SyncCandidate(node, loop, kind, reduced, helper))

    @staticmethod
    def _loss_name(call: cst.Call) -> Optional[str]:
        """The loss in ``all_reduce(loss_copy)`` / ``helper(loss.data)``: a name (or attribute) mentioning loss."""
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if first is None:
            return None
        expr = first
        while True:
            if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args and \
                    expr.func.attr.value in ("detach", "clone", "float", "mean"):
                expr = expr.func.value
            elif isinstance(expr, cst.Attribute) and expr.attr.value == "data":
                expr = expr.value
            else:
                break
        name = dotted_name(expr)
        if name is None or "loss" not in name.rsplit(".", 1)[-1].lower():
            return None
        return dotted_name(first) or name

    @staticmethod
    def _assigned_to(call: cst.Call, ctx: FileContext) -> Optional[str]:
        parent = ctx.parent(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return dotted_name(parent.targets[0].target)
        return None

    def end_file(self, ctx: FileContext) -> None:
        if _STREAMS.search(ctx.source):
            return
        for candidate in self.candidates:
            loop = candidate.loop
            if id(loop) not in self.backward_loops:
                continue
            if candidate.kind == "synchronize":
                if self.host_reads.get(id(loop)) or not self._then_timed_or_logged(candidate.node, ctx):
                    continue
                if id(loop) not in self.step_loops:
                    continue  # a backward with no optimizer step: a benchmark timing each pass, not training
                self.report(candidate.node, (
                    "`torch.cuda.synchronize()` every training step, only to time or log it: the CPU waits for the "
                    "GPU to finish each step before it can queue the next one; synchronize only on the steps you log "
                    "(inside `if step % log_every == 0:`)"))
            elif candidate.kind == "helper" and candidate.helper not in self.helpers:
                continue
            elif candidate.reduced is not None and self._only_reported(candidate, ctx):
                shown = code_span(short(ctx, candidate.node))
                what = f"all-reduces `{candidate.reduced}`" if candidate.kind == "collective" else \
                    f"runs a collective (in `{candidate.helper}`) for `{candidate.reduced}`"
                self.report(candidate.node, (
                    f"{shown} {what} on every training step although the result is only logged: each call is a "
                    f"round trip across all ranks (and its `.item()` a wait for the GPU); reduce on the steps you "
                    f"log, or accumulate the loss on the device and reduce once per logging interval"))

    @staticmethod
    def _then_timed_or_logged(node: cst.Call, ctx: FileContext) -> bool:
        """A later statement of the same block reads a timer or logs."""
        statement = ctx.statement_of(node)
        line = ctx.parent(statement)
        block = ctx.parent(line) if isinstance(line, cst.SimpleStatementLine) else None
        body = getattr(block, "body", None)
        if not isinstance(body, (list, tuple)) or line not in body:
            return False
        for later in body[body.index(line) + 1:]:
            for inner in subtree(later):
                if isinstance(inner, cst.Call) and (ctx.call_name(inner) in _TIMERS or
                                                    method_name(inner) in _LOG_SINKS):
                    return True
        return False

    @staticmethod
    def _only_reported(candidate: _SyncCandidate, ctx: FileContext) -> bool:
        """Every later read of the reduced value in the loop goes to a logger / meter / list, and one does."""
        reduced = candidate.reduced
        statement = ctx.statement_of(candidate.node)
        after = False
        reported = False
        for node in subtree(candidate.loop):
            if node is statement:
                after = True
                continue
            if not after or not isinstance(node, (cst.Name, cst.Attribute)) or dotted_name(node) != reduced:
                continue
            for ancestor in ctx.ancestors(node):
                if isinstance(ancestor, (cst.If, cst.While, cst.Comparison, cst.Return, cst.IfExp)):
                    return False  # control flow: the value is needed on every step
                if isinstance(ancestor, cst.Call) and method_name(ancestor) in _REPORTING and \
                        ancestor is not candidate.node:
                    if method_name(ancestor) != "item":
                        reported = True
                        break
                if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                    break
        return reported


# ---------------------------------------------------------------------------------------------
# TR106


_OOM_ERRORS = {"RuntimeError", "OutOfMemoryError", "MemoryError"}


def _recovers_from_oom(loop: cst.CSTNode) -> bool:
    """The loop catches out-of-memory errors: it retries with less (a smaller batch) after emptying the cache."""
    for node in subtree(loop):
        if isinstance(node, cst.ExceptHandler) and node.type is not None:
            names = {dotted_name(e.value if isinstance(e, cst.Element) else e).rsplit(".", 1)[-1]
                     for e in (node.type.elements if isinstance(node.type, cst.Tuple) else [node.type])
                     if dotted_name(e.value if isinstance(e, cst.Element) else e)}
            if names & _OOM_ERRORS:
                return True
    return False


class EmptyCacheInLoop(Rule):
    id = "TR106"
    slug = "empty-cache-in-loop"
    category = Category.TRAINING
    severity = Severity.LOW
    requires = "torch"
    summary = "torch.cuda.empty_cache() called on every loop iteration"
    what = """
        Flags `torch.cuda.empty_cache()` inside a loop body, unless it runs only in an `except`
        handler (out-of-memory recovery) or behind an `if`.
    """
    why = """
        `empty_cache` returns the caching allocator's free blocks to the driver. It does not free
        memory that tensors still use, and the next iteration must get the memory back with
        slow `cudaMalloc` calls and a device synchronization. Calling it every step slows
        training and hides the real cause of memory growth (usually a kept reference).
    """
    example = """
        for x, y in loader:
            train_step(x, y)
            torch.cuda.empty_cache()
    """
    fix_example = """
        for x, y in loader:
            train_step(x, y)
        torch.cuda.empty_cache()  # once, if memory must be handed back at all
    """
    VALID = [
        # an out-of-memory back-off loop
        """
        import torch
        batch_size = 256
        while batch_size > 1:
            try:
                run(batch_size)
                break
            except RuntimeError:
                torch.cuda.empty_cache()
                batch_size //= 2
        """,
        # a profiler taking clean per-op memory readings
        """
        import torch
        def profile(ops, x):
            for op in ops:
                torch.cuda.empty_cache()
                op(x)
        """,
        """
        import torch
        for x, y in loader:
            train_step(x, y)
        torch.cuda.empty_cache()
        """,
        # OOM recovery
        """
        import torch
        for batch in loader:
            try:
                train_step(batch)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        """,
        # occasional
        """
        import torch
        for step, batch in enumerate(loader):
            train_step(batch)
            if step % 1000 == 0:
                torch.cuda.empty_cache()
        """,
        # something else's empty_cache
        """
        import torch
        for item in items:
            cache.empty_cache()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                train_step(x, y)
                torch.cuda.empty_cache()
            """,
            line=5, message="torch.cuda.empty_cache()",
        ),
        Invalid(
            """
            from torch.cuda import empty_cache
            def run(loader):
                while True:
                    batch = next(loader)
                    step(batch)
                    empty_cache()
            """,
            line=7,
        ),
        Invalid(
            """
            import torch as th
            for epoch in range(10):
                for batch in loader:
                    step(batch)
                th.cuda.empty_cache()
            """,
            line=6,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) != "empty_cache" or not ctx.loops:
            return
        if ctx.call_name(node) not in ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"):
            return
        stack = loop_stack(ctx)
        if not stack or _guard_between(node, stack[-1], ctx, except_handlers=True):
            return
        if len(stack) > 1 and _guard_between(stack[-1], stack[0], ctx, except_handlers=True):
            return
        if _recovers_from_oom(stack[0]) or any(word in (fn.name.value.lower() if isinstance(fn, cst.FunctionDef)
                                                        else "") for fn in ctx.functions
                                               for word in ("profile", "benchmark", "measure")):
            return  # an out-of-memory back-off loop, or a profiler taking clean per-step memory readings
        self.report(node, ("torch.cuda.empty_cache() runs on every loop iteration: it frees no memory that tensors "
                           "still hold and forces slow re-allocation and a sync next iteration; call it once after "
                           "the loop, or find the reference that keeps memory alive"))


# ---------------------------------------------------------------------------------------------
# TR107


class BackwardOnNonScalar(Rule):
    id = "TR107"
    slug = "backward-on-non-scalar"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = ".backward() without a gradient on a non-scalar tensor"
    what = """
        Flags `.backward()` without a `gradient` argument on a tensor that is clearly not a
        scalar: a loss computed with `reduction='none'` (by a criterion object built with it or
        an `F.*` call passing it) that was not reduced afterwards, or the model's raw output.
    """
    why = """
        `backward()` without a gradient only works for a scalar; on anything else it raises
        "grad can be implicitly created only for scalar outputs" - or, once someone passes
        `torch.ones_like(...)` to silence it, backpropagates the sum, which scales the
        gradient with the batch size.
    """
    example = """
        criterion = nn.CrossEntropyLoss(reduction="none")
        loss = criterion(model(x), y)
        loss.backward()
    """
    fix_example = """
        criterion = nn.CrossEntropyLoss(reduction="none")
        loss = criterion(model(x), y)
        (loss * weights).mean().backward()
    """
    VALID = [
        """
        import torch
        import torch.nn as nn
        criterion = nn.CrossEntropyLoss(reduction="none")
        loss = criterion(model(x), y)
        loss.mean().backward()
        """,
        # a model that returns its own loss (DDP tests, HF-style models)
        """
        import torch
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        for _ in range(6):
            ddp_model().backward(create_graph=True)
        """,
        """
        import torch
        import torch.nn.functional as F
        loss = F.mse_loss(pred, target, reduction="none")
        loss = (loss * mask).sum() / mask.sum()
        loss.backward()
        """,
        """
        import torch
        import torch.nn.functional as F
        loss = F.cross_entropy(logits, y, reduction="none")
        loss.backward(torch.ones_like(loss))
        torch.autograd.backward(loss, grad_tensors=torch.ones_like(loss))
        """,
        """
        import torch
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        loss.backward()
        """,
        # the model computes and returns its loss
        """
        import torch
        loss = model(x, y)
        loss.backward()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss(reduction="none")
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            line=7, message="reduction='none'",
        ),
        Invalid(
            """
            import torch
            from torch.nn import functional as F
            loss = F.binary_cross_entropy_with_logits(logits, y, reduction='none') * weights
            loss.backward(retain_graph=True)
            """,
            line=5, message="loss.backward()",
        ),
        Invalid(
            """
            import torch
            out = model(x)
            out.backward()
            """,
            line=4, message="out",
        ),
        Invalid(
            """
            import torch
            from torch import nn
            class Trainer:
                def __init__(self):
                    self.criterion = nn.MSELoss(reduction="none")
                def step(self, x, y):
                    self.criterion(self.model(x), y).backward()
            """,
            line=8,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not is_plain_backward(node) or argument(node, 0, "gradient") is not None:
            return
        receiver = call_receiver(node)
        if receiver is None:
            return
        shown = dotted_name(receiver)
        value: Optional[cst.BaseExpression] = receiver
        if shown is not None:
            value = ctx.assigned_value(shown)
            if value is None or in_no_grad_block(ctx, ctx.binding(shown).node):
                return
        reason = _non_scalar_reason(value, ctx)
        if reason is None:
            return
        if reason == "model":
            # ``model(x).backward()`` is common for models that return their own loss: only a value
            # named like an output (out, logits, preds...) is clearly not a loss
            if shown is None or not _output_like(shown):
                return
            what = f"{shown or 'the output'} is the raw output of the model"
        else:
            what = f"{shown or 'the loss'} is a per-element loss computed with reduction='none'"
        target = shown or "the tensor"
        self.report(node, (f"{target}.backward() without a gradient argument, but {what} - not a scalar: backward "
                           f"raises 'grad can be implicitly created only for scalar outputs'; reduce it first "
                           f"(e.g. {target}.mean().backward())"))


def _output_like(name: str) -> bool:
    last = last_segment(name).lower()
    return last in _OUTPUT_NAMES or last.startswith(("out", "logit", "pred"))


def _reduction_none(call: cst.Call) -> bool:
    reduction = keyword_arg(call, "reduction")
    if reduction is not None and string_value(reduction.value) == "none":
        return True
    reduce = keyword_arg(call, "reduce")
    return reduce is not None and is_false(reduce.value)


def _non_scalar_reason(value: Optional[cst.BaseExpression], ctx: FileContext) -> Optional[str]:
    if isinstance(value, cst.BinaryOperation):
        for side in (value.left, value.right):
            if isinstance(side, cst.Call) and _non_scalar_reason(side, ctx) == "none":
                return "none"
        return None
    if not isinstance(value, cst.Call):
        return None
    qualified = ctx.qualified_name(value.func) or ""
    if qualified.startswith("torch.nn.functional.") and _reduction_none(value):
        return "none"
    origin = ctx.origin(value.func)
    if isinstance(origin, cst.Call):
        constructor = ctx.call_name(origin) or ""
        if constructor.startswith("torch.nn.") and constructor.endswith("Loss"):
            return "none" if _reduction_none(origin) else None
    if is_model_call(value.func, ctx) and not _is_criterion_call(value, ctx):
        return "model"
    return None


# ---------------------------------------------------------------------------------------------
# TR108


@dataclass
class _Helper:
    name: str
    params: list  # parameter names, ``self``/``cls`` dropped for methods
    is_method: bool
    targets: list  # dotted names put into eval mode (params resolved at the call site)
    node: cst.FunctionDef


class EvalWithoutTrainRestore(Rule):
    id = "TR108"
    source_hint = (re.compile(r"\.eval\s*\(|\.train\s*\("), re.compile(r"backward|\.step\s*\("))  # a helper that evals, called from a training loop
    slug = "eval-without-train-restore"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = "helper switches the model to eval() and the training loop never switches back"
    what = """
        Flags a call, inside a training loop (a loop that calls `.backward()` or steps an
        optimizer), to a function of the same file that puts a module into eval mode
        (`model.eval()` / `model.train(False)`) and never restores training mode, when the loop
        itself never calls `.train()` on each iteration.
    """
    why = """
        `eval()` is sticky. After the first validation, every later training step runs with
        dropout disabled and BatchNorm using (and no longer updating) its running statistics,
        so the model trains differently from what the code suggests - usually worse, and
        without any error.
    """
    example = """
        def validate(model):
            model.eval()
            ...
            return acc

        model.train()
        for epoch in range(epochs):
            for x, y in loader:
                ...
                loss.backward()
                optimizer.step()
            validate(model)
    """
    fix_example = """
        for epoch in range(epochs):
            model.train()
            for x, y in loader:
                ...
                loss.backward()
                optimizer.step()
            validate(model)
    """
    VALID = [
        # train() at the top of each epoch
        """
        import torch
        def validate(model, loader):
            model.eval()
            with torch.no_grad():
                return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader)
        for epoch in range(10):
            model.train()
            for x, y in train_loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
            validate(model, val_loader)
        """,
        # the helper restores the previous mode
        """
        import torch
        def evaluate(model, loader):
            was_training = model.training
            model.eval()
            acc = score(model, loader)
            model.train(was_training)
            return acc
        for epoch in range(10):
            for x, y in train_loader:
                criterion(model(x), y).backward()
                opt.step()
            evaluate(model, val_loader)
        """,
        # training happens in a helper that sets train() itself
        """
        import torch
        def train_one_epoch(model, loader, opt):
            model.train()
            for x, y in loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
        def validate(model):
            model.eval()
            return 0.0
        for epoch in range(10):
            train_one_epoch(model, loader, opt)
            validate(model)
        """,
        # trainer methods: train() called after validation inside the loop
        """
        import torch
        class Trainer:
            def validate(self):
                self.model.eval()
                return self.metric()
            def fit(self):
                for step, batch in enumerate(self.loader):
                    loss = self.model(batch).mean()
                    loss.backward()
                    self.optimizer.step()
                    if step % 100 == 0:
                        self.validate()
                        self.model.train()
        """,
        # the evaluated model is an EMA copy that is not trained in the loop
        """
        import torch
        def evaluate(model):
            model.eval()
            return 1.0
        for x, y in loader:
            criterion(model(x), y).backward()
            opt.step()
            ema.update(model)
            evaluate(ema_model)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def validate(model, loader):
                model.eval()
                correct = 0
                with torch.no_grad():
                    for x, y in loader:
                        correct += model(x).argmax(1).eq(y).sum().item()
                return correct
            model.train()
            for epoch in range(10):
                for x, y in train_loader:
                    opt.zero_grad()
                    criterion(model(x), y).backward()
                    opt.step()
                acc = validate(model, val_loader)
            """,
            line=16, message="validate()",
        ),
        # a trainer class with mid-epoch validation
        Invalid(
            """
            import torch
            class Trainer:
                def evaluate(self):
                    self.model.eval()
                    with torch.no_grad():
                        return self.metric(self.model)
                def fit(self):
                    self.model.train()
                    for epoch in range(self.epochs):
                        for step, (x, y) in enumerate(self.loader):
                            loss = self.criterion(self.model(x), y)
                            self.optimizer.zero_grad()
                            loss.backward()
                            self.optimizer.step()
                            if step % 500 == 0:
                                self.evaluate()
            """,
            line=17, message="self.model",
        ),
        # train(False) and a helper defined after its caller
        Invalid(
            """
            import torch
            def main(net, loader, optimizer):
                net.train()
                while True:
                    for x, y in loader:
                        loss = loss_fn(net(x), y)
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad()
                    test(net)
            def test(model):
                model.train(False)
                return 0
            """,
            line=11, message="net",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.helpers: dict[str, list[_Helper]] = {}
        self.evals: dict[int, list[str]] = {}  # id(FunctionDef) -> eval targets
        self.trainers_direct: set = set()  # function names that call .train()
        self.calls: dict[str, set] = {}
        # facts about calls inside loops: (call, name, loops, fn, used dotted names)
        self.loop_calls: list[tuple[cst.Call, str, LoopStack, object, frozenset]] = []
        self.training: list[tuple[LoopStack, object]] = []  # backward/step calls
        self.train_calls: list[tuple[LoopStack, object]] = []  # X.train() inside loops

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None:
            return
        fn_name = _fn_name(ctx)
        if fn_name is not None:
            self.calls.setdefault(fn_name, set()).add(name)
        receiver = call_receiver(node)
        mode_call = None
        if receiver is not None and name == "eval" and not node.args:
            mode_call = "eval"
        elif receiver is not None and name == "train":
            mode_call = "eval" if is_false(argument(node, 0, "mode")) else "train"
        if mode_call == "train":
            if fn_name is not None:
                self.trainers_direct.add(fn_name)
        elif mode_call == "eval" and ctx.function_def is not None:
            target = dotted_name(receiver)
            if target is not None:
                origin = ctx.origin(receiver)
                binding = ctx.binding(target)
                if origin is not receiver and isinstance(origin, (cst.Name, cst.Attribute)):
                    if binding is not None and binding.kind in ("assign", "annassign"):
                        target = dotted_name(origin) or target
                        binding = ctx.binding(target)
                root = target.split(".", 1)[0]
                local = ctx.scopes[-1].bindings.get(root)
                # a helper's own local (``for m in model.modules(): m.eval()``) is not the caller's model
                if local is None or local.kind == "param" or root in ("self", "cls"):
                    self.evals.setdefault(id(ctx.function_def), []).append(target)
        if not ctx.loops:
            return
        stack = loop_stack(ctx)
        if not stack:
            return
        if mode_call == "train":
            self.train_calls.append((stack, ctx.function))
        if name in BACKWARD_METHODS or name == "step" and _optimizer_step(node, ctx) is not None:
            self.training.append((stack, ctx.function))
        used = set()
        func_name = dotted_name(node.func)
        if func_name is not None:
            used.add(func_name)
        if receiver is not None:
            receiver_name = dotted_name(receiver)
            if receiver_name is not None:
                used.add(receiver_name)
        for arg in node.args:
            arg_name = dotted_name(arg.value)
            if arg_name is not None:
                used.add(arg_name)
        self.loop_calls.append((node, name, stack, ctx.function, frozenset(used)))

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        targets = self.evals.pop(id(node), None)
        if not targets:
            return
        params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        is_method = bool(ctx.classes) and ctx.parent(ctx.parent(node) or node) is ctx.classes[-1]
        if is_method and params and params[0] in ("self", "cls"):
            params = params[1:]
        kw = [p.name.value for p in node.params.kwonly_params]
        targets = [t for t in targets if t.split(".", 1)[0] not in ("self", "cls") or "." in t]
        if targets:
            self.helpers.setdefault(node.name.value, []).append(
                _Helper(node.name.value, params + kw, is_method, targets, node))

    def end_file(self, ctx: FileContext) -> None:
        if not self.helpers or not self.training:
            return
        trainers = _closure(self.trainers_direct, self.calls)
        self._by_loop: dict[int, list] = {}
        for entry in self.loop_calls:
            for lp in entry[2]:
                self._by_loop.setdefault(id(lp), []).append(entry)
        for call, name, stack, fn, _ in self.loop_calls:
            candidates = self.helpers.get(name)
            if not candidates or name in trainers:
                continue
            func = call.func
            is_method_call = isinstance(func, cst.Attribute) and dotted_name(func.value) in ("self", "cls")
            if not (isinstance(func, cst.Name) or is_method_call):
                continue
            helper = next((h for h in candidates if h.is_method == is_method_call), None)
            if helper is None:
                continue
            obj = self._evaluated_object(helper, call)
            if obj is None:
                continue
            if any(self._restored_in(loop, fn, trainers) for loop in stack):
                continue  # ``model.train()`` somewhere in an enclosing loop re-runs every iteration
            for loop in stack:
                if self._training_loop(loop, fn) and self._used_in(loop, fn, obj, call):
                    self.report(call, (
                        f"{name}() puts {obj} into eval mode ({obj}.eval()) and never switches it back, and this "
                        f"training loop keeps training {obj} after the call without calling {obj}.train(): every "
                        f"later step runs with dropout off and BatchNorm frozen; call {obj}.train() at the start "
                        f"of each iteration or restore the mode in {name}()"))
                    break

    @staticmethod
    def _evaluated_object(helper: _Helper, call: cst.Call) -> Optional[str]:
        for target in helper.targets:
            root, _, rest = target.partition(".")
            if root in helper.params:
                index = helper.params.index(root)
                arg = argument(call, index, root)
                name = dotted_name(arg) if arg is not None else None
                if name is not None:
                    return f"{name}.{rest}" if rest else name
                continue
            if root in ("self", "cls") and not helper.is_method:
                continue
            return target
        return None

    def _training_loop(self, loop, fn) -> bool:
        return any(f is fn and any(lp is loop for lp in stack) for stack, f in self.training)

    def _restored_in(self, loop, fn, trainers: set) -> bool:
        if any(f is fn and any(lp is loop for lp in stack) for stack, f in self.train_calls):
            return True
        return any(f is fn and name in trainers for _, name, _, f, _ in self._by_loop.get(id(loop), ()))

    def _used_in(self, loop, fn, obj: str, call: cst.Call) -> bool:
        return any(other is not call and f is fn and obj in used
                   for other, _, _, f, used in self._by_loop.get(id(loop), ()))


__all__ = [
    "MissingZeroGrad", "SchedulerStepBeforeOptimizer", "MissingGradClippingRNN", "LossAccumulatedWithGraph",
    "PerStepSyncForLogging", "EmptyCacheInLoop", "BackwardOnNonScalar", "EvalWithoutTrainRestore",
]
