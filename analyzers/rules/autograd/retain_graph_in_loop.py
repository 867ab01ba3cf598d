"""TR512 retain-graph-in-loop: backward(retain_graph=True) in a training loop that never backpropagates that graph
again.
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    is_true,
    keyword_arg,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import body_nodes, loop_stack, training_step_loop
from analyzers.program.names import node_text
from analyzers.program.values import (BACKWARD_METHODS, is_plain_backward)
from analyzers.rules.base import Invalid, Rule


class RetainGraphInLoop(Rule):
    id = "TR512"
    slug = "retain-graph-in-loop"
    category = Category.AUTOGRAD
    severity = Severity.MEDIUM
    summary = "backward(retain_graph=True) in a training loop that never backpropagates that graph again"
    what = """
        Flags `loss.backward(retain_graph=True)` inside a loop when it is the only backward
        pass of the iteration (no second `.backward()` or `torch.autograd.grad` there). The
        iteration is the training step: the pass of the outermost loop around the call that
        handles one batch, so a loop of generator updates nested in a batch loop is part of
        that batch's step.
    """
    why = """
        `retain_graph=True` keeps every buffer of the graph alive after the backward pass, for
        a second backward through the same graph. With no second pass, it only holds memory;
        more often it hides a bug - a tensor (an RNN hidden state, a running statistic) that
        links each iteration's graph to the previous ones, so backward silently runs through
        the whole history and memory grows every step.
    """
    example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    fix_example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    VALID = [
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        """,
        # two backward passes through a shared graph
        """
        import torch
        for real in loader:
            fake = G(z)
            d_loss = D(fake).mean() - D(real).mean()
            d_loss.backward(retain_graph=True)
            opt_d.step()
            g_loss = -D(fake).mean()
            g_loss.backward()
            opt_g.step()
        """,
        """
        import torch
        for x in loader:
            loss = model(x).sum()
            loss.backward(retain_graph=True)
            grads = torch.autograd.grad(loss, x)
        """,
        # a few generator updates nested in the batch loop: the discriminator's loss backpropagates the generated
        # output's retained graph once they are done
        """
        import torch
        for real in loader:
            for _ in range(2):
                fake = G(z)
                g_loss = -D(fake).mean()
                g_loss.backward(retain_graph=True)
                opt_g.step()
            d_loss = D(fake).mean() - D(real).mean()
            d_loss.backward()
            opt_d.step()
        """,
        # not in a loop
        "import torch\nloss.backward(retain_graph=True)\n",
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward(retain_graph=True)
                optimizer.step()
            """,
            line=6, message="`loss.backward(retain_graph=True)`",
        ),
        Invalid(
            """
            import torch
            def train(model):
                for epoch in range(10):
                    for batch in loader:
                        out, hidden = model(batch, hidden)
                        scaler.scale(loss_fn(out)).backward(retain_graph=True)
                        scaler.step(opt)
            """,
            line=7,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[tuple[cst.Call, cst.CSTNode]] = []

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not is_plain_backward(node):
            return
        retain = keyword_arg(node, "retain_graph")
        if retain is None or not is_true(retain.value):
            return
        stack = loop_stack(ctx)
        if stack:
            # the iteration is the training step: a loop of sub-steps inside a batch loop belongs to that batch
            self.candidates.append((node, training_step_loop(stack, ctx) or stack[-1]))

    def end_file(self, ctx: FileContext) -> None:
        for node, loop in self.candidates:
            passes = 0
            for other in body_nodes(loop):
                if isinstance(other, cst.Call) and ((method_name(other) in BACKWARD_METHODS or method_name(other) == "grad")
                                                    or "autograd" in (dotted_name(other.func) or "")):
                    passes += 1
            if passes > 1:
                continue
            self.report(node, f"{code_span(node_text(ctx, node))} is the only backward pass of the iteration: the "
                              f"retained graph is never used again and only holds memory - or hides state that "
                              f"links each iteration's graph to the previous ones; drop `retain_graph=True` (and "
                              f"detach any carried-over state)")
