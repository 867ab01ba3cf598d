"""TR803 deprecated-variable: torch.autograd.Variable is a no-op since PyTorch 0.4."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, is_false, is_true, keyword_arg, short)
from analyzers.markdown import code_span
from analyzers.program.names import parenthesized
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.names import last_name as _last


_VARIABLE = {"torch.autograd.Variable", "torch.autograd.variable.Variable", "torch.Variable"}


class DeprecatedVariable(Rule):
    id = "TR803"
    slug = "deprecated-variable"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "torch.autograd.Variable is a no-op since PyTorch 0.4"
    what = """
        Flags `torch.autograd.Variable(...)` (under any import alias) and its `volatile=True`
        argument.
    """
    why = """
        Since PyTorch 0.4 tensors carry autograd state themselves: `Variable(t)` just returns
        a tensor, and `volatile=True` is ignored with a warning — code relying on it for
        inference now builds the autograd graph and wastes memory. The wrapper only adds noise
        and signals outdated code.
    """
    example = """
        x = Variable(images).cuda()
        w = Variable(torch.randn(3, 3), requires_grad=True)
        out = model(Variable(x, volatile=True))
    """
    fix_example = """
        x = images.cuda()
        w = torch.randn(3, 3).requires_grad_()
        with torch.no_grad():
            out = model(x)
    """
    VALID = [
        """
        import torch
        x = images.cuda()
        w = torch.randn(3, requires_grad=True)
        """,
        # someone else's Variable
        """
        import torch
        from tf_compat import Variable
        v = Variable(3)
        """,
        """
        import torch
        class Variable:
            pass
        v = Variable()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.autograd import Variable
            x = Variable(images).cuda()
            """,
            line=4, message="Variable(images)",
            fixed="""
            import torch
            from torch.autograd import Variable
            x = images.cuda()
            """,
        ),
        Invalid(
            """
            import torch
            w = torch.autograd.Variable(torch.randn(3, 3), requires_grad=True)
            """,
            line=3,
            fixed="""
            import torch
            w = torch.randn(3, 3).requires_grad_()
            """,
        ),
        Invalid(
            """
            import torch
            import torch.autograd as autograd
            y = autograd.Variable(a + b) * 2
            """,
            line=4,
            fixed="""
            import torch
            import torch.autograd as autograd
            y = (a + b) * 2
            """,
        ),
        Invalid(
            """
            import torch
            from torch.autograd import Variable
            out = model(Variable(x, volatile=True))
            """,
            line=4, message="volatile=True",
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        last = _last(node.func)
        if last != "Variable" and ctx.imports.names.get(last or "") not in _VARIABLE:
            return
        if ctx.qualified_name(node.func) not in _VARIABLE:
            return
        shown = short(ctx, node)
        volatile = keyword_arg(node, "volatile")
        if volatile is not None and not is_false(volatile.value):
            self.report(node, f"{code_span(shown)}: `volatile=True` has been ignored since PyTorch 0.4, so this builds the "
                              f"autograd graph anyway; drop Variable and wrap the inference in `with torch.no_grad():`")
            return
        replacement = self._fix(node)
        instead = f"; use {code_span(short(ctx, replacement))}" if replacement is not None else "; use the tensor directly"
        self.report(node, f"{code_span(shown)} uses torch.autograd.Variable, a no-op wrapper since PyTorch 0.4 "
                          f"(tensors track gradients themselves){instead}", replacement=replacement)

    @staticmethod
    def _fix(node: cst.Call) -> Optional[cst.BaseExpression]:
        if any(a.star for a in node.args):
            return None
        allowed = {"data", "requires_grad"}
        if any(a.keyword is not None and a.keyword.value not in allowed for a in node.args):
            return None
        positional = [a for a in node.args if a.keyword is None]
        if len(positional) > 1:
            return None
        data = argument(node, 0, "data")
        if data is None:
            return None
        requires = keyword_arg(node, "requires_grad")
        if requires is None or is_false(requires.value):
            if node.lpar and not data.lpar:
                return data.with_changes(lpar=node.lpar, rpar=node.rpar)
            return parenthesized(data)
        method = cst.Attribute(parenthesized(data), cst.Name("requires_grad_"))
        args = [] if is_true(requires.value) else [cst.Arg(requires.value)]
        return cst.Call(func=method, args=args, lpar=node.lpar, rpar=node.rpar)
