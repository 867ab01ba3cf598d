"""TR821 legacy-autograd-function: torch.autograd.Function with an instance-method forward: a legacy API that now
raises.
"""
from __future__ import annotations

import libcst as cst

from analyzers.context import (FileContext, dotted_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule


_AUTOGRAD_FUNCTION = {"torch.autograd.Function", "torch.autograd.function.Function"}


class LegacyAutogradFunction(Rule):
    id = "TR821"
    syntactic = True
    slug = "legacy-autograd-function"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "torch.autograd.Function with an instance-method forward: a legacy API that now raises"
    what = """
        Flags subclasses of `torch.autograd.Function` whose `forward` (or `backward`) is an
        ordinary method instead of a `@staticmethod` taking `ctx`.
    """
    why = """
        Old-style autograd functions (`self.save_for_backward`, `MyFn()(x)`) were deprecated in
        PyTorch 1.3 and then removed: calling one raises `RuntimeError: Legacy autograd function
        with non-static forward method is deprecated`, so the layer that uses it crashes on the
        first forward pass.
    """
    example = """
        class Clamp(torch.autograd.Function):
            def forward(self, x):
                self.save_for_backward(x)
                return x.clamp(0, 1)
            def backward(self, grad):
                x, = self.saved_tensors
                return grad * ((x > 0) & (x < 1))
        y = Clamp()(x)
    """
    fix_example = """
        class Clamp(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.clamp(0, 1)
            @staticmethod
            def backward(ctx, grad):
                x, = ctx.saved_tensors
                return grad * ((x > 0) & (x < 1))
        y = Clamp.apply(x)
    """
    VALID = [
        """
        import torch
        class Swish(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * torch.sigmoid(x)
            @staticmethod
            def backward(ctx, grad):
                x, = ctx.saved_tensors
                s = torch.sigmoid(x)
                return grad * (s * (1 + x * (1 - s)))
        """,
        """
        import torch
        from torch import nn
        class Net(nn.Module):
            def forward(self, x):
                return x
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            class Clamp(torch.autograd.Function):
                def forward(self, x):
                    self.save_for_backward(x)
                    return x.clamp(0, 1)
                @staticmethod
                def backward(ctx, grad):
                    return grad
            """,
            line=4, message="`Clamp.forward`",
        ),
        Invalid(
            """
            import torch
            from torch.autograd import Function
            class Round(Function):
                @staticmethod
                def forward(ctx, x):
                    return x.round()
                def backward(self, grad):
                    return grad
            """,
            line=8, message="`Round.backward`",
        ),
    ]

    def visit_ClassDef(self, node: cst.ClassDef, ctx: FileContext) -> None:
        if not any(ctx.qualified_name(base.value) in _AUTOGRAD_FUNCTION for base in node.bases):
            return
        if not isinstance(node.body, cst.IndentedBlock) or not ctx.facts(VersionFacts).admits("torch", (1, 5)):
            return
        for statement in node.body.body:
            if not isinstance(statement, cst.FunctionDef) or statement.name.value not in ("forward", "backward"):
                continue
            decorators = {dotted_name(d.decorator) for d in statement.decorators}
            if decorators & {"staticmethod", "classmethod"}:
                continue
            name = f"{node.name.value}.{statement.name.value}"
            self.report(statement.name, f"{code_span(name)} is an instance method: legacy autograd Functions "
                                        f"(non-static `forward`/`backward`, called as {code_span(node.name.value + '()(x)')}) raise "
                                        f"RuntimeError on current PyTorch; make both `@staticmethod`s taking `ctx` "
                                        f"and call {code_span(node.name.value + '.apply(...)')}")
            return
