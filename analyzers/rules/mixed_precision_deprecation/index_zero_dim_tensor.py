"""TR816 index-zero-dim-tensor: loss.data[0] indexes a 0-dim tensor: an IndexError since PyTorch 0.5; use loss.item().
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.values import zero_dim_origin
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule


class IndexZeroDimData(Rule):
    id = "TR816"
    syntactic = True
    slug = "index-zero-dim-tensor"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "loss.data[0] indexes a 0-dim tensor: an IndexError since PyTorch 0.5; use loss.item()"
    what = """
        Flags `x.data[0]` where `x` is a scalar: a loss (a name containing "loss", or the result
        of `criterion(...)` / `F.*_loss(...)`) or a full reduction such as `(pred == y).sum()`,
        or what a function of the same file returns when every `return` of it is one: called by
        its name, or through a parameter that each caller fills with such a function (an
        objective closure handed to a line search).
    """
    why = """
        Before PyTorch 0.4 losses were 1-element vectors and `loss.data[0]` read the number.
        Losses are 0-dim tensors now, and indexing one raises `IndexError: invalid index of a
        0-dim tensor. Use tensor.item()`: the training loop crashes on its first log line.
    """
    example = """
        total += loss.data[0]
    """
    fix_example = """
        total += loss.item()
    """
    VALID = [
        """
        import torch
        total += loss.item()
        first = outputs.data[0]
        loss.data[0] += 1
        """,
        # a helper of the file that hands back the network's raw output, a batch: its first row is a real read
        """
        import torch
        def forward_all(net, xs):
            return net(xs)
        top = forward_all(net, xs).data[0]
        """,
        # the function a caller passes may return anything: one caller hands over something unknown
        """
        import torch
        def probe(fn):
            return fn().data[0]
        def mean_cost():
            return costs.mean()
        probe(mean_cost)
        probe(make_fn())
        """,
        # indexing a batch of per-sample losses
        """
        import torch
        losses = criterion_none(out, y)
        worst = losses.data[0]
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                print(loss.data[0])
            """,
            line=6, message="`loss.data[0]`",
            fixed="""
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                print(loss.item())
            """,
        ),
        # the loss object called through an explicit forward(), its result read at index 0
        Invalid(
            """
            import torch
            def train(model, loss, optimizer, x, y):
                optimizer.zero_grad()
                output = loss.forward(model.forward(x), y)
                output.backward()
                optimizer.step()
                return output.data[0]
            """,
            line=8, message="`output.data[0]`",
            fixed="""
            import torch
            def train(model, loss, optimizer, x, y):
                optimizer.zero_grad()
                output = loss.forward(model.forward(x), y)
                output.backward()
                optimizer.step()
                return output.item()
            """,
        ),
        # accumulated into a running total: the read is the value of an augmented assignment
        Invalid(
            """
            import torch
            def evaluate(model, loader):
                total = 0
                for x, y in loader:
                    loss = criterion(model(x), y)
                    total += loss.data[0]
                return total
            """,
            line=7, message="`loss.data[0]`",
            fixed="""
            import torch
            def evaluate(model, loader):
                total = 0
                for x, y in loader:
                    loss = criterion(model(x), y)
                    total += loss.item()
                return total
            """,
        ),
        # an objective closure handed to a search helper, which reads its value the pre-0.4 way
        Invalid(
            """
            import torch
            def backtrack(objective, steps):
                start = objective().data[0]
                return start
            def fit(policy, batch, weights):
                def surrogate():
                    ratio = policy(batch)
                    return (-weights * ratio).mean()
                backtrack(surrogate, 10)
            """,
            line=4, message="what `surrogate` returns",
        ),
        Invalid(
            """
            import torch
            correct = (pred == labels).sum()
            acc = correct.data[0] / total
            """,
            line=4, message="full reduction",
            fixed="""
            import torch
            correct = (pred == labels).sum()
            acc = correct.item() / total
            """,
        ),
    ]

    def visit_Subscript(self, node: cst.Subscript, ctx: FileContext) -> None:
        value = node.value
        if not isinstance(value, cst.Attribute) or value.attr.value != "data" or len(node.slice) != 1:
            return
        index = node.slice[0].slice
        if not isinstance(index, cst.Index) or not isinstance(index.value, cst.Integer) or index.value.value != "0":
            return
        parent = ctx.parent(node)
        # a store into the first element (``x.data[0] = v``, ``x.data[0] += v``) is not a read of a scalar;
        # ``total += loss.data[0]`` reads one
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.AugAssign) and parent.target is node):
            return
        why = zero_dim_origin(value.value, ctx)
        if why is None or not ctx.facts(VersionFacts).admits("torch", (0, 5)):
            return
        replacement = cst.Call(func=cst.Attribute(value.value, cst.Name("item")))
        self.report(node, f"{code_span(short(ctx, node))} indexes {code_span(short(ctx, value.value))}, {why} and so a "
                          f"0-dim tensor: this raises IndexError since PyTorch 0.5; use "
                          f"{code_span(short(ctx, replacement))}", replacement=replacement)
