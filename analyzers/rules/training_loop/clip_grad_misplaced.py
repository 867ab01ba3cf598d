"""TR113 clip-grad-misplaced: gradient clipping after optimizer.step() or before backward() does nothing."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import loop_stack
from analyzers.program.names import node_text
from analyzers.program.values import (is_backward, is_optimizer_step)
from analyzers.rules.base import Invalid, Rule


class ClipGradMisplaced(Rule):
    id = "TR113"
    source_hint = re.compile(r"clip_grad")  # clip_grad_norm_ / clip_grad_value_
    slug = "clip-grad-misplaced"
    category = Category.TRAINING
    severity = Severity.HIGH
    summary = "gradient clipping after optimizer.step() or before backward() does nothing"
    what = """
        Flags `clip_grad_norm_` / `clip_grad_value_` in a training loop when the step that
        precedes it in the iteration is `optimizer.step()` (clipping after the update), or when
        it comes before the iteration's `backward()` with no backward before it (clipping
        the gradients of the previous, already applied, batch).
    """
    why = """
        Clipping only matters between `backward()`, which writes the gradients, and
        `optimizer.step()`, which reads them. Anywhere else it clips gradients that were already
        used (and will be zeroed) or that are about to be overwritten: training runs unclipped
        while the code suggests it is protected against exploding gradients.
    """
    example = """
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    fix_example = """
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    """
    VALID = [
        """
        import torch
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        """,
        # accumulation and AMP
        """
        import torch
        from torch.nn.utils import clip_grad_norm_
        for i, (x, y) in enumerate(loader):
            scaler.scale(loss_fn(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                scaler.unscale_(opt)
                clip_grad_norm_(model.parameters(), max_norm)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        """,
        # two optimizers: clipping G after D's step, before G's
        """
        import torch.nn as nn
        for x in loader:
            d_loss.backward()
            opt_d.step()
            g_loss = gen_loss(x)
            g_loss.backward()
            nn.utils.clip_grad_norm_(G.parameters(), 5.0)
            opt_g.step()
        """,
        # either branch clips between its backward and step
        """
        import torch
        for x, y in loader:
            if use_amp:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                scaler.step(opt)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            """,
            line=8, message="after `optimizer.step()`",
        ),
        Invalid(
            """
            import torch.nn as nn
            def train_epoch(model, opt):
                for batch in loader:
                    opt.zero_grad()
                    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                    loss = model(batch).mean()
                    loss.backward()
                    opt.step()
            """,
            line=6, message="before",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.events: list[tuple[str, cst.Call, tuple]] = []  # kind B/S/C, call, loop stack

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        stack = loop_stack(ctx)
        if not stack:
            return
        if name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value"):
            qualified = ctx.call_name(node) or dotted_name(node.func) or ""
            if "clip_grad" in qualified and (qualified.startswith("torch.") or qualified.startswith("nn.")
                                              or "utils" in qualified or qualified == name):
                self.events.append(("C", node, stack))
        elif is_backward(node, ctx):
            self.events.append(("B", node, stack))
        elif name == "step" and is_optimizer_step(node, ctx):
            self.events.append(("S", node, stack))

    def end_file(self, ctx: FileContext) -> None:
        for index, (kind, call, stack) in enumerate(self.events):
            if kind != "C":
                continue
            loop = next((lp for lp in reversed(stack)
                         if any(k != "C" and lp in s for k, _, s in self.events)), None)
            if loop is None:
                continue
            same = [(k, c) for k, c, s in self.events if loop in s]
            position = next(i for i, (_, c) in enumerate(same) if c is call)
            before = [k for k, _ in same[:position] if k != "C"]
            after = [k for k, _ in same[position + 1:] if k != "C"]
            clip = node_text(ctx, call.func)
            if before and before[-1] == "S" and "S" not in after:
                step = next(c for k, c in reversed(same[:position]) if k == "S")
                self.report(call, f"{code_span(clip)} runs after {code_span(node_text(ctx, step))}: the update already "
                                  f"used the unclipped gradients; clip between `backward()` and the step")
            elif not before and after and after[0] == "B":
                self.report(call, f"{code_span(clip)} runs before this iteration's `backward()`: it clips the "
                                  f"previous batch's (already applied) gradients and the step uses unclipped ones; "
                                  f"clip between `backward()` and the step")
