"""TR713 clip-grad-without-unscale: gradients clipped while still scaled by the GradScaler (no scaler.unscale_ first).
"""
from __future__ import annotations

import re

from analyzers.context import FileContext
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.program.names import node_text
from analyzers.program.amp import AmpFacts
from analyzers.rules.device_performance._amp import AmpRule as _AmpRule


class ClipWithoutUnscale(_AmpRule):
    id = "TR713"
    source_hint = re.compile(r"GradScaler|\.scale\(")
    slug = "clip-grad-without-unscale"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "gradients clipped while still scaled by the GradScaler (no scaler.unscale_ first)"
    what = """
        Flags `clip_grad_norm_` / `clip_grad_value_` in a function that runs
        `scaler.scale(loss).backward()` when the file never calls `scaler.unscale_(optimizer)`.
    """
    why = """
        Until `unscale_`, the gradients are multiplied by the loss scale (65536 at the start).
        Clipping them to `max_norm=1.0` then shrinks every update by the whole scale factor,
        or - with `clip_grad_value_` - clips almost everything: the threshold no longer means
        what it says, and the effective learning rate changes whenever the scale changes.
    """
    example = """
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
    """
    fix_example = """
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
    """
    VALID = [
        """
        import torch
        for x in loader:
            scaler.scale(model(x).sum()).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        """,
        # the plain branch clips unscaled gradients (the AMP one has another bug: TR713 flags it once)
        """
        import torch
        def step(loss):
            if use_amp:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
        """,
        """
        import torch
        from torch.nn.utils import clip_grad_norm_
        def step(loss):
            loss.backward()
            clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        def amp_step(loss):
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x in loader:
                scaler.scale(model(x).sum()).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
            """,
            line=5, message="`scaler.unscale_(opt)`",
        ),
        Invalid(
            """
            import torch.nn as nn
            def train_step(self, loss):
                self.scaler.scale(loss).backward()
                nn.utils.clip_grad_value_(self.model.parameters(), 0.5)
                self.scaler.step(self.optimizer)
                self.scaler.update()
            """,
            line=5,
        ),
    ]

    def end_file(self, ctx: FileContext) -> None:
        facts = ctx.facts(AmpFacts)
        if facts.any_unscale:
            return
        scalers = {id(c): s for c, s, _ in facts.scaled_backwards}
        for call, fn in facts.clips:
            # the backward this clip follows: the last one before it in the same function
            earlier = [c for c, f in facts.backwards if f is fn and facts.order[id(c)] < facts.order[id(call)]]
            if not earlier or id(earlier[-1]) not in scalers:
                continue
            scaler = scalers[id(earlier[-1])]
            step = next((c for c, s, f in facts.scaler_steps if f is fn and s == scaler), None)
            opt = "optimizer"
            if step is not None and step.args:
                opt = node_text(ctx, step.args[0].value)
            self.report(call, f"{code_span(node_text(ctx, call.func))} clips gradients that {code_span(scaler)} has "
                              f"scaled up (by 65536 at the start): the threshold is meaningless and the updates "
                              f"shrink by the scale factor; call {code_span(f'{scaler}.unscale_({opt})')} "
                              f"before clipping")
