"""TR110 lr-decay-not-applied: learning-rate variable decayed in the loop but never written to the optimizer."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    dotted_name,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import body_nodes, loop_stack
from analyzers.rules.base import Invalid, Rule


_LR_NAME = re.compile(r"^(?:\w+_)?(?:lr|learning_rate)(?:_\w+)?$", re.IGNORECASE)


class LrDecayNotApplied(Rule):
    id = "TR110"
    source_hint = (re.compile(r"optim"), re.compile(r"[*/]"))  # a torch.optim optimizer and a multiplied/divided rate
    slug = "lr-decay-not-applied"
    category = Category.TRAINING
    severity = Severity.HIGH
    summary = "learning-rate variable decayed in the loop but never written to the optimizer"
    what = """
        Flags `lr *= 0.1`, `lr /= 4` or `lr = lr * gamma` inside a loop when the optimizer was
        built from that variable (`SGD(params, lr=lr)`), nothing writes the new value into the
        optimizer (`param_groups`, a helper called with `lr`, a re-created optimizer) and no
        learning-rate scheduler exists in the file.
    """
    why = """
        The optimizer copied the number when it was constructed; changing the Python variable
        later does not reach `optimizer.param_groups[i]["lr"]`. The schedule the code describes
        never happens: training runs at the initial learning rate throughout, and only the
        printed value decays.
    """
    example = """
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for epoch in range(epochs):
            train(model, optimizer)
            if epoch in (30, 60):
                lr *= 0.1
    """
    fix_example = """
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[30, 60], gamma=0.1)
        for epoch in range(epochs):
            train(model, optimizer)
            scheduler.step()
    """
    VALID = [
        # written into the param groups
        """
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for epoch in range(10):
            train(model, optimizer)
            lr *= 0.1
            for g in optimizer.param_groups:
                g["lr"] = lr
        """,
        # handed to a helper that sets it
        """
        import torch
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for epoch in range(10):
            train(model, opt)
            lr = lr * 0.5
            set_lr(opt, lr)
        """,
        # a helper of another file gets the object that holds the rate
        """
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        for epoch in range(10):
            args.lr *= 0.1
            utils.adjust_learning_rate(optimizer, args)
        """,
        # manual SGD: the variable is what the update reads
        """
        import torch
        for epoch in range(10):
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            lr /= 4.0
        """,
        # optimizer re-created with the new rate
        """
        import torch
        for epoch in range(10):
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            train(model, optimizer)
            lr *= 0.9
        """,
        # a scheduler drives the optimizer; the variable is only for printing
        """
        import torch
        from torch.optim import lr_scheduler
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = lr_scheduler.StepLR(optimizer, 10)
        for epoch in range(10):
            train(model, optimizer)
            scheduler.step()
            lr *= 0.1
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for epoch in range(100):
                train(model, optimizer)
                if epoch in (30, 60):
                    lr *= 0.1
            """,
            line=7, message="`lr`",
        ),
        Invalid(
            """
            import torch.optim as optim
            def main(args):
                learning_rate = args.lr
                opt = optim.Adam(net.parameters(), learning_rate)
                for epoch in range(args.epochs):
                    for x, y in loader:
                        opt.zero_grad()
                        loss_fn(net(x), y).backward()
                        opt.step()
                    learning_rate = learning_rate / 2
            """,
            line=11, message="`opt`",
        ),
        Invalid(
            """
            import torch
            def main(args):
                optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
                for epoch in range(args.epochs):
                    train(model, optimizer)
                    if epoch % 30 == 29:
                        args.lr *= 0.1
            """,
            line=8, message="`args.lr`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.decays: list[tuple[cst.CSTNode, str, tuple]] = []
        self.optimizers: list[tuple[cst.Call, str, tuple, object]] = []  # call, lr name, loop stack, function
        self.applied = False  # param_groups / a scheduler anywhere in the file

    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        if isinstance(node.operator, (cst.MultiplyAssign, cst.DivideAssign)):
            name = dotted_name(node.target)
            if name is not None:
                self._decay(node, name, ctx)

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        name = dotted_name(node.targets[0].target) if len(node.targets) == 1 else None
        if name is None:
            return
        value = node.value
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
            if dotted_name(value.left) == name or dotted_name(value.right) == name:
                self._decay(node, name, ctx)

    def _decay(self, node: cst.CSTNode, name: str, ctx: FileContext) -> None:
        if _LR_NAME.match(name.rsplit(".", 1)[-1]) and loop_stack(ctx):
            self.decays.append((node, name, loop_stack(ctx)))

    def visit_Attribute(self, node: cst.Attribute, ctx: FileContext) -> None:
        if node.attr.value in ("param_groups", "defaults"):
            self.applied = True

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        qualified = ctx.call_name(node) or ""
        local = dotted_name(node.func) or ""
        if "lr_scheduler" in qualified or "sched" in local.lower() or "lr_scheduler" in local:
            self.applied = True
            return
        if qualified.startswith("torch.optim.") and qualified.rsplit(".", 1)[-1][:1].isupper():
            lr = dotted_name(argument(node, 1, "lr"))
            if lr is not None:
                self.optimizers.append((node, lr, loop_stack(ctx), ctx.function))

    def end_file(self, ctx: FileContext) -> None:
        if self.applied:
            return
        for node, name, stack in self.decays:
            built = [(call, opt_stack) for call, lr, opt_stack, _ in self.optimizers if lr == name]
            if not built or any(stack[-1] in opt_stack or set(opt_stack) & set(stack) for _, opt_stack in built):
                continue  # no optimizer read it, or one is re-created inside the decaying loop
            if self._passed_on(stack[0], name, node):
                continue
            call = built[0][0]
            target = ctx.parent(call)
            opt = None
            if isinstance(target, cst.Assign) and len(target.targets) == 1:
                opt = dotted_name(target.targets[0].target)
            shown = code_span(opt) if opt else "the optimizer"
            self.report(node, f"{code_span(name)} is decayed here, but {shown} copied its value when it was built "
                              f"and nothing writes the new rate into its `param_groups`: training keeps the "
                              f"initial learning rate; use an `lr_scheduler` or set `g[\"lr\"]` for each param group")

    @staticmethod
    def _passed_on(loop: cst.CSTNode, name: str, decay: cst.CSTNode) -> bool:
        """The loop hands the variable to a call (a helper that sets it, an optimizer built anew)."""
        for node in body_nodes(loop):
            if isinstance(node, cst.Call) and method_name(node) not in ("print", "format", "info", "log", "write",
                                                                        "add_scalar", "set_postfix"):
                for arg in node.args:
                    passed = dotted_name(arg.value)
                    if passed is not None and (passed == name or name.startswith(passed + ".")):
                        return True  # the variable, or the object holding it (``adjust_lr(optimizer, args)``)
        return False
