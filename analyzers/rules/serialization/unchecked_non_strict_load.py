"""TR612 unchecked-non-strict-load: load_state_dict(strict=False) of the program's own checkpoint, result ignored."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext, argument, is_false, keyword_arg, short, string_value)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.payloads import checkpoint_load_of
from analyzers.rules.base import Invalid, Rule


class StrictFalseOnOwnCheckpoint(Rule):
    id = "TR612"
    source_hint = re.compile(r"strict")
    slug = "unchecked-non-strict-load"
    category = Category.SECURITY
    severity = Severity.MEDIUM
    summary = "load_state_dict(strict=False) of the program's own checkpoint, result ignored"
    what = """
        Flags `model.load_state_dict(..., strict=False)` whose result (the missing and
        unexpected keys) is discarded, when the state dict is a checkpoint this program itself
        saved: the architecture is the same, so any mismatch is a bug.
    """
    why = """
        `strict=False` turns every key mismatch into silence. Reloading one's own checkpoint
        should match exactly; when it does not (a `module.` prefix from `DataParallel`, a renamed
        or re-ordered layer) the affected layers keep their random initialization and the
        evaluation that follows measures an untrained model, with no error anywhere. (Loading a
        backbone into a new head is the legitimate use of `strict=False`; this rule leaves
        checkpoints from elsewhere alone.)
    """
    example = """
        torch.save(model.state_dict(), "best.pt")
        ...
        model.load_state_dict(torch.load("best.pt"), strict=False)
    """
    fix_example = """
        model.load_state_dict(torch.load("best.pt"))  # strict: a mismatch raises
        # or, when a partial load is intended:
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
    """
    VALID = [
        """
        import torch
        torch.save(model.state_dict(), "best.pt")
        model.load_state_dict(torch.load("best.pt"))
        """,
        # a pretrained checkpoint from elsewhere
        """
        import torch
        model.load_state_dict(torch.load(args.pretrained), strict=False)
        """,
        # the result is checked
        """
        import torch
        torch.save(model.state_dict(), "best.pt")
        msg = model.load_state_dict(torch.load("best.pt"), strict=False)
        print(msg)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for epoch in range(10):
                train(model)
                torch.save(model.state_dict(), "best.pt")
            model.load_state_dict(torch.load("best.pt"), strict=False)
            """,
            line=6, message="`best.pt`",
        ),
        Invalid(
            """
            import os
            import torch
            path = os.path.join(args.out, "ckpt.pth")
            torch.save({"model": model.state_dict(), "epoch": epoch}, path)
            ckpt = torch.load(path, map_location="cpu")
            model.load_state_dict(ckpt["model"], strict=False)
            """,
            line=7,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "load_state_dict":
            return
        strict = keyword_arg(node, "strict")
        if strict is None or not is_false(strict.value) or not isinstance(ctx.parent(node), cst.Expr):
            return
        load = checkpoint_load_of(argument(node, 0, "state_dict"), ctx)
        if load is None:
            return
        path = argument(load, 0, "f")
        if path is None:
            return
        from analyzers.program import CheckpointWrites

        if not ctx.facts(CheckpointWrites).written_before_loaded(path, ctx.origin(path), same_expression_only=False):
            return
        literal = string_value(path)
        shown = code_span(literal) if literal else code_span(short(ctx, path, 40))
        self.report(node, f"{code_span(short(ctx, node))} reloads {shown}, which this program saved from the same "
                          f"model, with `strict=False` and ignores the returned missing/unexpected keys: a mismatch "
                          f"(a `module.` prefix, a renamed layer) would silently leave those layers untrained; load "
                          f"strictly, or check the keys it returns")
