"""Training-loop and autograd-memory rules: learning rates, accumulation, train/eval modes, graphs kept alive.

Like the rules of ``training.py``, these collect small facts during the one walk (which loop a call sits in,
in which function, in what order) and decide in ``end_file``. A fact's loop stack is the tuple of ``for`` /
``while`` loops of the same function that enclose it, outermost first.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    call_receiver,
    dotted_name,
    is_true,
    iter_names,
    keyword_arg,
    method_name,
    positional_args,
    short,
)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.program.library import Does, training_libraries_that
from analyzers.program.loops import AccumulationFacts, body_nodes, loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.state import in_no_grad_block
from analyzers.program.values import (BACKWARD_METHODS, builds_optimizer, changes_in_eval, is_backward, is_model_call,
                                      is_optimizer_step, is_plain_backward)
from analyzers.rules.base import Invalid, Rule


def _in_nested_loop(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext) -> bool:
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, (cst.For, cst.While)):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# TR110


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


# ---------------------------------------------------------------------------------------------
# TR111 (and the accumulation pattern TR723 reuses)


class AccumulatedLossNotScaled(Rule):
    id = "TR111"
    source_hint = (re.compile(r"backward"), re.compile(r"\.step\s*\("), re.compile(r"%"))  # backward every batch, step under ``% N``
    slug = "accumulated-loss-not-scaled"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    summary = "gradient accumulation without dividing the loss by the accumulation steps"
    what = """
        Flags gradient accumulation - `backward()` on every batch, `optimizer.step()` only
        under `if (i + 1) % accum_steps == 0` - when the loss is never divided by the number of
        accumulation steps (`accum_steps` appears in no division in the file).
    """
    why = """
        `.grad` is the sum of the accumulated micro-batch gradients, so each update is
        `accum_steps` times larger than one full-batch step: the effective learning rate (and the
        norm that gradient clipping compares against) silently grows with the accumulation
        setting, and changing it changes the training dynamics.
    """
    example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    fix_example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    VALID = [
        """
        import torch
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        """
        import torch
        for step, batch in enumerate(loader):
            loss = model(**batch).loss
            loss = loss / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        """,
        """
        import torch
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss /= self.accumulate
            loss.backward()
            if i % self.accumulate == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
        """,
        """
        import torch
        for i, batch in enumerate(loader):
            loss = model(batch).mean()
            loss.div_(n_accum).backward()
            if (i + 1) % n_accum == 0:
                opt.step()
                opt.zero_grad()
        """,
        # a logging interval, not accumulation
        """
        import torch
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if i % log_interval == 0:
                print(loss.item())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=6, message="`accum_steps`",
        ),
        Invalid(
            """
            import torch
            def train(args):
                for epoch in range(args.epochs):
                    for step, batch in enumerate(loader):
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            loss = model(**batch).loss
                        loss.backward()
                        if step % args.gradient_accumulation_steps == 0:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                            opt.step()
                            opt.zero_grad()
            """,
            line=9,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.divided: set[str] = set()

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        ctx.facts(AccumulationFacts).note_if(node, ctx)

    def visit_BinaryOperation(self, node: cst.BinaryOperation, ctx: FileContext) -> None:
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            self.divided.update(n.rsplit(".", 1)[-1] for n in iter_names(node.right))

    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        if isinstance(node.operator, cst.DivideAssign):
            self.divided.update(n.rsplit(".", 1)[-1] for n in iter_names(node.value))

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) in ("div", "div_", "true_divide", "true_divide_", "divide"):
            for arg in node.args:
                self.divided.update(n.rsplit(".", 1)[-1] for n in iter_names(arg.value))

    def end_file(self, ctx: FileContext) -> None:
        for step in ctx.facts(AccumulationFacts).steps:
            divisor = dotted_name(step.divisor) or ""
            if divisor.rsplit(".", 1)[-1] in self.divided:
                continue
            self.report(step.node.test, f"gradients are accumulated over {code_span(divisor)} micro-batches but the "
                                        f"loss is never divided by {code_span(divisor)}: each update is that many "
                                        f"times larger than one batch's, so the effective learning rate (and what "
                                        f"clipping compares against) grows with the accumulation setting; divide the "
                                        f"loss by {code_span(divisor)} before `backward()`")


# ---------------------------------------------------------------------------------------------
# TR112


class EvalNeverTrain(Rule):
    id = "TR112"
    source_hint = (re.compile(r"\.eval\s*\("), re.compile(r"backward"))  # eval() near a loop that calls backward()
    slug = "eval-without-train"
    category = Category.TRAINING
    severity = Severity.HIGH
    summary = "model.eval() inside or before the training loop, and .train() is never called"
    what = """
        Flags `model.eval()` that runs inside a training loop (a loop that calls `.backward()`)
        or before one in the same function, in a file that never calls `.train()` on anything.
    """
    why = """
        A module starts in training mode, and `eval()` is sticky. After the first validation (or
        from the very start), every training step runs with dropout disabled and BatchNorm using
        and no longer updating its running statistics - the model trains differently from what
        the code suggests, without any error.
    """
    example = """
        for epoch in range(epochs):
            for x, y in train_loader:
                ...
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                validate(model, val_loader)
    """
    fix_example = """
        for epoch in range(epochs):
            model.train()
            for x, y in train_loader:
                ...
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                validate(model, val_loader)
    """
    VALID = [
        """
        import torch
        for epoch in range(10):
            model.train()
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            model.eval()
        """,
        # eval only after all training
        """
        import torch
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        model.eval()
        test(model)
        """,
        # train mode restored through train(True) / a helper of this file
        """
        import torch
        def fit(model):
            for epoch in range(10):
                model.train(True)
                for x, y in loader:
                    criterion(model(x), y).backward()
                    optimizer.step()
                model.eval()
        """,
        # a frozen teacher in eval mode; the student is never put in eval
        """
        import torch
        optimizer = torch.optim.Adam(student.parameters())
        teacher.eval()
        for x, y in loader:
            with torch.no_grad():
                target = teacher(x)
            loss = criterion(student(x), target)
            loss.backward()
            optimizer.step()
        """,
        # eval() changes nothing in a model without dropout and BatchNorm
        """
        import torch
        import torch.nn as nn
        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Sequential(nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))
            def forward(self, x):
                return self.fc(x)
        model = MLP()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(10):
            for x, y in loader:
                criterion(model(x), y).backward()
                optimizer.step()
            model.eval()
        """,
        # evaluate-only branch that returns
        """
        import torch
        def main(args):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            if args.evaluate:
                model.eval()
                validate(model)
                return
            for x, y in loader:
                criterion(model(x), y).backward()
                optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            for epoch in range(10):
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                model.eval()
                with torch.no_grad():
                    evaluate(model)
            """,
            line=10, message="`model.eval()`",
        ),
        Invalid(
            """
            import torch
            def main():
                net = Net()
                opt = SGD(net.parameters(), lr=0.1)
                net.eval()
                for x, y in loader:
                    opt.zero_grad()
                    criterion(net(x), y).backward()
                    opt.step()
            """,
            line=6,
        ),
        # the class holds dropout; the model is moved with ``model = model.cuda()``
        Invalid(
            """
            import torch
            import torch.nn as nn
            class net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Sequential(nn.Linear(784, 100), nn.Dropout(0.5), nn.Linear(100, 10))
                def forward(self, x):
                    return self.fc(x)
            model = net()
            if use_gpu:
                model = model.cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                for x, y in loader:
                    criterion(model(x), y).backward()
                    optimizer.step()
                model.eval()
            """,
            line=18,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.evals: list[tuple[cst.Call, tuple, object, int]] = []
        self.trained = False
        self.loops: list[tuple[cst.CSTNode, object, int]] = []
        self.order = 0
        self.optimized: set[str] = set()  # ``model`` for ``SGD(model.parameters(), ...)``

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if builds_optimizer(node, ctx):
            for arg in node.args:
                value = arg.value
                if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                        and value.func.attr.value in ("parameters", "named_parameters")):
                    owner = dotted_name(value.func.value)
                    if owner:
                        self.optimized.add(owner)
        if not isinstance(node.func, cst.Attribute):
            return
        if name == "train":
            mode = argument(node, 0, "mode")
            if mode is None or not (isinstance(mode, cst.Name) and mode.value == "False"):
                self.trained = True
        elif name == "eval" and not node.args and isinstance(ctx.parent(node), cst.Expr):
            if ctx.qualified_name(node.func) is None:
                self.order += 1
                self.evals.append((node, loop_stack(ctx), ctx.function, self.order))

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        self.order += 1
        self.loops.append((node, ctx.function, self.order))

    def visit_While(self, node: cst.While, ctx: FileContext) -> None:
        self.order += 1
        self.loops.append((node, ctx.function, self.order))

    def end_file(self, ctx: FileContext) -> None:
        if not self.evals or self.trained or any(
                ctx.imports.imports_root(lib) for lib in training_libraries_that(Does.SETS_MODULE_MODE)):
            return
        training = {id(lp) for lp, _, _ in self.loops if loop_trains(lp, ctx)}
        if not training:
            return
        for call, stack, fn, order in self.evals:
            if dotted_name(call.func.value) not in self.optimized:
                continue  # a teacher, a frozen feature extractor, or a model we cannot tie to the optimizer
            if not changes_in_eval(ctx, call.func.value, call):
                continue  # no dropout and no BatchNorm: eval() changes nothing
            inside = any(id(lp) in training for lp in stack)
            if not inside:
                if self._leaves(ctx, call):
                    continue
                later = any(loop_fn is fn and id(lp) in training and loop_order > order
                            for lp, loop_fn, loop_order in self.loops)
                if not later:
                    continue
            receiver = node_text(ctx, call.func.value)
            where = "inside the training loop" if inside else "before the training loop"
            self.report(call, f"{code_span(receiver + '.eval()')} runs {where} and nothing in this file calls "
                              f"`.train()`: every training step after it runs in eval mode (dropout off, "
                              f"BatchNorm frozen to its running statistics); call {code_span(receiver + '.train()')} "
                              f"at the start of each training epoch")

    @staticmethod
    def _leaves(ctx: FileContext, call: cst.Call) -> bool:
        """The eval sits in an ``if`` branch that returns / exits (``if args.evaluate: ...; return``)."""
        for ancestor in ctx.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return False
            if isinstance(ancestor, (cst.If, cst.Else)):
                for node in body_nodes(ancestor.body):
                    if isinstance(node, (cst.Return, cst.Break)):
                        return True
                    if isinstance(node, cst.Call) and (dotted_name(node.func) or "") in (
                            "exit", "sys.exit", "quit", "os._exit"):
                        return True
        return False


# ---------------------------------------------------------------------------------------------
# TR113


class ClipGradMisplaced(Rule):
    id = "TR113"
    source_hint = re.compile(r"clip_grad")  # clip_grad_norm_ / clip_grad_value_
    slug = "clip-grad-misplaced"
    category = Category.TRAINING
    severity = Severity.HIGH
    summary = "gradient clipping after optimizer.step() or before backward() does nothing"
    what = """
        Flags `clip_grad_norm_` / `clip_grad_value_` in a training loop when the step that
        precedes it in the iteration is `optimizer.step()` (clipping after the update), or when
        it comes before the iteration's `backward()` with no backward before it (clipping
        the gradients of the previous, already applied, batch).
    """
    why = """
        Clipping only matters between `backward()`, which writes the gradients, and
        `optimizer.step()`, which reads them. Anywhere else it clips gradients that were already
        used (and will be zeroed) or that are about to be overwritten: training runs unclipped
        while the code suggests it is protected against exploding gradients.
    """
    example = """
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    fix_example = """
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    """
    VALID = [
        """
        import torch
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        """,
        # accumulation and AMP
        """
        import torch
        from torch.nn.utils import clip_grad_norm_
        for i, (x, y) in enumerate(loader):
            scaler.scale(loss_fn(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                scaler.unscale_(opt)
                clip_grad_norm_(model.parameters(), max_norm)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        """,
        # two optimizers: clipping G after D's step, before G's
        """
        import torch.nn as nn
        for x in loader:
            d_loss.backward()
            opt_d.step()
            g_loss = gen_loss(x)
            g_loss.backward()
            nn.utils.clip_grad_norm_(G.parameters(), 5.0)
            opt_g.step()
        """,
        # either branch clips between its backward and step
        """
        import torch
        for x, y in loader:
            if use_amp:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                scaler.step(opt)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            """,
            line=8, message="after `optimizer.step()`",
        ),
        Invalid(
            """
            import torch.nn as nn
            def train_epoch(model, opt):
                for batch in loader:
                    opt.zero_grad()
                    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                    loss = model(batch).mean()
                    loss.backward()
                    opt.step()
            """,
            line=6, message="before",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.events: list[tuple[str, cst.Call, tuple]] = []  # kind B/S/C, call, loop stack

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        stack = loop_stack(ctx)
        if not stack:
            return
        if name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value"):
            qualified = ctx.call_name(node) or dotted_name(node.func) or ""
            if "clip_grad" in qualified and (qualified.startswith("torch.") or qualified.startswith("nn.")
                                              or "utils" in qualified or qualified == name):
                self.events.append(("C", node, stack))
        elif is_backward(node, ctx):
            self.events.append(("B", node, stack))
        elif name == "step" and is_optimizer_step(node, ctx):
            self.events.append(("S", node, stack))

    def end_file(self, ctx: FileContext) -> None:
        for index, (kind, call, stack) in enumerate(self.events):
            if kind != "C":
                continue
            loop = next((lp for lp in reversed(stack)
                         if any(k != "C" and lp in s for k, _, s in self.events)), None)
            if loop is None:
                continue
            same = [(k, c) for k, c, s in self.events if loop in s]
            position = next(i for i, (_, c) in enumerate(same) if c is call)
            before = [k for k, _ in same[:position] if k != "C"]
            after = [k for k, _ in same[position + 1:] if k != "C"]
            clip = node_text(ctx, call.func)
            if before and before[-1] == "S" and "S" not in after:
                step = next(c for k, c in reversed(same[:position]) if k == "S")
                self.report(call, f"{code_span(clip)} runs after {code_span(node_text(ctx, step))}: the update already "
                                  f"used the unclipped gradients; clip between `backward()` and the step")
            elif not before and after and after[0] == "B":
                self.report(call, f"{code_span(clip)} runs before this iteration's `backward()`: it clips the "
                                  f"previous batch's (already applied) gradients and the step uses unclipped ones; "
                                  f"clip between `backward()` and the step")


# ---------------------------------------------------------------------------------------------
# TR510


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
        self.candidates.append((node, target, value.value, stack[-1]))

    def end_file(self, ctx: FileContext) -> None:
        for node, target, name, loop in self.candidates:
            if not loop_trains(loop, ctx):
                continue
            # backward in this very loop: one graph per step; only in a nested loop: one per epoch
            per_step = any(isinstance(n, cst.Call) and method_name(n) in BACKWARD_METHODS
                           for n in body_nodes(loop.body) if not _in_nested_loop(n, loop, ctx))
            every = "training step" if per_step else "epoch"
            self.report(node, f"{code_span(target)} keeps {code_span(name)}, a model output with its autograd graph, "
                              f"from every {every}: the graphs and their saved activations are never freed and "
                              f"memory grows each {every.split()[-1]}; append {code_span(name + '.detach()')} "
                              f"(or run that forward pass under `torch.no_grad()`)",
                        severity=None if per_step else Severity.MEDIUM)


# ---------------------------------------------------------------------------------------------
# TR511


class HiddenStateNotDetached(Rule):
    id = "TR511"
    slug = "hidden-state-not-detached"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "RNN hidden state carried across training batches without .detach()"
    what = """
        Flags `output, hidden = model(x, hidden)` in a loop that also calls `.backward()` when
        `hidden` is never detached or re-initialized inside that loop (`hidden.detach()`,
        `repackage_hidden(hidden)`, `model.init_hidden(...)`), so each batch's state still
        points into the previous batches' graphs.
    """
    why = """
        The second `backward()` then tries to go back through the previous batch's graph, which
        was already freed: "Trying to backward through the graph a second time". Adding
        `retain_graph=True` to silence it makes every step backpropagate through the entire
        history, so time and memory grow with every batch. Truncated BPTT needs the state
        detached at each batch boundary.
    """
    example = """
        hidden = model.init_hidden(batch_size)
        for x, y in loader:
            output, hidden = model(x, hidden)
            loss = criterion(output, y)
            loss.backward()
            optimizer.step()
    """
    fix_example = """
        hidden = model.init_hidden(batch_size)
        for x, y in loader:
            hidden = hidden.detach()  # or tuple(h.detach() for h in hidden) for an LSTM
            output, hidden = model(x, hidden)
            loss = criterion(output, y)
            loss.backward()
            optimizer.step()
    """
    VALID = [
        """
        import torch
        hidden = model.init_hidden(bsz)
        for x, y in loader:
            hidden = repackage_hidden(hidden)
            output, hidden = model(x, hidden)
            criterion(output, y).backward()
            optimizer.step()
        """,
        """
        import torch
        for x, y in loader:
            h = net.init_hidden(x.size(0))
            out, h = net(x, h)
            criterion(out, y).backward()
            opt.step()
        """,
        # the time-step loop carries the state within one batch
        """
        import torch
        for x, y in loader:
            h = None
            for t in range(x.size(1)):
                out, h = cell(x[:, t], h)
            criterion(out, y).backward()
        """,
        """
        import torch
        h = model.init_hidden(bsz)
        for x, y in loader:
            h = tuple([each.data for each in h])
            out, h = model(x, h)
            criterion(out, y).backward()
        """,
        """
        import torch
        hidden = None
        for x, y in loader:
            out, hidden = model(x, hidden)
            criterion(out, y).backward()
            hidden.detach_()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            hidden = model.init_hidden(batch_size)
            for x, y in loader:
                optimizer.zero_grad()
                output, hidden = model(x, hidden)
                loss = criterion(output, y)
                loss.backward()
                optimizer.step()
            """,
            line=6, message="`hidden`",
        ),
        Invalid(
            """
            import torch
            def train(rnn, data):
                for epoch in range(10):
                    h = rnn.init_hidden()
                    for inp, target in data:
                        out, h = rnn(inp, h)
                        loss = loss_fn(out, target)
                        loss.backward(retain_graph=True)
                        opt.step()
            """,
            line=7, message="`h`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[tuple[cst.Assign, list[str], cst.CSTNode]] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        if len(node.targets) != 1 or not isinstance(node.value, cst.Call):
            return
        target = node.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) < 2:
            return
        stack = loop_stack(ctx)
        if not stack:
            return
        assigned = set(_flat_names(target))
        passed = []
        for arg in node.value.args:
            for name in _flat_names(arg.value):
                if name in assigned:
                    passed.append(name)
        if passed and _is_recurrent_callee(node.value.func, ctx):
            self.candidates.append((node, passed, stack[-1]))

    def end_file(self, ctx: FileContext) -> None:
        for node, names, loop in self.candidates:
            if not loop_trains(loop, ctx):
                continue
            kept = [n for n in names if not self._refreshed(loop, n, node)]
            if len(kept) != len(names) or not kept:
                continue
            shown = ", ".join(code_span(n) for n in kept)
            self.report(node, f"{shown} is fed back into {code_span(node_text(ctx, node.value.func))} on every batch and "
                              f"never detached: the next `backward()` reaches into the previous batches' graphs "
                              f"(an error, or with `retain_graph=True` ever slower backprop through all history); "
                              f"detach it at the start of each batch")

    @staticmethod
    def _refreshed(loop: cst.CSTNode, name: str, candidate: cst.Assign) -> bool:
        for node in body_nodes(loop.body):
            if node is candidate:
                continue
            if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                if any(name in _flat_names(t) for t in targets):
                    return True
            elif isinstance(node, cst.For) and name in _flat_names(node.target):
                return True
            elif isinstance(node, cst.Call) and method_name(node) in ("detach_", "detach", "repackage_hidden",
                                                                      "init_hidden", "zero_"):
                if any(name == n.split(".")[0] for n in iter_names(node)):
                    return True
        return False


def _is_recurrent_callee(func: cst.BaseExpression, ctx: FileContext) -> bool:
    last = (dotted_name(func) or "").rsplit(".", 1)[-1].lower()
    return is_model_call(func, ctx) or any(w in last for w in ("rnn", "lstm", "gru"))


def _flat_names(expr: cst.CSTNode) -> list[str]:
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, (cst.Tuple, cst.List)):
        out: list[str] = []
        for element in expr.elements:
            out.extend(_flat_names(element.value))
        return out
    return []


# ---------------------------------------------------------------------------------------------
# TR512


class RetainGraphInLoop(Rule):
    id = "TR512"
    slug = "retain-graph-in-loop"
    category = Category.AUTOGRAD
    severity = Severity.MEDIUM
    summary = "backward(retain_graph=True) in a training loop that never backpropagates that graph again"
    what = """
        Flags `loss.backward(retain_graph=True)` inside a loop when it is the only backward
        pass of the iteration (no second `.backward()` or `torch.autograd.grad` there).
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
            self.candidates.append((node, stack[-1]))

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


# ---------------------------------------------------------------------------------------------
# TR513


_FUNCTIONAL_DROPOUT = {f"torch.nn.functional.{n}" for n in ("dropout", "dropout1d", "dropout2d", "dropout3d",
                                                             "alpha_dropout", "feature_alpha_dropout")}


class FunctionalDropoutAlwaysOn(Rule):
    id = "TR513"
    source_hint = re.compile(r"dropout")  # F.dropout and its variants
    slug = "functional-dropout-always-on"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "F.dropout in a module without training=self.training stays on in eval()"
    what = """
        Flags `F.dropout(x, p)` (and `dropout1d/2d/3d`) inside an `nn.Module` method that does
        not pass `training=` (it defaults to `True`). `F.alpha_dropout` and
        `F.feature_alpha_dropout` default to `training=False`, so they never stay on in eval.
    """
    why = """
        The functional form does not know the module's mode: unlike `nn.Dropout`, it keeps
        dropping activations after `model.eval()`, so validation and inference are randomly
        perturbed, metrics are noisy and worse than the model really is, and predictions are
        not reproducible.
    """
    example = """
        def forward(self, x):
            x = F.dropout(F.relu(self.fc1(x)), p=0.5)
            return self.fc2(x)
    """
    fix_example = """
        def forward(self, x):
            x = F.dropout(F.relu(self.fc1(x)), p=0.5, training=self.training)
            return self.fc2(x)
    """
    VALID = [
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Net(nn.Module):
            def forward(self, x):
                x = F.dropout(x, p=self.p, training=self.training)
                return F.dropout2d(x, 0.1, self.training)
        """,
        # only reached in training mode
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Net(nn.Module):
            def forward(self, x):
                if self.training and self.drop > 0:
                    x = F.dropout(x, p=self.drop)
                return F.dropout(x, 0.5) if self.training else x
        """,
        # not a module: a helper whose caller decides
        """
        from torch.nn import functional as F
        def augment(x, p):
            return F.dropout(x, p)
        """,
        # the alpha variants default to training=False
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class SelfNormalizing(nn.Module):
            def forward(self, x):
                return F.alpha_dropout(F.selu(self.fc(x)), 0.1)
        """,
        # explicit training=True (MC dropout) and p=0
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                x = torch.nn.functional.dropout(x, 0.2, training=True)
                return torch.nn.functional.dropout(x, 0.0)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            class Net(nn.Module):
                def forward(self, x):
                    x = F.relu(self.fc1(x))
                    x = F.dropout(x, p=0.5)
                    return self.fc2(x)
            """,
            line=7, message="`F.dropout(x, p=0.5)`",
            fixed="""
            import torch.nn as nn
            import torch.nn.functional as F
            class Net(nn.Module):
                def forward(self, x):
                    x = F.relu(self.fc1(x))
                    x = F.dropout(x, p=0.5, training=self.training)
                    return self.fc2(x)
            """,
        ),
        Invalid(
            """
            import torch
            from torch.nn.functional import dropout
            class Block(torch.nn.Module):
                def forward(self, x):
                    return dropout(self.proj(x), self.drop)
            """,
            line=6,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        called = ctx.call_name(node)
        if called not in _FUNCTIONAL_DROPOUT or called.endswith("alpha_dropout"):
            return  # the alpha variants default to ``training=False``: never on in eval (if never on at all)
        fn = ctx.function_def
        if fn is None or ctx.class_def is None or not ctx.is_module_subclass():
            return
        if keyword_arg(node, "training") is not None or len(positional_args(node)) >= 3:
            return
        if any(isinstance(a, (cst.If, cst.IfExp)) and any("training" in n for n in iter_names(a.test))
               for a in ctx.ancestors(node)):
            return  # ``if self.training: x = F.dropout(x, p)``
        p = argument(node, 1, "p")
        if isinstance(p, (cst.Integer, cst.Float)) and float(p.value) == 0.0:
            return
        params = [*fn.params.posonly_params, *fn.params.params]
        replacement = None
        if params and params[0].name.value == "self" and not any(a.star for a in node.args):
            args = list(node.args)
            if args:
                last = args[-1]
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(value=cst.parse_expression("self.training"), keyword=cst.Name("training"),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
            replacement = node.with_changes(args=args)
        self.report(node, f"{code_span(node_text(ctx, node))} has no `training=` argument, and it defaults to `True`: "
                          f"dropout stays on after `model.eval()`, so validation and inference are randomly "
                          f"perturbed; pass `training=self.training` (or use an `nn.Dropout` module)",
                    replacement=replacement)


# ---------------------------------------------------------------------------------------------
# TR514


_GRAD_TYPOS = {"require_grad", "requires_grads", "require_grads", "requries_grad", "requires_gradient"}


class RequiresGradTypo(Rule):
    id = "TR514"
    slug = "requires-grad-typo"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "x.require_grad = ... sets a new attribute; the flag is requires_grad"
    what = """
        Flags assignments to a misspelled `requires_grad` attribute (`p.require_grad = False`,
        `p.requires_grads = False`).
    """
    why = """
        Tensors accept arbitrary Python attributes, so the typo raises nothing: it creates a new,
        meaningless attribute and leaves `requires_grad` unchanged. The layers meant to be frozen
        keep training (or the ones meant to train stay frozen), silently.
    """
    example = """
        for p in backbone.parameters():
            p.require_grad = False
    """
    fix_example = """
        for p in backbone.parameters():
            p.requires_grad = False
    """
    VALID = [
        "import torch\nfor p in backbone.parameters():\n    p.requires_grad = False\n",
        "import torch\nx.requires_grad_(True)\nflags.require_gradients = True\n",
    ]
    INVALID = [
        Invalid("import torch\nfor p in backbone.parameters():\n    p.require_grad = False\n", line=3,
                message="`p.require_grad`",
                fixed="import torch\nfor p in backbone.parameters():\n    p.requires_grad = False\n"),
        Invalid("import torch\nmodel.fc.weight.requires_grads = True\n", line=2,
                fixed="import torch\nmodel.fc.weight.requires_grad = True\n"),
    ]

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        for target in node.targets:
            t = target.target
            if isinstance(t, cst.Attribute) and t.attr.value in _GRAD_TYPOS:
                self.report(t, f"{code_span(node_text(ctx, t))} is not `requires_grad`: the assignment creates a new "
                               f"attribute and leaves gradient tracking unchanged",
                            replacement=t.with_changes(attr=cst.Name("requires_grad")))


# ---------------------------------------------------------------------------------------------
# TR203

# where generated images end: files, grids, TensorBoard, plots
_IMAGE_SINKS = {"save_image", "make_grid", "imshow", "imsave", "add_image", "add_images", "add_video"}
# methods that keep "this is the model's output" (a view, a copy, a scaled version)
_SAME_OUTPUT = {"detach", "cpu", "numpy", "clamp", "clamp_", "mul", "mul_", "add", "add_", "div", "div_", "sub",
                "permute", "squeeze", "unsqueeze", "view", "reshape", "to", "float", "clone", "transpose",
                "contiguous", "tolist"}
_SAMPLING_METHODS = {"sample", "generate", "decode", "forward"}
_TENSOR_FUNCTIONS = ("torch.cat", "torch.stack", "torch.clamp")


class SamplingInTrainMode(Rule):
    id = "TR203"
    source_hint = (re.compile(r"save_image|make_grid|imshow|imsave|add_image|add_video"), re.compile(r"backward"))
    slug = "sampling-in-train-mode"
    category = Category.INFERENCE
    severity = Severity.MEDIUM
    summary = "samples generated for images inside the training loop with autograd on or BatchNorm/dropout in train mode"
    what = """
        Flags a model call inside a training loop (a loop that calls `.backward()`) whose output
        only goes to pictures - `save_image`, `make_grid`, `imshow`, `writer.add_image(s)` - when
        it runs outside `torch.no_grad()`, or while the model, which holds BatchNorm or dropout,
        is still in train mode (no `model.eval()` before it in the loop). The GAN
        `fake = netG(fixed_noise)` snapshot is the typical case.
    """
    why = """
        Outside `no_grad` the sampling pass records a full autograd graph, with every activation,
        that nothing ever backpropagates: memory and time for nothing, kept until the variable is
        overwritten. In train mode BatchNorm normalizes the fixed batch with its own statistics
        and folds them into the running averages the model is evaluated with later, and dropout
        drops units, so the saved samples are not what the model generates.
    """
    example = """
        for i, (real, _) in enumerate(loader):
            ...
            errG.backward()
            optimizerG.step()
            if i % 100 == 0:
                fake = netG(fixed_noise)
                vutils.save_image(fake.detach(), f"fake_{epoch}.png", normalize=True)
    """
    fix_example = """
            if i % 100 == 0:
                netG.eval()
                with torch.no_grad():
                    fake = netG(fixed_noise)
                netG.train()
                vutils.save_image(fake, f"fake_{epoch}.png", normalize=True)
    """
    VALID = [
        """
        import torch
        import torchvision.utils as vutils
        for epoch in range(10):
            for x in loader:
                loss = netG(torch.randn(8, 100)).mean()
                loss.backward()
                opt.step()
            netG.eval()
            with torch.no_grad():
                fake = netG(fixed_noise)
            netG.train()
            vutils.save_image(fake, "fake.png")
        """,
        # the output is trained on, then also saved
        """
        import torch
        from torchvision.utils import save_image
        for x, _ in loader:
            fake = G(torch.randn(64, 100))
            g_loss = criterion(D(fake), ones)
            g_loss.backward()
            opt.step()
            save_image(fake.detach(), "fake.png")
        """,
        # a model without BatchNorm or dropout, under no_grad: eval() would change nothing
        """
        import torch
        import torch.nn as nn
        from torchvision.utils import save_image
        G = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh())
        for x in loader:
            G(x).mean().backward()
            opt.step()
            with torch.no_grad():
                save_image(G(z).view(-1, 1, 28, 28), "sample.png")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torchvision.utils as vutils
            for epoch in range(25):
                for i, data in enumerate(dataloader):
                    errG = criterion(netD(netG(noise)), label)
                    errG.backward()
                    optimizerG.step()
                    if i % 100 == 0:
                        fake = netG(fixed_noise)
                        vutils.save_image(fake.detach(), "fake_samples_%03d.png" % epoch, normalize=True)
            """,
            line=10, message="`netG(fixed_noise)`",
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torchvision.utils import make_grid
            G = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 784))
            for x in loader:
                G(x).mean().backward()
                opt.step()
                with torch.no_grad():
                    writer.add_image("samples", make_grid(G(z).view(-1, 1, 28, 28)), step)
            """,
            line=10, message="train mode",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        # (call, what it calls, outermost loop, autograd on, named like a model)
        self.candidates: list[tuple[cst.Call, cst.BaseExpression, cst.CSTNode, bool, bool]] = []

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _SAMPLING_METHODS:
            func = func.value
        if dotted_name(func) is None or ctx.qualified_name(func) is not None:
            return
        stack = loop_stack(ctx)
        if not stack or not any(loop_trains(loop, ctx) for loop in stack):
            return
        # where the output goes is known only once the walk has seen the statements after this one
        self.candidates.append((node, func, stack[0], not ctx.in_no_grad(), is_model_call(func, ctx)))

    def end_file(self, ctx: FileContext) -> None:
        if not self.candidates:
            return
        trained = {dotted_name(node.func.value) for node in subtree(ctx.module)
                   if isinstance(node, cst.Call) and method_name(node) == "parameters"
                   and isinstance(node.func, cst.Attribute)} - {None}  # optimizers are built over models
        for node, model, loop, recording, model_like in self.candidates:
            if not (model_like or dotted_name(model) in trained) or not self._only_pictured(node, ctx):
                continue
            train_mode = not self._evaluated_before(model, node, loop, ctx) and changes_in_eval(ctx, model, node)
            if recording or train_mode:
                self._report(node, model, recording, train_mode, ctx)

    def _report(self, node: cst.Call, model: cst.BaseExpression, recording: bool, train_mode: bool,
                ctx: FileContext) -> None:
        problems = []
        if recording:
            problems.append("outside `torch.no_grad()` it records an autograd graph nothing backpropagates")
        if train_mode:
            problems.append(f"`{node_text(ctx, model)}` is in train mode, so its BatchNorm/dropout layers act as in "
                            f"training (batch statistics, running averages updated from this batch, units dropped)")
        fix = " and ".join(part for part, wanted in (
            (f"`{node_text(ctx, model)}.eval()`", train_mode), ("`with torch.no_grad():`", recording)) if wanted)
        self.report(node, f"{code_span(node_text(ctx, node))} generates samples for pictures inside the training loop: "
                          f"{'; '.join(problems)}; use {fix} around it (and `.train()` after)")

    def _only_pictured(self, node: cst.Call, ctx: FileContext) -> bool:
        """Every path of the output ends in an image sink (and at least one does)."""
        end = self._follow(node, ctx)
        if isinstance(end, cst.Call):
            return True
        if not isinstance(end, cst.Name):
            return False
        statement = ctx.statement_of(node)
        line = ctx.parent(statement)
        block = ctx.parent(line)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return False
        later = list(block.body)[list(block.body).index(line) + 1:]
        pictured = False
        for following in later:
            for use in subtree(following):
                parent = ctx.parent(use)
                if isinstance(use, cst.Name) and use.value == end.value and not isinstance(parent, cst.AssignTarget) \
                        and not (isinstance(parent, cst.Attribute) and parent.attr is use):
                    if not isinstance(self._follow(use, ctx), cst.Call):
                        return False
                    pictured = True
            if any(isinstance(n, cst.AssignTarget) and dotted_name(n.target) == end.value for n in subtree(following)):
                break  # rebound: later uses read another value
        return pictured

    @staticmethod
    def _follow(expr: cst.CSTNode, ctx: FileContext) -> Optional[cst.CSTNode]:
        """Follow an output up through views and copies: the image sink call it ends in, the Name it is assigned
        to, or None when it goes anywhere else."""
        current = expr
        while True:
            parent = ctx.parent(current)
            if isinstance(parent, cst.Attribute) and parent.value is current:
                call = ctx.parent(parent)
                if parent.attr.value == "data":
                    current = parent
                elif isinstance(call, cst.Call) and call.func is parent and parent.attr.value in _SAME_OUTPUT:
                    current = call
                else:
                    return None
            elif isinstance(parent, (cst.Subscript, cst.BinaryOperation, cst.Element, cst.List, cst.Tuple)):
                current = parent
            elif isinstance(parent, cst.Arg):
                call = ctx.parent(parent)
                if not isinstance(call, cst.Call):
                    return None
                name = dotted_name(call.func) or ""
                if name.rsplit(".", 1)[-1] in _IMAGE_SINKS:
                    return call
                if ctx.qualified_name(call.func) in _TENSOR_FUNCTIONS or (
                        isinstance(call.func, cst.Name) and ctx.binding(call.func.value) is not None
                        and ctx.binding(call.func.value).kind == "def"):
                    current = call  # torch.cat([real, fake]) / denorm(fake)
                else:
                    return None
            elif isinstance(parent, cst.Assign) and parent.value is current and len(parent.targets) == 1 and \
                    isinstance(parent.targets[0].target, cst.Name):
                return parent.targets[0].target
            else:
                return None

    @staticmethod
    def _evaluated_before(model: cst.BaseExpression, node: cst.CSTNode, loop: cst.CSTNode,
                          ctx: FileContext) -> bool:
        wanted = node_text(ctx, model)
        for earlier in subtree(loop):
            if earlier is node:
                return False
            if isinstance(earlier, cst.Call) and method_name(earlier) == "eval" and isinstance(
                    earlier.func, cst.Attribute) and node_text(ctx, earlier.func.value) == wanted:
                return True
        return False


# ---------------------------------------------------------------------------------------------
# TR114

# Layers without parameters: putting one in place of a layer leaves nothing untrained.
_PARAMETERLESS = {"Identity", "Flatten", "Unflatten", "ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Mish", "ELU",
                  "SELU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Softplus", "Hardswish", "Hardsigmoid",
                  "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "MaxPool1d", "MaxPool2d",
                  "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
                  "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "Upsample"}
# ``model.fc.in_features``: sizes read from the old layer to build the new one (no module is reused).
_LAYER_METADATA = {"in_features", "out_features", "in_channels", "out_channels", "num_features", "embedding_dim",
                   "num_embeddings", "hidden_size", "input_size", "shape", "dtype", "device", "weight", "bias",
                   "kernel_size", "stride", "padding", "normalized_shape"}
_BRANCHES = (cst.If, cst.Else, cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Match)


def _assigned_path(target: cst.BaseExpression) -> Optional[str]:
    """``model.classifier`` for ``model.classifier[6] = ...`` / ``model.classifier = ...``."""
    while isinstance(target, cst.Subscript):
        target = target.value
    return dotted_name(target) if isinstance(target, cst.Attribute) else None


def _covers(prefix: str, path: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _scope_statements(scope: cst.CSTNode):
    """The nodes of ``scope`` in source order, without the bodies of nested functions, classes and lambdas."""
    stack = [scope]
    while stack:
        node = stack.pop()
        yield node
        if node is not scope and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(reversed(node.children))


class OptimizerBuiltBeforeModelReplaced(Rule):
    id = "TR114"
    slug = "optimizer-built-before-layer-replaced"
    category = Category.TRAINING
    severity = Severity.HIGH
    summary = "a layer (or the model) replaced after the optimizer collected its parameters: the new weights never train"
    source_hint = (re.compile(r"optim"), re.compile(r"parameters\s*\("))
    what = """
        Flags `model.fc = nn.Linear(...)` (a new layer with parameters assigned into the model, or
        `model = Net()` rebinding the model to a new one) after `optimizer = torch.optim.X(model.parameters())`
        was built in the same function, cell sequence or script, when that optimizer is then stepped
        or handed to a training function and is neither rebuilt nor given the new parameters
        (`add_param_group`) in between. Wrapping the model (`DDP(model)`, `model.to(device)`,
        `torch.compile(model)`) keeps its parameters and is fine, and so is a layer the optimizer
        never covered (`optimizer` over `model.fc.parameters()`, then `model.conv1 = ...`).
    """
    why = """
        An optimizer keeps references to the parameter tensors it was given. A layer created
        afterwards has new tensors the optimizer has never seen: `optimizer.step()` keeps updating
        the old, detached layer, and the new one stays at its random initialization for the whole
        run. Fine-tuning code that swaps the classifier head after building the optimizer trains
        a frozen random head, and nothing fails.
    """
    example = """
        model = models.resnet18(weights="DEFAULT")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model.fc = nn.Linear(model.fc.in_features, num_classes)
        train(model, optimizer)
    """
    fix_example = """
        model = models.resnet18(weights="DEFAULT")
        model.fc = nn.Linear(model.fc.in_features, num_classes)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(model, optimizer)
    """
    VALID = [
        # built after the replacement
        """
        import torch
        import torch.nn as nn
        model.fc = nn.Linear(model.fc.in_features, 10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(model, optimizer)
        """,
        # rebuilt before it is used again
        """
        import torch
        import torch.nn as nn
        optimizer = torch.optim.Adam(model.parameters())
        model.classifier = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 2))
        optimizer = torch.optim.Adam(model.classifier.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        # wrappers keep the parameters; a parameterless layer adds none; the old optimizer is never used again
        """
        import torch
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        model = model.to(device)
        model = DDP(model, device_ids=[rank])
        model.module.head_drop = nn.Identity()
        model.features = nn.Sequential(*list(model.features.children())[:-1])
        train(model, opt)
        model = torch.load("best.pt")
        evaluate(model)
        """,
        # a layer outside the optimized part; the new parameters added explicitly
        """
        import torch
        import torch.nn as nn
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
        model.conv1 = nn.Conv2d(1, 64, 7)
        model.head = nn.Linear(512, 10)
        optimizer.add_param_group({"params": model.head.parameters()})
        train(model, optimizer)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torchvision import models
            model = models.resnet18(weights="DEFAULT")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            model.fc = nn.Linear(model.fc.in_features, 10)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            """,
            line=7, message="`optimizer` was built over `model.parameters()`",
        ),
        Invalid(
            """
            import torch
            from torch import optim
            def main(args):
                model = Net()
                opt = optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=args.lr)
                if args.resume:
                    model = Net.from_checkpoint(args.resume)
                train(model, opt, args.epochs)
            """,
            line=8, message="`model`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.creations: dict[int, tuple[str, cst.Assign, cst.Call]] = {}  # id(assign) -> (name, assign, call)
        self.scopes: list[cst.CSTNode] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        if len(node.targets) != 1 or not isinstance(node.value, cst.Call):
            return
        name = dotted_name(node.targets[0].target)
        qualified = ctx.call_name(node.value) or ""
        if name is None or not qualified.startswith("torch.optim.") or ".lr_scheduler" in qualified:
            return
        self.creations[id(node)] = (name, node, node.value)
        scope = ctx.function if ctx.function is not None else ctx.module
        if not any(s is scope for s in self.scopes):
            self.scopes.append(scope)

    def end_file(self, ctx: FileContext) -> None:
        for scope in self.scopes:
            self._scan(scope, ctx)

    def _scan(self, scope: cst.CSTNode, ctx: FileContext) -> None:
        built: dict[str, tuple[cst.Assign, set[str]]] = {}  # optimizer -> (creation, parameter prefixes)
        collections: dict[str, list[cst.CSTNode]] = {}  # ``params`` -> where it was filled
        pending: list[tuple[str, cst.CSTNode, str, cst.Assign, str]] = []  # opt, site, what, creation, prefix
        for node in _scope_statements(scope):
            if isinstance(node, cst.Assign):
                if id(node) in self.creations:
                    name, _, call = self.creations[id(node)]
                    pending = [p for p in pending if p[0] != name]  # rebuilt before any use
                    prefixes = self._prefixes(call, collections, ctx)
                    if prefixes:
                        built[name] = (node, prefixes)
                    else:
                        built.pop(name, None)
                    continue
                for target in node.targets:
                    self._note_collection(target.target, node, collections)
                    site = self._replacement(target.target, node.value)
                    if site is None:
                        continue
                    path, what = site
                    for opt, (creation, prefixes) in built.items():
                        prefix = next((p for p in sorted(prefixes) if _covers(p, path) or
                                       (what == "model" and _covers(path, p))), None)
                        if prefix is not None and self._same_path(creation, node, ctx):
                            pending.append((opt, node, what, creation, prefix))
            elif isinstance(node, (cst.AugAssign, cst.Call)):
                if isinstance(node, cst.AugAssign):
                    self._note_collection(node.target, node, collections)
                    continue
                method = method_name(node)
                receiver = dotted_name(call_receiver(node)) if call_receiver(node) is not None else None
                if method in ("append", "extend") and receiver is not None:
                    collections.setdefault(receiver, []).append(node)
                if method == "add_param_group" and receiver is not None:
                    pending = [p for p in pending if p[0] != receiver]
                    continue
                for opt in {p[0] for p in pending}:
                    if self._trains_with(node, opt):
                        for entry in [p for p in pending if p[0] == opt]:
                            if not self._exclusive(entry[1], node, ctx):
                                self._report(entry, ctx)
                                pending.remove(entry)

    @staticmethod
    def _note_collection(target: cst.BaseExpression, node: cst.CSTNode,
                         collections: dict[str, list[cst.CSTNode]]) -> None:
        name = dotted_name(target)
        if name is not None:
            collections.setdefault(name, []).append(node)

    def _prefixes(self, call: cst.Call, collections: dict[str, list[cst.CSTNode]], ctx: FileContext) -> set[str]:
        """The modules whose ``.parameters()`` the optimizer is built over (through a ``params`` list too)."""
        found: set[str] = set()
        seen: set[str] = set()
        work: list[cst.CSTNode] = [arg.value for arg in call.args if arg.keyword is None or
                                   arg.keyword.value == "params"]
        while work:
            expr = work.pop()
            for node in subtree(expr):
                if isinstance(node, cst.Call) and method_name(node) in ("parameters", "named_parameters"):
                    receiver = call_receiver(node)
                    name = dotted_name(receiver) if receiver is not None else None
                    if name is not None:
                        found.add(name)
                elif isinstance(node, cst.Name) and node.value in collections and node.value not in seen:
                    seen.add(node.value)
                    for filled in collections[node.value]:
                        work.append(filled)
                        loop = next((a for a in ctx.ancestors(filled) if isinstance(a, cst.For)), None)
                        if loop is not None:
                            work.append(loop.iter)
        return found

    @staticmethod
    def _replacement(target: cst.BaseExpression, value: cst.BaseExpression) -> Optional[tuple[str, str]]:
        """``(path, "layer")`` for a new layer stored into a model, ``(name, "model")`` for a new model bound."""
        if not isinstance(value, cst.Call):
            return None
        callee = dotted_name(value.func)
        if callee is None:
            return None
        last = callee.rsplit(".", 1)[-1]
        path = _assigned_path(target)
        if path is not None:
            if not last[:1].isupper() or last in _PARAMETERLESS:
                return None  # a tensor, a helper's result, or a layer without weights
            root = path.split(".", 1)[0]
            for used in iter_names(value):
                if (used == root or used.startswith(root + ".")) and used.rsplit(".", 1)[-1] not in _LAYER_METADATA:
                    return None  # built from the model's own layers: their parameters stay in the optimizer
            return path, "layer"
        name = dotted_name(target)
        if name is None or not isinstance(target, (cst.Name, cst.Attribute)):
            return None
        if any(used == name or used.startswith(name + ".") for used in iter_names(value)):
            return None  # ``model = DDP(model)`` / ``model = model.to(device)``: the same parameters
        if last in ("load", "deepcopy") or callee.startswith("torch.optim") or "optim" in last.lower():
            return None  # a whole model read back (after training, for testing) is not a layer swap
        owner = callee.rsplit(".", 2)[-2] if "." in callee else ""
        if not last[:1].isupper() and not owner[:1].isupper() and \
                not callee.startswith(("models.", "torchvision.", "timm.")):
            return None  # ``model = build(cfg)`` may return the same object; constructors (``Net.from_...``) are sure
        return name, "model"

    @staticmethod
    def _trains_with(call: cst.Call, opt: str) -> bool:
        """``opt.step()`` / ``opt.zero_grad()``, ``scaler.step(opt)``, or ``train(model, opt)``."""
        receiver = call_receiver(call)
        if receiver is not None and dotted_name(receiver) == opt:
            return method_name(call) in ("step", "zero_grad")
        if not any(dotted_name(arg.value) == opt for arg in call.args):
            return False
        return isinstance(call.func, cst.Name) or method_name(call) == "step"

    @staticmethod
    def _branch_path(node: cst.CSTNode, ctx: FileContext) -> list[cst.CSTNode]:
        return [a for a in ctx.ancestors(node) if isinstance(a, _BRANCHES) or isinstance(a, cst.IndentedBlock)]

    def _same_path(self, creation: cst.CSTNode, site: cst.CSTNode, ctx: FileContext) -> bool:
        """Every branch the optimizer was built in also holds ``site`` (not ``if a: opt = ... else: swap``)."""
        around_site = {id(a) for a in ctx.ancestors(site)}
        return all(id(a) in around_site for a in ctx.ancestors(creation) if isinstance(a, _BRANCHES))

    def _exclusive(self, first: cst.CSTNode, second: cst.CSTNode, ctx: FileContext) -> bool:
        """``first`` and ``second`` sit in different arms of one ``if`` / ``try`` / ``match``."""
        first_chain = [first, *ctx.ancestors(first)]
        around_second = {id(a): a for a in ctx.ancestors(second)}
        for below, ancestor in zip(first_chain, first_chain[1:]):
            if id(ancestor) in around_second:
                if not isinstance(ancestor, (cst.If, cst.Try, cst.TryStar, cst.Match)):
                    return False
                second_chain = [second, *ctx.ancestors(second)]
                other = second_chain[second_chain.index(ancestor) - 1]
                return other is not below and not (isinstance(ancestor, cst.If) and below is ancestor.test)
        return False

    def _report(self, entry: tuple[str, cst.CSTNode, str, cst.Assign, str], ctx: FileContext) -> None:
        opt, site, what, creation, prefix = entry
        built = f"`{opt}` was built over `{prefix}.parameters()`"
        if what == "layer":
            message = (f"{code_span(short(ctx, site))} puts a new layer into the model after {built}: the optimizer "
                       f"still holds the replaced layer's tensors, so {code_span(opt + '.step()')} never updates the "
                       f"new weights and they keep their random initialization; build the optimizer after the model "
                       f"is final (or add them with {code_span(opt + '.add_param_group(...)')})")
        else:
            name = dotted_name(site.targets[0].target) if isinstance(site, cst.Assign) else prefix
            message = (f"{code_span(short(ctx, site))} binds `{name}` to a new model after {built}: the optimizer "
                       f"keeps updating the old model's tensors, and the new model never trains; build the optimizer "
                       f"after this line")
        self.report(site, message, related=[(creation, f"`{opt}` built here")])
