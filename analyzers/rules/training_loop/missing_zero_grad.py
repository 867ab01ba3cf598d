"""TR101 missing-zero-grad: optimizer stepped in a loop but its gradients are never zeroed."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    call_receiver,
    dotted_name,
    iter_names,
    method_name)
from analyzers.markdown import code_span, named
from analyzers.program.loops import LoopStack, loop_stack
from analyzers.program.values import (BACKWARD_METHODS, is_optimizer)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import in_lightning_module
from analyzers.program.values import (is_loop_variable as _is_loop_variable, optimizer_keys as _keys, Step as _Step,
                                      optimizer_step as _optimizer_step)
from analyzers.program.loops import enclosing_function_name as _fn_name, closure as _closure


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
            if in_lightning_module(ctx):
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
