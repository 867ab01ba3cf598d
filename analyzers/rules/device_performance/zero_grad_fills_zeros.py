"""TR729 zero-grad-fills-zeros: zero_grad(set_to_none=False) writes zeros into every gradient instead of freeing
them (TorchFix's TOR402; runs only when selected)."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


def _set_to_none(call: cst.Call) -> cst.Arg | None:
    """The ``set_to_none`` argument of ``zero_grad`` (keyword, or its only positional parameter)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "set_to_none":
            return arg
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[0] if len(positional) == 1 else None


class ZeroGradFillsZeros(Rule):
    id = "TR729"
    opt_in = True
    slug = "zero-grad-fills-zeros"
    category = Category.DEVICE
    severity = Severity.LOW
    speed_only = True
    fix_safety = "unsafe"  # code that reads `.grad` between zero_grad and backward gets None instead of zeros
    source_hint = re.compile(r"set_to_none\s*=\s*False|zero_grad\(\s*False")
    summary = "zero_grad(set_to_none=False) writes zeros into every gradient instead of freeing it (TorchFix's TOR402)"
    what = """
        Flags `optimizer.zero_grad(set_to_none=False)` and `model.zero_grad(set_to_none=False)`. It runs
        only when selected (`--select TR729` or TorchFix's `TOR402`): `set_to_none=False` is sometimes
        deliberate, in code that reads `.grad` between zeroing and the next backward.
    """
    why = """
        With `set_to_none=False` every parameter's gradient is overwritten with zeros each step (one
        memset kernel per tensor), and the next backward adds into them; with the default since
        PyTorch 2.0, `set_to_none=True`, the gradients are freed and backward writes them afresh,
        which saves the memset and the memory between steps.
    """
    example = """
        optimizer.zero_grad(set_to_none=False)
    """
    fix_example = """
        optimizer.zero_grad()  # set_to_none=True, the default
    """
    VALID = [
        """
        import torch
        optimizer.zero_grad()
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=keep_zeros)
        """,
        # not torch's zero_grad: a plain function of the same name
        """
        import torch
        def reset(grads, set_to_none=False):
            pass
        reset(grads, set_to_none=False)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad(set_to_none=False)
                loss_fn(model(x), y).backward()
                optimizer.step()
            """,
            line=4, message="`optimizer.zero_grad(set_to_none=False)`",
            fixed="""
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            model.zero_grad(False)
            """,
            line=3,
            fixed="""
            import torch
            model.zero_grad()
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not isinstance(node.func, cst.Attribute) or node.func.attr.value != "zero_grad":
            return
        arg = _set_to_none(node)
        if arg is None or not (isinstance(arg.value, cst.Name) and arg.value.value == "False"):
            return
        self.report(node, f"{code_span(short(ctx, node))} writes zeros into every gradient, one kernel per "
                          f"parameter, and keeps their memory between steps; the default `set_to_none=True` frees "
                          f"them and backward writes them afresh (TorchFix's TOR402, selected)",
                    replacement=node.with_changes(args=[a for a in node.args if a is not arg]))
