"""TR111 accumulated-loss-not-scaled: gradient accumulation without dividing the loss by the accumulation steps."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    iter_names,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.loops import AccumulationFacts
from analyzers.rules.base import Invalid, Rule


class AccumulatedLossNotScaled(Rule):
    id = "TR111"
    source_hint = (re.compile(r"backward"), re.compile(r"\.step\s*\("), re.compile(r"%|[+-]="))  # backward every batch, step under ``% N`` or a count
    slug = "accumulated-loss-not-scaled"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    summary = "gradient accumulation without dividing the loss by the accumulation steps"
    what = """
        Flags gradient accumulation - `backward()` on every batch, `optimizer.step()` only
        under `if (i + 1) % accum_steps == 0` or once a counter of micro-batches reaches
        `accum_steps` - when the loss is never divided by the number of
        accumulation steps (`accum_steps` appears in no division in the file).
    """
    why = """
        `.grad` is the sum of the accumulated micro-batch gradients, so each update is
        `accum_steps` times larger than one full-batch step: the effective learning rate (and the
        norm that gradient clipping compares against) silently grows with the accumulation
        setting, and changing it changes the training dynamics.
    """
    example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    fix_example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    VALID = [
        """
        import torch
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        """
        import torch
        for step, batch in enumerate(loader):
            loss = model(**batch).loss
            loss = loss / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        """,
        """
        import torch
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss /= self.accumulate
            loss.backward()
            if i % self.accumulate == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
        """,
        """
        import torch
        for i, batch in enumerate(loader):
            loss = model(batch).mean()
            loss.div_(n_accum).backward()
            if (i + 1) % n_accum == 0:
                opt.step()
                opt.zero_grad()
        """,
        # a counter of micro-batches reaching the count, with the loss divided
        """
        import torch
        micro = 0
        for x, y in loader:
            loss = criterion(model(x), y) / cfg.accumulation_steps
            loss.backward()
            micro += 1
            if micro == cfg.accumulation_steps:
                optimizer.step()
                optimizer.zero_grad()
                micro = 0
        """,
        # a logging interval, not accumulation
        """
        import torch
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if i % log_interval == 0:
                print(loss.item())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=6, message="`accum_steps`",
        ),
        Invalid(
            """
            import torch
            def train(args):
                for epoch in range(args.epochs):
                    for step, batch in enumerate(loader):
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            loss = model(**batch).loss
                        loss.backward()
                        if step % args.gradient_accumulation_steps == 0:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                            opt.step()
                            opt.zero_grad()
            """,
            line=9,
        ),
        # the same accumulation counted by hand: a counter of micro-batches reaches the count
        Invalid(
            """
            import torch
            pending = 0
            for x, y in loader:
                criterion(model(x), y).backward()
                pending += 1
                if pending >= self.accumulate_every:
                    opt.step()
                    opt.zero_grad()
                    pending = 0
            """,
            line=7, message="`self.accumulate_every`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.divided: set[str] = set()

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        ctx.facts(AccumulationFacts).note_if(node, ctx)

    def visit_BinaryOperation(self, node: cst.BinaryOperation, ctx: FileContext) -> None:
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            self.divided.update(n.rsplit(".", 1)[-1] for n in iter_names(node.right))

    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        if isinstance(node.operator, cst.DivideAssign):
            self.divided.update(n.rsplit(".", 1)[-1] for n in iter_names(node.value))

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) in ("div", "div_", "true_divide", "true_divide_", "divide"):
            for arg in node.args:
                self.divided.update(n.rsplit(".", 1)[-1] for n in iter_names(arg.value))

    def end_file(self, ctx: FileContext) -> None:
        for step in ctx.facts(AccumulationFacts).steps:
            divisor = dotted_name(step.divisor) or ""
            if divisor.rsplit(".", 1)[-1] in self.divided:
                continue
            self.report(step.node.test, f"gradients are accumulated over {code_span(divisor)} micro-batches but the "
                                        f"loss is never divided by {code_span(divisor)}: each update is that many "
                                        f"times larger than one batch's, so the effective learning rate (and what "
                                        f"clipping compares against) grows with the accumulation setting; divide the "
                                        f"loss by {code_span(divisor)} before `backward()`")
