"""TR511 hidden-state-not-detached: RNN hidden state carried across training batches without .detach()."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    iter_names,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.library import Does, method_does, method_returns_same_module
from analyzers.program.loops import body_nodes, loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.modules import ModuleFacts
from analyzers.program.values import calls_recurrent_module, is_model_call, model_class
from analyzers.rules.base import Invalid, Rule


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
        points into the previous batches' graphs. Also a model whose class (or one of its submodules, in this
        repository) keeps the state itself: its `forward` reads what the previous call stored in an attribute
        and stores a submodule's new output there, outside no-grad and not detached, while the training loop
        never assigns into the model, calls a method of it that may reset it, or hands it to a function.
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
        # a module that keeps its state between calls, detached by the loop after each step
        """
        import torch
        import torch.nn as nn
        class Drifting(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.cell = nn.GRUCell(n, n)
                self.state = None
            def forward(self, x):
                self.state = self.cell(x, self.state)
                return self.state
        net = Drifting(8)
        for x, y in batches:
            ((net(x) - y) ** 2).mean().backward()
            opt.step()
            net.state = net.state.detach()
        """,
        # an attribute set and read within one forward pass: nothing passes to the next call
        """
        import torch
        import torch.nn as nn
        class Probe(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(4, 4)
                self.head = nn.Linear(4, 1)
            def forward(self, x):
                self.features = self.body(x)
                return self.head(self.features)
        probe = Probe()
        for x, y in batches:
            ((probe(x) - y) ** 2).mean().backward()
            opt.step()
        """,
        # the state is kept under no_grad: no graph to carry
        """
        import torch
        import torch.nn as nn
        class Tracker(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 4)
                self.avg = None
            def forward(self, x):
                out = self.proj(x)
                with torch.no_grad():
                    self.avg = out.mean(0) if self.avg is None else 0.9 * self.avg + 0.1 * self.proj(x).mean(0)
                return out
        tracker = Tracker()
        for x in batches:
            tracker(x).sum().backward()
            opt.step()
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
        # the recurrent state lives inside the module: each forward pass starts from the one the previous call
        # stored, and nothing in the loop detaches or resets it
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Memory(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.cell = nn.GRUCell(n, n)
                    self.h = None
                def forward(self, x):
                    if self.h is None:
                        self.h = torch.zeros(x.size(0), x.size(1))
                    self.h = self.cell(x, self.h)
                    return self.h
            class Forecaster(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.memory = Memory(16)
                    self.out = nn.Linear(16, 1)
                def forward(self, x):
                    return self.out(self.memory(x))
            model = Forecaster()
            for epoch in range(50):
                total = 0
                for x, y in windows:
                    total = total + ((model(x) - y) ** 2).mean()
                total.backward(retain_graph=True)
                opt.step()
                opt.zero_grad()
            """,
            line=25, message="keeps a tensor from one forward pass to the next",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[tuple[cst.Assign, list[str], cst.CSTNode]] = []
        self.model_calls: list[tuple[cst.Call, tuple]] = []  # forward passes in loops, for the state kept inside

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        stack = loop_stack(ctx)
        if stack and isinstance(node.func, (cst.Name, cst.Attribute)) and is_model_call(node.func, ctx):
            self.model_calls.append((node, stack))

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
        if passed and calls_recurrent_module(node.value.func, ctx):
            self.candidates.append((node, passed, stack[-1]))

    def end_file(self, ctx: FileContext) -> None:
        self._state_kept_inside(ctx)
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

    def _state_kept_inside(self, ctx: FileContext) -> None:
        """A model whose class (or a submodule of it, in this repository) keeps a tensor from one forward to the
        next (``self.h`` computed by a submodule and read back): called in a loop that trains, whose body never
        sets, resets or detaches anything of the model, the next ``backward()`` reaches into the previous
        iterations' graphs."""
        reported: set[tuple[int, str]] = set()
        for call, stack in self.model_calls:
            model = dotted_name(call.func)
            cls = model_class(ctx, call.func, call)
            if model is None or cls is None or "carries-state" not in (ctx.facts(ModuleFacts).features(cls) or ()):
                continue
            training = [loop for loop in stack if loop_trains(loop, ctx)]
            if not training or any(_touches_model(loop, model.split(".")[0], call) for loop in training):
                continue
            key = (id(training[0]), model)
            if key in reported:
                continue
            reported.add(key)
            self.report(call, f"{code_span(model)} ({code_span(cls)}) keeps a tensor from one forward pass to the "
                              f"next (its `forward`, or a submodule's, stores state computed by a layer and reads it "
                              f"back), and this training loop never resets or detaches it: each `backward()` reaches "
                              f"into the previous iterations' graphs (an error, or with `retain_graph=True` ever "
                              f"slower steps); detach the kept state after each step",
                        severity=Severity.MEDIUM)

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


def _flat_names(expr: cst.CSTNode) -> list[str]:
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, (cst.Tuple, cst.List)):
        out: list[str] = []
        for element in expr.elements:
            out.extend(_flat_names(element.value))
        return out
    return []


# what a loop may call on a model without touching the state its modules keep, besides the methods that return
# the module itself (``to``, ``train``; not ``apply``, which runs a function on each submodule) and its traversals
_READ_ONLY_METHODS = frozenset({"zero_grad", "state_dict", "forward"})


def _keeps_state(method: str) -> bool:
    return method in _READ_ONLY_METHODS or method_does(method, Does.RETURNS_ITERATOR) or \
        (method_returns_same_module(method) and method != "apply")


def _touches_model(loop: cst.CSTNode, root: str, forward: cst.Call) -> bool:
    """The loop's body may reset what the model keeps: it assigns into the model (``model.rnn.h = ...``), calls
    one of its methods (``model.reset()``), hands the model to a function, or builds it anew."""
    for node in body_nodes(loop):
        if node is forward:
            continue
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                if any((dotted_name(t) or "").split(".")[0] == root for t in _flat_targets(target)):
                    return True
        elif isinstance(node, cst.Call):
            name = dotted_name(node.func) or ""
            if "." in name and name.split(".")[0] == root and not _keeps_state(name.rsplit(".", 1)[1]):
                return True
            if any((dotted_name(arg.value) or "").split(".")[0] == root for arg in node.args):
                return True
    return False


def _flat_targets(expr: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(expr, (cst.Tuple, cst.List)):
        return [t for element in expr.elements for t in _flat_targets(element.value)]
    return [expr]
