"""TR610 resume-without-optimizer-state: Training resumes from a checkpoint but never restores the optimizer (or LR
scheduler) state.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, keyword_arg, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.library import Does, does
from analyzers.program.values import is_optimizer, is_scheduler
from analyzers.program.flow import runs_when_true
from analyzers.program.names import mentions_resume
from analyzers.rules.base import Invalid, Rule


_RESTORING_HELPERS = ("restart_from_checkpoint", "resume_checkpoint", "load_checkpoint")


class ResumeWithoutOptimizerState(Rule):
    id = "TR610"
    # a torch.load on a path or under a test that says resume/restore, and an optimizer that steps
    source_hint = (re.compile(r"(?i)resume|restore"), re.compile(r"load\s*\("), re.compile(r"\.step\s*\("))
    slug = "resume-without-optimizer-state"
    category = Category.SECURITY
    severity = Severity.MEDIUM
    summary = "Training resumes from a checkpoint but never restores the optimizer (or LR scheduler) state"
    what = """
        Flags a `torch.load` on a resume path (under `if args.resume...:`, or loading a path
        named like one) in a script that then trains with a stateful optimizer (Adam, AdamW,
        RMSprop, SGD with momentum...) and never calls `optimizer.load_state_dict(...)`; and,
        when the optimizer is restored, a stepped LR scheduler that is not (no
        `scheduler.load_state_dict(...)`, no `last_epoch=`).
    """
    why = """
        The optimizer's state (Adam's moment estimates, SGD's momentum buffers, the step count
        that drives bias correction and warm-up) is part of the training run. Resuming with a
        fresh optimizer restarts it: the first updates after a resume are effectively
        uncorrected, the loss jumps, and a run interrupted and resumed no longer reproduces an
        uninterrupted one. The same goes for the LR scheduler and the GradScaler.
    """
    example = """
        if args.resume:
            model.load_state_dict(torch.load(args.resume))
        optimizer = torch.optim.Adam(model.parameters())
        for epoch in range(start, epochs):
            ...
            torch.save(model.state_dict(), "last.pt")
    """
    fix_example = """
        if args.resume:
            ckpt = torch.load(args.resume)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            start = ckpt["epoch"] + 1
        ...
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch}, "last.pt")
    """
    VALID = [
        """
        import torch
        optimizer = torch.optim.Adam(model.parameters())
        if args.resume:
            ckpt = torch.load(args.resume)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        """,
        # evaluation only
        """
        import torch
        if args.resume:
            model.load_state_dict(torch.load(args.resume))
        with torch.no_grad():
            print(model(x))
        """,
        # plain SGD keeps no state
        """
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.resume:
            model.load_state_dict(torch.load(args.resume))
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """,
        # fine-tuning from pretrained weights is not a resume
        """
        import torch
        optimizer = torch.optim.AdamW(model.parameters())
        model.load_state_dict(torch.load(args.pretrained))
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            if args.resume_snapshot:
                model = torch.load(args.resume_snapshot)
            else:
                model = Net()
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            for batch in loader:
                opt.zero_grad()
                loss = criterion(model(batch.x), batch.y)
                loss.backward()
                opt.step()
            torch.save(model, "snapshot.pt")
            """,
            line=4, message="`opt` (`torch.optim.Adam(...)`)",
        ),
        Invalid(
            """
            import torch
            def main(args):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                if args.resume:
                    state = torch.load(args.resume, map_location="cpu")
                    model.load_state_dict(state["model"])
                    start_epoch = state["epoch"]
                train(model, optimizer)
            def train(model, optimizer):
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            optimizer = torch.optim.AdamW(model.parameters())
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
            if args.resume:
                ckpt = torch.load(args.resume)
                model.load_state_dict(ckpt["model"])
                optimizer.load_state_dict(ckpt["optimizer"])
            for epoch in range(start, 100):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
                scheduler.step()
            """,
            line=6, message="`scheduler` (`torch.optim.lr_scheduler.CosineAnnealingLR(...)`) starts over",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loads: list[cst.Call] = []
        self._restores = False
        self._trains = False
        self._optimizers: list[tuple[str, cst.Call]] = []
        self._schedulers: list[tuple[str, cst.Call]] = []
        self._restores_scheduler = False
        self._steps_scheduler = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            name = func.attr.value
            if name == "load_state_dict" and is_optimizer(func.value, ctx):
                self._restores = True
            elif name == "load_state_dict" and is_scheduler(func.value, ctx):
                self._restores_scheduler = True
            elif name == "step" and is_scheduler(func.value, ctx):
                self._steps_scheduler = True
            elif name == "step" and is_optimizer(func.value, ctx):
                self._trains = True
            elif name in _RESTORING_HELPERS:
                self._restores = self._restores_scheduler = True  # a helper that restores whatever it is given
        if name_of(func) in _RESTORING_HELPERS:
            self._restores = self._restores_scheduler = True
        elif any(is_optimizer(a.value, ctx) or is_scheduler(a.value, ctx) for a in node.args) and \
                self._is_resume(node, ctx):
            # load_ckpt(path, model, optimizer, scheduler): a helper that restores what it is given
            self._restores = True
            if any(is_scheduler(a.value, ctx) for a in node.args):
                self._restores_scheduler = True
        qualified = ctx.qualified_name(func) or ""
        if qualified.startswith("torch.optim.lr_scheduler.") and qualified.rsplit(".", 1)[-1][:1].isupper():
            parent = ctx.parent(node)
            if keyword_arg(node, "last_epoch") is None and isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = dotted_name(parent.targets[0].target)
                if target:
                    self._schedulers.append((target, node))
        elif qualified.startswith("torch.optim.") and ".lr_scheduler." not in qualified and \
                qualified.rsplit(".", 1)[-1][:1].isupper():
            parent = ctx.parent(node)
            target = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = dotted_name(parent.targets[0].target)
            self._optimizers.append((target or "the optimizer", node))
        elif does(qualified, Does.READS_TORCH_CHECKPOINT) and self._is_resume(node, ctx) and not in_compat_fallback(ctx, node):
            self._loads.append(node)

    @staticmethod
    def _is_resume(node: cst.Call, ctx: FileContext) -> bool:
        path = argument(node, 0, "f")
        if path is not None and mentions_resume(ctx, path):
            return True
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, (cst.If, cst.While)) and mentions_resume(ctx, ancestor.test):
                # ``if args.resume: ... else: load(pretrained)``: the other branch initialises, it does not resume
                return runs_when_true(ancestor, node, ctx)
            if isinstance(ancestor, cst.FunctionDef):
                return "resume" in ancestor.name.value.lower()
        return False

    def end_file(self, ctx: FileContext) -> None:
        if not self._loads or not self._trains:
            return
        if self._restores:
            self._scheduler(ctx)
            return
        stateful = [(name, call) for name, call in self._optimizers if self._has_state(call, ctx)]
        if not stateful:
            return
        name, call = stateful[0]
        shown = code_span(short(ctx, call.func) + "(...)")
        load = self._loads[0]
        self.report(load, f"{code_span(short(ctx, load))} resumes training, but {code_span(name)} ({shown}) never gets "
                          f"its state back: nothing calls {code_span(name + '.load_state_dict(...)')}, so the resumed run restarts "
                          f"the optimizer's moments and step count; save and restore the optimizer (and scheduler / "
                          f"GradScaler) state with the model")

    def _scheduler(self, ctx: FileContext) -> None:
        """The optimizer comes back but the LR scheduler starts over."""
        if self._restores_scheduler or not self._steps_scheduler or not self._schedulers:
            return
        name, call = self._schedulers[0]
        load = self._loads[0]
        self.report(load, f"{code_span(short(ctx, load))} resumes training and restores the optimizer, but "
                          f"{code_span(name)} ({code_span(short(ctx, call.func) + '(...)')}) starts over: nothing calls "
                          f"{code_span(name + '.load_state_dict(...)')}, so the learning rate jumps back to its initial "
                          f"schedule after every resume; save and restore the scheduler state too")

    @staticmethod
    def _has_state(call: cst.Call, ctx: FileContext) -> bool:
        qualified = ctx.qualified_name(call.func) or ""
        if qualified.rsplit(".", 1)[-1] != "SGD":
            return True
        momentum = keyword_arg(call, "momentum")
        if momentum is None:
            return False
        value = momentum.value
        return not (isinstance(value, (cst.Integer, cst.Float)) and float(value.value) == 0.0)


def name_of(func: cst.BaseExpression) -> Optional[str]:
    if isinstance(func, cst.Name):
        return func.value
    return None
