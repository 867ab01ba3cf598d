"""TR104 loss-accumulated-with-graph: loss tensor accumulated across iterations without .item()/.detach()."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    call_receiver,
    dotted_name,
    method_name)
from analyzers.program.flow import names_computed_from, returned_names
from analyzers.program.loops import loop_stack, steps_each_iteration
from analyzers.program.names import last_segment
from analyzers.program.values import (BACKWARD_METHODS)
from analyzers.model import Category, Severity
from analyzers.program.graphs import graph_kind_read
from analyzers.rules.base import Invalid, Rule


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
        built from a fresh variable in the same iteration. Values known to carry no graph are
        never flagged: numbers, `loss.data[0]`, and what a function of the file returns when
        every `return` hands back such a value.
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
        # numbers read off the graph (``loss.data[0]`` is a Python number on old torch), also when a training
        # function of the file returns them
        """
        import torch
        def train_step(x, y):
            loss = 0
            for t in range(x.size(0)):
                loss += criterion(model(x[t]), y[t])
            loss.backward()
            return loss.data[0] / x.size(0)
        running_loss = 0
        history = []
        for step in range(1000):
            running_loss += train_step(*next_batch())
            if step % 100 == 0:
                history.append(running_loss / 100)
                running_loss = 0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            print_loss_total += loss.data[0]
            plot_loss = print_loss_total / 100
            plot_losses.append(plot_loss)
        """,
        # one loss summed over layers and handed back for backward: not kept across training iterations
        """
        import torch
        def distillation_loss(batch, student, teacher):
            total, layer_total = 0.0, 0.0
            out = student(batch.x)
            total += criterion(out.logits, batch.y)
            for mine, theirs in zip(out.hidden, teacher(batch.x).hidden):
                layer_loss = mse(mine, theirs)
                layer_total += layer_loss
            total += layer_total
            return [total, layer_total.item()]
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
        kind = graph_kind_read(loss_expr, ctx)
        loss_name = dotted_name(loss_expr) or "loss"
        if kind is None or kind == "model" and "loss" not in last_segment(loss_name).lower():
            return
        binding = ctx.binding(acc)
        if binding is not None and binding.kind != "param" and ctx.inside(binding.node, stack[-1]):
            return  # rebuilt in this iteration (multi-term loss, per-iteration list)
        if binding is not None and binding.kind != "param" and any(
                ctx.inside(binding.node, loop) and steps_each_iteration(loop, ctx) for loop in stack[:-1]):
            return  # rebuilt for each optimizer step (a step's chunks gathered): nothing outlives the step
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
                names.update(names_computed_from(receiver, ctx))
            for arg in node.args:
                names.update(names_computed_from(arg.value, ctx))

    def visit_Return(self, node: cst.Return, ctx: FileContext) -> None:
        if node.value is not None:
            names = self.returned_names.setdefault(id(ctx.function), set())
            names.update(returned_names(node.value, ctx))

    def end_file(self, ctx: FileContext) -> None:
        for node, acc, loss_name, (template, acc_expr), fn in self.candidates:
            if acc in self.backward_names.get(id(fn), ()) or acc in self.returned_names.get(id(fn), ()):
                continue
            target = dotted_name(acc_expr) or ctx.module.code_for_node(acc_expr)  # reporting: render once
            shown = template.format(acc=target, loss=loss_name)
            self.report(node, (f"{shown} keeps the autograd graph of every iteration alive ({loss_name} is never "
                               f"detached): memory grows each step; accumulate {loss_name}.item() "
                               f"or {loss_name}.detach() instead"))


def _loss_operand(value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The loss-like name in ``loss`` / ``loss * n`` / ``n * loss`` (bare names only)."""
    if isinstance(value, (cst.Name, cst.Attribute)):
        return value
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
        for side in (value.left, value.right):
            if isinstance(side, (cst.Name, cst.Attribute)) and "loss" in last_segment(dotted_name(side)).lower():
                return side
    return None
