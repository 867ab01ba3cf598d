"""TR404 log-of-softmax: torch.log(softmax(x)) instead of log_softmax(x)."""
from __future__ import annotations

from typing import Optional
import libcst as cst

from analyzers.context import (
    FileContext,
    short,
    argument,
    keyword_arg)
from analyzers.markdown import code_span
from analyzers.program.names import last_name
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.activations import Act as _Act, activation_of


class LogOfSoftmax(Rule):
    id = "TR404"
    slug = "log-of-softmax"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "torch.log(softmax(x)) instead of log_softmax(x)"
    what = """
        Flags `torch.log(...)` / `.log()` applied directly to a softmax output
        (`F.softmax`, `torch.softmax`, `x.softmax(dim)`, an `nn.Softmax` module), inline or
        through a variable. A log taken after adding an epsilon or clamping is not flagged.
    """
    why = """
        softmax underflows to exactly 0 for strongly negative logits, and `log(0)` is `-inf`,
        which turns the loss and every gradient into NaN. `log_softmax` computes the same
        value with the log-sum-exp trick: it is exact, stable and faster.
    """
    example = """
        log_probs = torch.log(F.softmax(logits, dim=1))
    """
    fix_example = """
        log_probs = F.log_softmax(logits, dim=1)
    """
    VALID = [
        """
        import torch
        import torch.nn.functional as F
        log_probs = F.log_softmax(logits, dim=1)
        """,
        # an epsilon or a clamp is an intentional guard
        """
        import torch
        import torch.nn.functional as F
        probs = F.softmax(logits, dim=1)
        ent = -(probs * torch.log(probs + 1e-8)).sum(1)
        """,
        """
        import torch
        probs = torch.softmax(logits, -1)
        lp = probs.clamp(min=1e-6).log()
        """,
        # log of something else; math.log is not a tensor op
        """
        import math
        import torch
        x = torch.log(torch.exp(a) + 1)
        y = math.log(softmax_temperature)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            log_probs = torch.log(F.softmax(logits, dim=1))
            """,
            line=4, message="F.log_softmax",
            fixed="""
            import torch
            import torch.nn.functional as F
            log_probs = F.log_softmax(logits, dim=1)
            """,
        ),
        Invalid(
            """
            import torch
            lp = torch.log(x.softmax(-1))
            """,
            line=3,
            fixed="""
            import torch
            lp = x.log_softmax(-1)
            """,
        ),
        Invalid(
            """
            import torch as th
            lp = th.softmax(scores, dim=-1).log()
            """,
            line=3,
            fixed="""
            import torch as th
            lp = th.log_softmax(scores, dim=-1)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            probs = F.softmax(logits, dim=-1)
            kl = (probs * torch.log(probs)).sum(-1)
            """,
            line=5, message="`probs`",
        ),
        Invalid(
            """
            import torch
            from torch.nn.functional import softmax
            lp = torch.log(softmax(x, dim=1))
            """,
            line=4,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if last_name(func) != "log":
            return
        qualified = ctx.qualified_name(func)
        if qualified == "torch.log":
            if len(node.args) > 2 or any(a.star for a in node.args):
                return
            value = argument(node, 0, "input")
            form = "function"
        elif qualified is None and isinstance(func, cst.Attribute) and not node.args:
            value = func.value
            form = "method"
        else:
            return
        act = activation_of(value, ctx, node)
        if act is None or act.kind != "softmax":
            return
        log_text = "torch.log(...)" if form == "function" else ".log()"
        if act.inline:
            subject = f"{code_span(short(ctx, act.producer))}"
        else:
            subject = f"{code_span(short(ctx, value))} (from {code_span(short(ctx, act.producer))})"
        replacement = self._fix(node, act, ctx) if act.inline and keyword_arg(node, "out") is None else None
        suggestion = short(ctx, replacement) if replacement is not None else "log_softmax(...)"
        self.report(node, f"{log_text} of the softmax output {subject}: softmax underflows to 0 and log(0) "
                          f"gives -inf/NaN gradients; use {suggestion}, which is exact and stable",
                    replacement=replacement)

    @staticmethod
    def _fix(log_call: cst.Call, act: _Act, ctx: FileContext) -> Optional[cst.Call]:
        call = act.producer
        func = call.func
        if act.form == "method" and isinstance(func, cst.Attribute):
            new_func = func.with_changes(attr=cst.Name("log_softmax"))
        elif act.form == "function" and isinstance(func, cst.Attribute) and func.attr.value == "softmax":
            new_func = func.with_changes(attr=cst.Name("log_softmax"))
        elif act.form == "function" and isinstance(func, cst.Name):
            wanted = (ctx.qualified_name(func) or "").rsplit(".", 1)[0] + ".log_softmax"
            local = next((n for n, q in ctx.imports.names.items() if q == wanted), None)
            if local is None:
                return None
            new_func = cst.Name(local)
        else:
            return None
        return call.with_changes(func=new_func, lpar=log_call.lpar, rpar=log_call.rpar)
