"""TR711 grad-scaler-plain-step: loss scaled by a GradScaler but the optimizer is stepped directly."""
from __future__ import annotations

import re

from analyzers.context import FileContext
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.program.amp import AmpFacts
from analyzers.rules.device_performance._amp import AmpRule as _AmpRule


class ScalerWithPlainStep(_AmpRule):
    id = "TR711"
    source_hint = re.compile(r"GradScaler|\.scale\(")
    slug = "grad-scaler-plain-step"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "loss scaled by a GradScaler but the optimizer is stepped directly"
    what = """
        Flags `optimizer.step()` in a function that runs `scaler.scale(loss).backward()` when
        the file never calls `scaler.step(optimizer)`.
    """
    why = """
        After `scaler.scale(loss).backward()` the gradients are multiplied by the loss scale
        (65536 at the start). `optimizer.step()` applies them as they are - updates thousands of
        times too large, and steps with inf/NaN gradients are not skipped. `scaler.step()`
        unscales first and skips non-finite steps.
    """
    example = """
        scaler.scale(loss).backward()
        optimizer.step()
    """
    fix_example = """
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    VALID = [
        """
        import torch
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            scaler.scale(model(x).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
        """,
        # the plain step is the non-AMP branch
        """
        import torch
        for x in loader:
            if use_amp:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            for x, y in loader:
                optimizer.zero_grad()
                with torch.autocast("cuda"):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                optimizer.step()
                scaler.update()
            """,
            line=9, message="`optimizer.step()`",
        ),
        Invalid(
            """
            import torch
            def step(self, batch):
                self.grad_scaler.scale(self.model(batch)).backward()
                self.optim.step()
                self.optim.zero_grad()
            """,
            line=5, message="`self.grad_scaler.step(self.optim)`",
        ),
    ]

    def end_file(self, ctx: FileContext) -> None:
        facts = ctx.facts(AmpFacts)
        if facts.scaler_steps:
            return
        for call, opt, fn in facts.plain_steps:
            scaler = next((s for _, s, f in facts.scaled_backwards if f is fn), None)
            if scaler is None:
                continue
            self.report(call, f"{code_span(opt + '.step()')} applies gradients that {code_span(scaler)} scaled up "
                              f"(by 65536 at the start): the updates are far too large and inf/NaN steps are not "
                              f"skipped; call {code_span(f'{scaler}.step({opt})')} and then "
                              f"{code_span(scaler + '.update()')}")
