"""Mixed-precision mechanics: autocast, GradScaler and the order of unscale, clip, step and update.

The facts (which functions run a scaled backward, which scaler names exist, where the steps are) are
collected during the walk and compared in ``end_file``.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, is_false, keyword_arg, method_name, \
    positional_args, string_value
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule
from analyzers.program.library import Does, training_libraries_that
from analyzers.program.names import node_text
from analyzers.program.values import is_optimizer, is_plain_backward

_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
             "torch.cuda.amp.autocast_mode.autocast"}
_AMP_GRAD_SCALER, _AMP_GRAD_SCALER_SINCE = 'torch.amp.GradScaler("cuda")', (2, 3)
_CUDA_GRAD_SCALER = "torch.cuda.amp.GradScaler()"
_CUDA_ONLY = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
_FP16 = {"torch.float16", "torch.half"}
_CLIP = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value"}


def _scaled_backward(call: cst.Call) -> Optional[str]:
    """``scaler`` for ``scaler.scale(loss).backward()``."""
    if not is_plain_backward(call):
        return None
    inner = call.func.value
    if isinstance(inner, cst.Call) and method_name(inner) == "scale" and isinstance(inner.func, cst.Attribute):
        return dotted_name(inner.func.value)
    return None


def _scaler_like(name: Optional[str]) -> bool:
    return bool(name) and "scaler" in name.rsplit(".", 1)[-1].lower()


class AmpFacts:
    """What a file does with GradScaler: collected by the AMP rules' shared visitor, once per file."""

    def __init__(self, ctx: FileContext) -> None:
        self.scaled_backwards: list[tuple[cst.Call, str, object]] = []  # call, scaler, function
        self.scaler_steps: list[tuple[cst.Call, str, object]] = []
        self.scaler_updates: set[str] = set()
        self.unscales: set[object] = set()  # functions calling ``unscale_`` (None: module level)
        self.any_unscale = False
        self.any_scaler = False  # GradScaler built or a ``scale(...)`` used anywhere
        self.plain_steps: list[tuple[cst.Call, str, object]] = []
        self.clips: list[tuple[cst.Call, object]] = []
        self.backwards: list[tuple[cst.Call, object]] = []
        self.order: dict[int, int] = {}  # id(call) -> visit order, for "the backward before this clip"
        self._seen: set[int] = set()

    def note(self, node: cst.Call, ctx: FileContext) -> None:
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        self.order[id(node)] = len(self.order)
        fn = ctx.function
        name = method_name(node)
        qualified = ctx.call_name(node) or ""
        if qualified.endswith("GradScaler") or (dotted_name(node.func) or "").endswith("GradScaler"):
            self.any_scaler = True
        if is_plain_backward(node):
            self.backwards.append((node, fn))
            scaler = _scaled_backward(node)
            if scaler is not None:
                self.any_scaler = True
                self.scaled_backwards.append((node, scaler, fn))
        elif name == "scale" and isinstance(node.func, cst.Attribute):
            self.any_scaler = True
        elif name == "step" and isinstance(node.func, cst.Attribute):
            receiver = dotted_name(node.func.value)
            if _scaler_like(receiver):
                self.scaler_steps.append((node, receiver, fn))
            elif receiver is not None and is_optimizer(node.func.value, ctx) and not node.args:
                self.plain_steps.append((node, receiver, fn))
        elif name == "update" and isinstance(node.func, cst.Attribute):
            receiver = dotted_name(node.func.value)
            if _scaler_like(receiver):
                self.scaler_updates.add(receiver.rsplit(".", 1)[-1])
        elif name == "unscale_":
            self.unscales.add(fn)
            self.any_unscale = True
        elif name in _CLIP and ("clip_grad" in qualified or "utils" in (dotted_name(node.func) or "")
                                or isinstance(node.func, cst.Name)):
            self.clips.append((node, fn))


class _AmpRule(Rule):
    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        ctx.facts(AmpFacts).note(node, ctx)

    def scaling_elsewhere(self, ctx: FileContext) -> bool:
        return any(ctx.imports.imports_root(lib) for lib in training_libraries_that(Does.SCALES_LOSS))


# ---------------------------------------------------------------------------------------------
# TR710


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
        if facts.any_scaler or self.mentions_scaler or self.scaling_elsewhere(ctx):
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


# ---------------------------------------------------------------------------------------------
# TR711


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


# ---------------------------------------------------------------------------------------------
# TR712


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


# ---------------------------------------------------------------------------------------------
# TR713


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
