"""TR102 scheduler-step-before-optimizer: lr_scheduler.step() called before optimizer.step() in the same iteration."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (
    FileContext,
    call_receiver,
    dotted_name,
    method_name)
from analyzers.program.loops import loop_stack
from analyzers.program.values import (is_scheduler)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.values import optimizer_step as _optimizer_step


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
