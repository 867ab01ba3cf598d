"""TR118 zero-grad-undoes-accumulation: gradients zeroed on every batch while the optimizer steps only every few."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, call_receiver, code_children, method_name
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import body_nodes, counted_guard, guard_between, loop_stack
from analyzers.program.names import node_text
from analyzers.program.values import is_backward, is_optimizer, optimizer_keys, optimizer_step
from analyzers.rules.base import Invalid, Rule


def _own_calls(loop: cst.CSTNode):
    """The calls of ``loop``'s own body: not those of a loop, function or class nested in it."""
    stack = list(code_children(loop.body))
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            yield node
        if isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(code_children(node))


class ZeroGradUndoesAccumulation(Rule):
    id = "TR118"
    source_hint = re.compile(r"zero_grad")  # an optimizer's zero_grad
    slug = "zero-grad-undoes-accumulation"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = "gradients zeroed on every batch while the optimizer steps only every few batches"
    what = """
        Flags `optimizer.zero_grad()` that runs on every pass of a training loop (which also
        calls `backward()` on every pass) when the same optimizer's `step()` runs only on the
        passes a count picks: under `if (i + 1) % accum_steps == 0`, or after an
        `if remaining > 1: remaining -= 1; continue` that skips it.
    """
    why = """
        Gradient accumulation works because `backward()` adds into `.grad` until the step.
        Zeroing on every batch throws away the gradients of every batch but the last one
        before each step: the update is computed from a single micro-batch, the effective
        batch size is not the one configured, and the other batches' forward and backward
        passes are wasted work.
    """
    example = """
        for batch_no, batch in enumerate(train_loader):
            opt.zero_grad()                      # every micro-batch
            (model(batch).loss / micro).backward()
            if batch_no % micro == micro - 1:    # every `micro` batches
                opt.step()
    """
    fix_example = """
        for batch_no, batch in enumerate(train_loader):
            (model(batch).loss / micro).backward()
            if batch_no % micro == micro - 1:
                opt.step()
                opt.zero_grad()                  # once the step has used them
    """
    VALID = [
        # zeroed right after the step, inside the same branch
        """
        import torch
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for n, (inputs, targets) in enumerate(train_loader):
            (loss_fn(net(inputs), targets) / k).backward()
            if n % k == k - 1:
                opt.step()
                opt.zero_grad()
        """,
        # no accumulation: the step is skipped when the loss is not finite, not by a count
        """
        import torch
        opt = torch.optim.Adam(net.parameters())
        for inputs, targets in train_loader:
            opt.zero_grad()
            loss = loss_fn(net(inputs), targets)
            loss.backward()
            if torch.isfinite(loss):
                opt.step()
        """,
        # the generator's optimizer steps every few batches, but only the critic's is zeroed every batch
        """
        import torch
        opt_d = torch.optim.RMSprop(critic.parameters())
        opt_g = torch.optim.RMSprop(gen.parameters())
        for it, real in enumerate(loader):
            opt_d.zero_grad()
            critic_loss(real).backward()
            opt_d.step()
            if it % n_critic == 0:
                opt_g.zero_grad()
                gen_loss().backward()
                opt_g.step()
        """,
        # the count's `continue` skips the zeroing as well as the step
        """
        import torch
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        left = micro_batches
        for inputs, targets in train_loader:
            (loss_fn(net(inputs), targets) / micro_batches).backward()
            if left > 1:
                left -= 1
                continue
            opt.step()
            opt.zero_grad()
            left = micro_batches
        """,
        # a batch the data marks as empty is skipped before anything is computed
        """
        import torch
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step, (inputs, targets) in enumerate(train_loader):
            opt.zero_grad()
            net(inputs).sum().backward()
            if targets is None:
                continue
            opt.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            opt = torch.optim.AdamW(net.parameters())
            for n, (inputs, targets) in enumerate(train_loader):
                opt.zero_grad()
                scaled = loss_fn(net(inputs), targets) / k
                scaled.backward()
                if (n + 1) % k == 0:
                    opt.step()
            """,
            line=5, message="only every few"),
        # a count-down that skips the step with `continue`
        Invalid(
            """
            import torch
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            def train_epoch(loader, micro_batches):
                left = micro_batches
                for inputs, targets in loader:
                    opt.zero_grad()
                    loss_fn(net(inputs), targets).backward()
                    if left > 1:
                        left -= 1
                        continue
                    opt.step()
                    left = micro_batches
            """,
            line=7, message="zeroed on every pass"),
        # zeroed at the end of every pass, after the branch that steps
        Invalid(
            """
            import torch
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for n, batch in enumerate(train_loader):
                net(batch).mean().backward()
                if n % k == 0:
                    opt.step()
                opt.zero_grad()
            """,
            line=8),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._zeroes: list[tuple[cst.Call, cst.BaseExpression, cst.CSTNode]] = []

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) != "zero_grad":
            return
        receiver = call_receiver(node)
        stack = loop_stack(ctx)
        if receiver is not None and stack and is_optimizer(receiver, ctx):
            self._zeroes.append((node, receiver, stack[-1]))

    def end_file(self, ctx: FileContext) -> None:
        # decided after the walk: the steps come after the zeroing, and where they sit is known once walked
        for node, receiver, loop in self._zeroes:
            self._check(node, receiver, loop, ctx)
        self._zeroes = []

    def _check(self, node: cst.Call, receiver: cst.BaseExpression, loop: cst.CSTNode, ctx: FileContext) -> None:
        calls = list(_own_calls(loop))
        if (guard_between(node, loop, ctx) or not any(node is n for n in calls)
                or counted_guard(node, loop, ctx) is not None):
            return  # zeroed only on some passes (also after a ``continue`` that skips the step), or in a nested loop
        if not any(is_backward(call) and not guard_between(call, loop, ctx) for call in calls):
            return  # no backward on every pass: nothing accumulates
        keys = optimizer_keys(receiver, ctx)
        steps = []
        for call in calls:
            step = optimizer_step(call, ctx) if method_name(call) == "step" else None
            if step is None or step.vague or not (step.keys & keys):
                continue
            guard = counted_guard(call, loop, ctx)
            if guard is None:
                return  # a step of this optimizer that runs on other passes than a count picks
            steps.append((call, guard))
        if not steps:
            return
        step, guard = steps[0]
        opt = node_text(ctx, receiver)
        self.report(
            node,
            f"{code_span(opt + '.zero_grad()')} runs on every pass of the loop, but {code_span(opt)} steps only every "
            f"few passes ({code_span(node_text(ctx, guard.test))}): the gradients are zeroed on every pass before "
            f"they are summed, so each step uses one batch's gradients and the other batches' work is lost; zero "
            f"them right after the step instead",
            related=[(step, "the step runs only on the passes this count picks")])
