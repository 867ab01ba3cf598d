"""TR112 eval-without-train: model.eval() inside or before the training loop, and .train() is never called."""
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
from analyzers.program.library import Does, training_libraries_that
from analyzers.program.loops import body_nodes, loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.values import (builds_optimizer, changes_in_eval)
from analyzers.rules.base import Invalid, Rule


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
