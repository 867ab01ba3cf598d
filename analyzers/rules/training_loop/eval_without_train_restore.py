"""TR108 eval-without-train-restore: helper switches the model to eval() and the training loop never switches back."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    argument,
    call_receiver,
    dotted_name,
    is_false,
    method_name)
from analyzers.program.loops import LoopStack, loop_stack
from analyzers.program.modules import ModuleFacts
from analyzers.program.values import (BACKWARD_METHODS, changes_in_eval)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.values import optimizer_step as _optimizer_step
from analyzers.program.loops import enclosing_function_name as _fn_name, closure as _closure


_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")

@dataclass
class _Helper:
    name: str
    params: list  # parameter names, ``self``/``cls`` dropped for methods
    is_method: bool
    targets: list  # dotted names put into eval mode (params resolved at the call site)
    node: Optional[cst.FunctionDef]  # None for a function of another file


class EvalWithoutTrainRestore(Rule):
    id = "TR108"
    # a training loop (the helper that evals may be in another file)
    source_hint = re.compile(r"backward|\.step\s*\(")
    slug = "eval-without-train-restore"
    category = Category.TRAINING
    severity = Severity.HIGH
    requires = "torch"
    summary = "helper switches the model to eval() and the training loop never switches back"
    what = """
        Flags a call, inside a training loop (a loop that calls `.backward()` or steps an
        optimizer), to a function (of the same file, or of the repository) that puts a module into eval mode
        (`model.eval()` / `model.train(False)`) and never restores training mode, when the loop
        itself never calls `.train()` on each iteration. Quiet when the model is known to hold no dropout, no
        batch norm with running statistics and no code reading `self.training`: eval() changes nothing in it.
    """
    why = """
        `eval()` is sticky. After the first validation, every later training step runs with
        dropout disabled and BatchNorm using (and no longer updating) its running statistics,
        so the model trains differently from what the code suggests - usually worse, and
        without any error.
    """
    example = """
        def validate(model):
            model.eval()
            ...
            return acc

        model.train()
        for epoch in range(epochs):
            for x, y in loader:
                ...
                loss.backward()
                optimizer.step()
            validate(model)
    """
    fix_example = """
        for epoch in range(epochs):
            model.train()
            for x, y in loader:
                ...
                loss.backward()
                optimizer.step()
            validate(model)
    """
    VALID = [
        # the model holds no dropout and no batch norm: eval() changes nothing in it
        """
        import torch
        from torch import nn
        def check(net, loader):
            net.eval()
            with torch.no_grad():
                return sum(net(x).argmax(1).eq(y).sum().item() for x, y in loader)
        net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net.train()
        for epoch in range(10):
            for x, y in train_loader:
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
            check(net, val_loader)
        """,
        # train() at the top of each epoch
        """
        import torch
        def validate(model, loader):
            model.eval()
            with torch.no_grad():
                return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader)
        for epoch in range(10):
            model.train()
            for x, y in train_loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
            validate(model, val_loader)
        """,
        # the helper restores the previous mode
        """
        import torch
        def evaluate(model, loader):
            was_training = model.training
            model.eval()
            acc = score(model, loader)
            model.train(was_training)
            return acc
        for epoch in range(10):
            for x, y in train_loader:
                criterion(model(x), y).backward()
                opt.step()
            evaluate(model, val_loader)
        """,
        # training happens in a helper that sets train() itself
        """
        import torch
        def train_one_epoch(model, loader, opt):
            model.train()
            for x, y in loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
        def validate(model):
            model.eval()
            return 0.0
        for epoch in range(10):
            train_one_epoch(model, loader, opt)
            validate(model)
        """,
        # trainer methods: train() called after validation inside the loop
        """
        import torch
        class Trainer:
            def validate(self):
                self.model.eval()
                return self.metric()
            def fit(self):
                for step, batch in enumerate(self.loader):
                    loss = self.model(batch).mean()
                    loss.backward()
                    self.optimizer.step()
                    if step % 100 == 0:
                        self.validate()
                        self.model.train()
        """,
        # the evaluated model is an EMA copy that is not trained in the loop
        """
        import torch
        def evaluate(model):
            model.eval()
            return 1.0
        for x, y in loader:
            criterion(model(x), y).backward()
            opt.step()
            ema.update(model)
            evaluate(ema_model)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def validate(model, loader):
                model.eval()
                correct = 0
                with torch.no_grad():
                    for x, y in loader:
                        correct += model(x).argmax(1).eq(y).sum().item()
                return correct
            model.train()
            for epoch in range(10):
                for x, y in train_loader:
                    opt.zero_grad()
                    criterion(model(x), y).backward()
                    opt.step()
                acc = validate(model, val_loader)
            """,
            line=16, message="validate()",
        ),
        # a trainer class with mid-epoch validation
        Invalid(
            """
            import torch
            class Trainer:
                def evaluate(self):
                    self.model.eval()
                    with torch.no_grad():
                        return self.metric(self.model)
                def fit(self):
                    self.model.train()
                    for epoch in range(self.epochs):
                        for step, (x, y) in enumerate(self.loader):
                            loss = self.criterion(self.model(x), y)
                            self.optimizer.zero_grad()
                            loss.backward()
                            self.optimizer.step()
                            if step % 500 == 0:
                                self.evaluate()
            """,
            line=17, message="self.model",
        ),
        # train(False) and a helper defined after its caller
        Invalid(
            """
            import torch
            def main(net, loader, optimizer):
                net.train()
                while True:
                    for x, y in loader:
                        loss = loss_fn(net(x), y)
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad()
                    test(net)
            def test(model):
                model.train(False)
                return 0
            """,
            line=11, message="net",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.helpers: dict[str, list[_Helper]] = {}
        self.evals: dict[int, list[str]] = {}  # id(FunctionDef) -> eval targets
        self.trainers_direct: set = set()  # function names that call .train()
        self.calls: dict[str, set] = {}
        # facts about calls inside loops: (call, name, loops, fn, used dotted names)
        self.loop_calls: list[tuple[cst.Call, str, LoopStack, object, frozenset]] = []
        self.training: list[tuple[LoopStack, object]] = []  # backward/step calls
        self.train_calls: list[tuple[LoopStack, object]] = []  # X.train() inside loops

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None:
            return
        fn_name = _fn_name(ctx)
        if fn_name is not None:
            self.calls.setdefault(fn_name, set()).add(name)
        receiver = call_receiver(node)
        mode_call = None
        if receiver is not None and name == "eval" and not node.args:
            mode_call = "eval"
        elif receiver is not None and name == "train":
            mode_call = "eval" if is_false(argument(node, 0, "mode")) else "train"
        if mode_call == "train":
            if fn_name is not None:
                self.trainers_direct.add(fn_name)
        elif mode_call == "eval" and ctx.function_def is not None:
            target = dotted_name(receiver)
            if target is not None:
                origin = ctx.origin(receiver)
                binding = ctx.binding(target)
                if origin is not receiver and isinstance(origin, (cst.Name, cst.Attribute)):
                    if binding is not None and binding.kind in ("assign", "annassign"):
                        target = dotted_name(origin) or target
                        binding = ctx.binding(target)
                root = target.split(".", 1)[0]
                local = ctx.scopes[-1].bindings.get(root)
                # a helper's own local (``for m in model.modules(): m.eval()``) is not the caller's model
                if local is None or local.kind == "param" or root in ("self", "cls"):
                    self.evals.setdefault(id(ctx.function_def), []).append(target)
        if not ctx.loops:
            return
        stack = loop_stack(ctx)
        if not stack:
            return
        if mode_call == "train":
            self.train_calls.append((stack, ctx.function))
        if name in BACKWARD_METHODS or name == "step" and _optimizer_step(node, ctx) is not None:
            self.training.append((stack, ctx.function))
        used = set()
        func_name = dotted_name(node.func)
        if func_name is not None:
            used.add(func_name)
        if receiver is not None:
            receiver_name = dotted_name(receiver)
            if receiver_name is not None:
                used.add(receiver_name)
        for arg in node.args:
            arg_name = dotted_name(arg.value)
            if arg_name is not None:
                used.add(arg_name)
        self.loop_calls.append((node, name, stack, ctx.function, frozenset(used)))

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        targets = self.evals.pop(id(node), None)
        if not targets:
            return
        params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        is_method = bool(ctx.classes) and ctx.parent(ctx.parent(node) or node) is ctx.classes[-1]
        if is_method and params and params[0] in ("self", "cls"):
            params = params[1:]
        kw = [p.name.value for p in node.params.kwonly_params]
        targets = [t for t in targets if t.split(".", 1)[0] not in ("self", "cls") or "." in t]
        if targets:
            self.helpers.setdefault(node.name.value, []).append(
                _Helper(node.name.value, params + kw, is_method, targets, node))

    def end_file(self, ctx: FileContext) -> None:
        if not self.training:
            return
        trainers = _closure(self.trainers_direct, self.calls)
        self._by_loop: dict[int, list] = {}
        for entry in self.loop_calls:
            for lp in entry[2]:
                self._by_loop.setdefault(id(lp), []).append(entry)
        for call, name, stack, fn, _ in self.loop_calls:
            candidates = self.helpers.get(name) or self._imported_helper(call, name, ctx)
            if not candidates or name in trainers:
                continue
            func = call.func
            is_method_call = isinstance(func, cst.Attribute) and dotted_name(func.value) in ("self", "cls")
            if not (isinstance(func, cst.Name) or is_method_call):
                continue
            helper = next((h for h in candidates if h.is_method == is_method_call), None)
            if helper is None:
                continue
            obj = self._evaluated_object(helper, call)
            if obj is None:
                continue
            if any(self._restored_in(loop, fn, trainers) for loop in stack):
                continue  # ``model.train()`` somewhere in an enclosing loop re-runs every iteration
            if _DOTTED.fullmatch(obj) and not changes_in_eval(ctx, cst.parse_expression(obj), call):
                continue  # no dropout, no batch norm, nothing reading self.training: eval() changes nothing
            for loop in stack:
                if self._training_loop(loop, fn) and self._used_in(loop, fn, obj, call):
                    self.report(call, (
                        f"{name}() puts {obj} into eval mode ({obj}.eval()) and never switches it back, and this "
                        f"training loop keeps training {obj} after the call without calling {obj}.train(): every "
                        f"later step runs with dropout off and BatchNorm frozen; call {obj}.train() at the start "
                        f"of each iteration or restore the mode in {name}()"))
                    break

    @staticmethod
    def _imported_helper(call: cst.Call, name: str, ctx: FileContext) -> list[_Helper]:
        """``from evaluate import eval_net``: a function of another file of the repository that leaves its argument
        in eval mode."""
        binding = ctx.binding(name, call)
        if not isinstance(call.func, cst.Name) or (binding is not None and binding.kind != "import"):
            return []
        found = ctx.facts(ModuleFacts).eval_helper(name)
        return [_Helper(name, found[0], False, found[1], None)] if found is not None else []

    @staticmethod
    def _evaluated_object(helper: _Helper, call: cst.Call) -> Optional[str]:
        for target in helper.targets:
            root, _, rest = target.partition(".")
            if root in helper.params:
                index = helper.params.index(root)
                arg = argument(call, index, root)
                name = dotted_name(arg) if arg is not None else None
                if name is not None:
                    return f"{name}.{rest}" if rest else name
                continue
            if root in ("self", "cls") and not helper.is_method:
                continue
            return target
        return None

    def _training_loop(self, loop, fn) -> bool:
        return any(f is fn and any(lp is loop for lp in stack) for stack, f in self.training)

    def _restored_in(self, loop, fn, trainers: set) -> bool:
        if any(f is fn and any(lp is loop for lp in stack) for stack, f in self.train_calls):
            return True
        return any(f is fn and name in trainers for _, name, _, f, _ in self._by_loop.get(id(loop), ()))

    def _used_in(self, loop, fn, obj: str, call: cst.Call) -> bool:
        return any(other is not call and f is fn and obj in used
                   for other, _, _, f, used in self._by_loop.get(id(loop), ()))
