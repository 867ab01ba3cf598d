"""TR710 fp16-autocast-without-grad-scaler: float16 autocast training without a GradScaler."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, argument, is_false, keyword_arg, positional_args, string_value
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid
from analyzers.program.names import node_text
from analyzers.program.amp import AmpFacts, library_scales_loss
from analyzers.rules.device_performance._amp import AmpRule as _AmpRule


_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
             "torch.cuda.amp.autocast_mode.autocast"}
_AMP_GRAD_SCALER, _AMP_GRAD_SCALER_SINCE = 'torch.amp.GradScaler("cuda")', (2, 3)
_CUDA_GRAD_SCALER = "torch.cuda.amp.GradScaler()"
_CUDA_ONLY = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
_FP16 = {"torch.float16", "torch.half"}


# a float16 forward pass backpropagated without a scaler: which scaler to suggest depends on the pinned torch
_FP16_LOOP = """
    import torch
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = criterion(model(x), y)
        loss.backward()
"""


class Fp16AutocastWithoutScaler(_AmpRule):
    id = "TR710"
    source_hint = re.compile(r"autocast")
    slug = "fp16-autocast-without-grad-scaler"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "float16 autocast training without a GradScaler"
    what = """
        Flags `torch.autocast("cuda")`, `torch.amp.autocast("cuda")` and
        `torch.cuda.amp.autocast()` (all float16 unless `dtype=` says otherwise) around a forward
        pass whose loss is backpropagated in the same function, in a file that never creates or
        uses a `GradScaler`. `dtype=torch.bfloat16` needs no scaler and is not flagged.
    """
    why = """
        float16 has a tiny range: small gradients underflow to zero in the backward pass, so
        layers silently stop learning (and large ones overflow to inf). `GradScaler` multiplies
        the loss before `backward()` and unscales before the step, skipping steps with inf/NaN.
        Without it, fp16 training quietly loses precision or diverges.
    """
    example = """
        for x, y in loader:
            with torch.autocast("cuda"):
                loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    fix_example = """
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            with torch.autocast("cuda"):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """
    VALID = [
        """
        import torch
        scaler = torch.cuda.amp.GradScaler()
        for x, y in loader:
            with torch.cuda.amp.autocast():
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        """,
        # bfloat16 needs no scaler
        """
        import torch
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        """,
        # inference only
        """
        import torch
        from torch.cuda.amp import autocast
        @torch.no_grad()
        def predict(model, x):
            with autocast():
                return model(x)
        """,
        # CPU autocast is bfloat16; a dtype from the configuration is not guessed
        """
        import torch
        def train_step(model, x, ptdtype):
            with torch.autocast(device_type="cpu"):
                model(x).sum().backward()
            with torch.amp.autocast(device_type="cuda", dtype=ptdtype):
                model(x).sum().backward()
        """,
        # the scaler is created elsewhere and passed in
        """
        import torch
        def train_one_epoch(model, loader, optimizer, loss_scaler):
            for x, y in loader:
                with torch.cuda.amp.autocast():
                    loss = criterion(model(x), y)
                loss_scaler(loss, optimizer, parameters=model.parameters())
        """,
        # explicitly disabled
        """
        import torch
        with torch.autocast("cuda", enabled=False):
            loss = model(x).sum()
        loss.backward()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                with torch.autocast("cuda"):
                    loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=5, message="`torch.autocast(\"cuda\")`",
        ),
        # which scaler to use depends on the torch the repository pins, and the message says which it assumed
        Invalid(
            _FP16_LOOP,
            line=4, message='`torch.amp.GradScaler("cuda")` (no torch pin found; assuming a current torch',
        ),
        Invalid(
            _FP16_LOOP,
            requirements="torch==1.13.1\n",
            line=4, message="`torch.cuda.amp.GradScaler()` (torch==1.13.1 per requirements.txt",
        ),
        Invalid(
            _FP16_LOOP,
            requirements="torch>=2.4\n",
            line=4, message='`torch.amp.GradScaler("cuda")` (torch>=2.4 per requirements.txt',
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                with torch.cuda.amp.autocast(enabled=args.amp):
                    loss = criterion(model(x), y)
                loss.backward()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast
            def train(model, loader, opt):
                for x, y in loader:
                    with autocast(dtype=torch.float16):
                        out = model(x)
                        loss = F.cross_entropy(out, y)
                    loss.backward()
                    opt.step()
            """,
            line=6,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.autocasts: list[tuple[cst.Call, object]] = []
        self.mentions_scaler = False

    def visit_With(self, node: cst.With, ctx: FileContext) -> None:
        for item in node.items:
            call = item.item
            if isinstance(call, cst.Call) and self._fp16(call, ctx):
                self.autocasts.append((call, ctx.function))

    def visit_Name(self, node: cst.Name, ctx: FileContext) -> None:
        if "scaler" in node.value.lower():
            self.mentions_scaler = True

    @staticmethod
    def _fp16(call: cst.Call, ctx: FileContext) -> bool:
        qualified = ctx.call_name(call)
        if qualified not in _AUTOCAST:
            return False
        enabled = keyword_arg(call, "enabled")
        if enabled is not None and is_false(enabled.value):
            return False
        dtype = keyword_arg(call, "dtype")
        if dtype is not None:
            return ctx.qualified_name(dtype.value) in _FP16
        if qualified in _CUDA_ONLY:
            return not positional_args(call)
        device = argument(call, 0, "device_type")
        return string_value(device) == "cuda" and len(positional_args(call)) <= 1

    def end_file(self, ctx: FileContext) -> None:
        facts = ctx.facts(AmpFacts)
        if facts.any_scaler or self.mentions_scaler or library_scales_loss(ctx):
            return
        training = {id(fn) for _, fn in facts.backwards}
        versions = ctx.facts(VersionFacts)
        # torch.amp.GradScaler is torch 2.3's; a repository pinned below it has only torch.cuda.amp's
        scaler = _AMP_GRAD_SCALER if versions.admits("torch", _AMP_GRAD_SCALER_SINCE) else _CUDA_GRAD_SCALER
        for call, fn in self.autocasts:
            if id(fn) not in training:
                continue
            self.report(call, f"{code_span(node_text(ctx, call))} runs the forward pass in float16 and its loss is "
                              f"backpropagated without a `GradScaler`: small gradients underflow to zero and large "
                              f"ones overflow; scale the loss with `{scaler}` ({versions.assumption('torch')}; or "
                              f"use `dtype=torch.bfloat16`, which needs no scaler)")
