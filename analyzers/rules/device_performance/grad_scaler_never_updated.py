"""TR712 grad-scaler-never-updated: scaler.step(optimizer) without scaler.update()."""
from __future__ import annotations

import re

from analyzers.context import FileContext
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.program.amp import AmpFacts
from analyzers.rules.device_performance._amp import AmpRule as _AmpRule


class ScalerNeverUpdated(_AmpRule):
    id = "TR712"
    source_hint = re.compile(r"GradScaler|\.scale\(")
    slug = "grad-scaler-never-updated"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "scaler.step(optimizer) without scaler.update()"
    what = """
        Flags `scaler.step(optimizer)` when nothing in the file calls `update()` on that scaler.
    """
    why = """
        `update()` is what adapts the loss scale: it lowers it after a step with inf/NaN
        gradients and raises it after a run of good steps. Without it the scale never changes -
        after one overflow every following step is skipped (the model stops training), or the
        scale stays far from the best one.
    """
    example = """
        scaler.scale(loss).backward()
        scaler.step(optimizer)
    """
    fix_example = """
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    VALID = [
        """
        import torch
        for x in loader:
            scaler.scale(model(x).sum()).backward()
            scaler.step(opt)
            scaler.update()
        """,
        # updated by a helper of the same file
        """
        import torch
        def finish(self):
            self.scaler.update()
        def train_step(self, loss):
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.finish()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                optimizer.zero_grad()
                scaler.scale(model(x).sum()).backward()
                scaler.step(optimizer)
            """,
            line=7, message="`scaler`",
        ),
        Invalid(
            """
            import torch
            class Trainer:
                def step(self, loss):
                    self.amp_scaler.scale(loss).backward()
                    self.amp_scaler.step(self.optimizer)
            """,
            line=6,
        ),
    ]

    def end_file(self, ctx: FileContext) -> None:
        facts = ctx.facts(AmpFacts)
        if not facts.scaled_backwards:
            return
        for call, scaler, _ in facts.scaler_steps:
            if scaler.rsplit(".", 1)[-1] in facts.scaler_updates:
                continue
            self.report(call, f"{code_span(scaler)} steps the optimizer but {code_span(scaler + '.update()')} is "
                              f"never called: the loss scale never adapts, so after one overflow every later step "
                              f"is skipped; call {code_span(scaler + '.update()')} after each step")
