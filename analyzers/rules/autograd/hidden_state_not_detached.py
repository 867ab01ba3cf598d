"""TR511 hidden-state-not-detached: RNN hidden state carried across training batches without .detach()."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (
    FileContext,
    iter_names,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import body_nodes, loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.values import calls_recurrent_module
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
        if passed and calls_recurrent_module(node.value.func, ctx):
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


def _flat_names(expr: cst.CSTNode) -> list[str]:
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, (cst.Tuple, cst.List)):
        out: list[str] = []
        for element in expr.elements:
            out.extend(_flat_names(element.value))
        return out
    return []
