"""TR510 outputs-kept-with-graph: model outputs appended to a list across training iterations without .detach()."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import body_nodes, in_inner_loop, loop_stack, loop_trains, steps_each_iteration
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import (BACKWARD_METHODS, is_model_call)
from analyzers.rules.base import Invalid, Rule


_KEEPS_GRAPH = {"cpu", "cuda", "to", "float", "double", "half", "clone", "squeeze", "unsqueeze", "view", "reshape",
                "contiguous", "flatten", "permute", "transpose"}


class OutputsKeptWithGraph(Rule):
    id = "TR510"
    slug = "outputs-kept-with-graph"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "model outputs appended to a list across training iterations without .detach()"
    what = """
        Flags `outputs.append(out)` in a training loop (one that calls `.backward()`) when `out`
        is what a model returned in that iteration (also `out.cpu()`, `out.view(...)`), the list
        outlives the iteration, and nothing detaches it (`.detach()`, `.item()`, `.tolist()`)
        or turns autograd off.
    """
    why = """
        A model output holds the whole autograd graph of its forward pass, with every saved
        activation. Keeping it in a list keeps all of those alive for every iteration: memory
        grows until the process runs out of (GPU) memory. `.cpu()` does not help - it is
        differentiable and keeps the graph.
    """
    example = """
        predictions = []
        for x, y in loader:
            out = model(x)
            loss = criterion(out, y)
            loss.backward()
            optimizer.step()
            predictions.append(out)
    """
    fix_example = """
        predictions = []
        for x, y in loader:
            out = model(x)
            loss = criterion(out, y)
            loss.backward()
            optimizer.step()
            predictions.append(out.detach().cpu())
    """
    VALID = [
        """
        import torch
        preds = []
        for x, y in loader:
            out = model(x)
            loss = criterion(out, y)
            loss.backward()
            opt.step()
            preds.append(out.detach().cpu())
            labels.append(out.argmax(1))
        """,
        # the list is built for this iteration's loss
        """
        import torch
        for x, y in loader:
            outs = []
            for t in range(x.size(1)):
                out, h = model(x[:, t], h)
                outs.append(out)
            loss = criterion(torch.stack(outs, 1), y)
            loss.backward()
        """,
        # the forward pass ran without autograd
        """
        import torch
        ema_preds = []
        for x, y in loader:
            criterion(model(x), y).backward()
            with torch.no_grad():
                ema_out = ema_model(x)
            ema_preds.append(ema_out)
        """,
        # evaluation loop
        """
        import torch
        preds = []
        with torch.no_grad():
            for x, y in loader:
                preds.append(model(x))
        """,
        """
        import torch
        preds = []
        for x, y in loader:
            out = model(x)
            criterion(out, y).backward()
            preds.append(out.data)
            scores.append(out.item())
        """,
        # a helper that evaluates the model and returns plain numbers, though its name ends in "model"
        """
        import torch
        def evaluate_model(net, loader):
            with torch.no_grad():
                return sum(crit(net(a), b).item() for a, b in loader)
        history = []
        for step, (x, y) in enumerate(train_loader):
            crit(net(x), y).backward()
            opt.step()
            if step % 50 == 0:
                held_out = evaluate_model(net, val_loader)
                history.append(held_out)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            predictions = []
            for x, y in loader:
                optimizer.zero_grad()
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
                predictions.append(out)
            """,
            line=10, message="`out`",
        ),
        Invalid(
            """
            import torch
            def train(net, loader):
                all_logits = []
                for epoch in range(3):
                    for x, y in loader:
                        logits = net(x)
                        F.cross_entropy(logits, y).backward()
                        all_logits.append(logits.cpu())
            """,
            line=9, message="`all_logits`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[tuple[cst.Call, str, str, cst.CSTNode]] = []

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) != "append" or len(node.args) != 1 or not isinstance(node.func, cst.Attribute):
            return
        stack = loop_stack(ctx)
        if not stack or ctx.in_no_grad():
            return
        target = dotted_name(node.func.value)
        if target is None:
            return
        value = node.args[0].value
        while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
               and value.func.attr.value in _KEEPS_GRAPH):
            value = value.func.value
        if not isinstance(value, cst.Name):
            return
        binding = ctx.binding(value.value)
        if binding is None or binding.kind != "assign" or binding.loop is None or binding.loop is not stack[-1]:
            return
        call = binding.unpacked_from if binding.unpacked_from is not None else binding.value
        if not isinstance(call, cst.Call) or not is_model_call(call.func, ctx):
            return
        if in_no_grad_block(ctx, binding.node):
            return  # ``with torch.no_grad(): out = model(x)``, appended after the block
        listed = ctx.binding(target)
        if listed is not None and listed.loop is stack[-1]:
            return  # a list built afresh in each iteration of this loop
        if listed is not None and listed.kind != "param" and any(
                ctx.inside(listed.node, loop) and steps_each_iteration(loop, ctx) for loop in stack[:-1]):
            return  # built afresh for each optimizer step (a step's chunks): nothing outlives the step
        self.candidates.append((node, target, value.value, stack[-1]))

    def end_file(self, ctx: FileContext) -> None:
        for node, target, name, loop in self.candidates:
            if not loop_trains(loop, ctx):
                continue
            # backward in this very loop: one graph per step; only in a nested loop: one per epoch
            per_step = any(isinstance(n, cst.Call) and method_name(n) in BACKWARD_METHODS
                           for n in body_nodes(loop.body) if not in_inner_loop(n, loop, ctx))
            every = "training step" if per_step else "epoch"
            self.report(node, f"{code_span(target)} keeps {code_span(name)}, a model output with its autograd graph, "
                              f"from every {every}: the graphs and their saved activations are never freed and "
                              f"memory grows each {every.split()[-1]}; append {code_span(name + '.detach()')} "
                              f"(or run that forward pass under `torch.no_grad()`)",
                        severity=None if per_step else Severity.MEDIUM)
