"""TR802 half-precision-training: model/inputs cast with .half() for training instead of autocast + GradScaler."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, short, string_value)
from analyzers.markdown import code_span
from analyzers.program.flow import assigned_name
from analyzers.program.library import MASTER_WEIGHTS_LAST_NAMES, Does, does
from analyzers.program.loops import batch_of_training_loop
from analyzers.program.names import last_name
from analyzers.program.values import is_optimizer, optimized_names
from analyzers.model import Category, Severity
from analyzers.program.roles import collects_tests
from analyzers.rules.base import Invalid, Rule


_FP16 = {"torch.float16", "torch.half"}
_FP16_TYPES = _FP16 | {"torch.HalfTensor", "torch.cuda.HalfTensor"}
_AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
             "torch.cuda.amp.autocast_mode.autocast", "torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast")
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _cast_receiver(cast: cst.Call) -> Optional[str]:
    """``unet`` for ``unet.to("cuda").to(torch.float16)``; None when the chain starts from a call (``Net().half()``)."""
    receiver = cast.func.value if isinstance(cast.func, cst.Attribute) else None
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value
    return dotted_name(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None


@dataclass
class _HalfCast:
    node: cst.Call
    function: Optional[cst.FunctionDef]
    function_count: int  # training steps already seen in that function when the cast ran
    global_count: int
    loops: tuple
    batch: bool  # the cast is of a batch a training loop iterates, not of the model
    module: Optional[str] = None  # the name of what is cast (``unet``), or of what holds it (``unet = UNet().half()``)


class HalfPrecisionTraining(Rule):
    id = "TR802"
    slug = "half-precision-training"
    category = Category.DEPRECATION
    severity = Severity.MEDIUM
    summary = "model/inputs cast with .half() for training instead of autocast + GradScaler"
    what = """
        Flags `.half()`, `.to(torch.float16)`, `.to(dtype=torch.half)` and
        `.type(torch.HalfTensor)` casts in code that trains: a function (or, at module level,
        a script) that calls `.backward()` or `optimizer.step()` after the cast or in the same
        loop. Casts under `torch.no_grad()` / `inference_mode()`, inside autocast blocks and in
        functions that never train are not flagged.
    """
    why = """
        Training with float16 weights and activations loses small gradient updates to
        underflow and accumulates rounding error in the weights (an update smaller than
        2^-11 of a weight is simply lost), so training diverges or plateaus; `GradScaler` even
        refuses fp16 parameters. `torch.autocast` keeps float32 master weights and runs only
        the safe ops in float16, with `GradScaler` handling loss scaling.
    """
    example = """
        model = Net().cuda().half()
        for x, y in loader:
            loss = criterion(model(x.half()), y)
            loss.backward()
            optimizer.step()
    """
    fix_example = """
        model = Net().cuda()
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """
    VALID = [
        # inference only
        """
        import torch
        model = Net().cuda().half().eval()
        with torch.no_grad():
            out = model(x.half())
        """,
        # casts under no_grad inside a training function
        """
        import torch
        def train(model, loader, optimizer):
            for x, y in loader:
                loss = model(x, y)
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                preds = model(val_x.half())
        """,
        # a training function with autocast; a separate export helper that halves
        """
        import torch
        def train(model, x, optimizer):
            with torch.autocast("cuda"):
                loss = model(x.half()).sum()
            loss.backward()
            optimizer.step()
        def export(model):
            return model.half()
        """,
        # a half-precision copy for the checkpoint, a round trip, a profiler matching the input dtype
        """
        import torch
        from copy import deepcopy
        for epoch in range(3):
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            ckpt = {"model": deepcopy(model).half(), "ema": deepcopy(ema.ema).half()}
            model.half().float()
            m = m.half() if x.dtype is torch.float16 else m
        """,
        # halving for a checkpoint after training has finished
        """
        import torch
        def train(model, loader, optimizer):
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            torch.save({k: v.half() for k, v in model.state_dict().items()}, "m.pt")
        """,
        # the half-precision UNet is a frozen base: the optimizer trains only the adapter
        """
        import torch
        unet = UNet().to("cuda").to(torch.float16)
        control_net = ControlNet(unet).cuda()
        optimizer = torch.optim.AdamW(control_net.parameters(), lr=1e-4)
        for x, y in loader:
            loss = criterion(control_net(x), y)
            loss.backward()
            optimizer.step()
        """,
        # apex's FP16_Optimizer trains the half model on a float32 master copy of its weights
        """
        import torch
        from apex.fp16_utils import FP16_Optimizer
        model = Net().cuda().half()
        optimizer = FP16_Optimizer(torch.optim.Adam(model.parameters()), dynamic_loss_scale=True)
        for x, y in loader:
            loss = criterion(model(x.half()), y)
            optimizer.backward(loss)
            optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            model = Net().cuda().half()
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=3, message="`Net().cuda().half()`",
        ),
        Invalid(
            """
            import torch
            def train_epoch(model, loader, opt):
                for x, y in loader:
                    x = x.to("cuda", dtype=torch.float16)
                    loss = model(x, y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            """,
            line=5, message="train_epoch",
        ),
        Invalid(
            """
            import torch as th
            def fit(net, batches, optimizer):
                net = net.to(th.half)
                for xb in batches:
                    net(xb).mean().backward()
            """,
            line=4,
        ),
        # cast later in the loop body still runs before the next backward
        Invalid(
            """
            import torch
            for step, x in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                model.half()
            """,
            line=7,
        ),
        # the model's weights and the batches are both cast: said once, at the weights
        Invalid(
            """
            import torch
            model = Net().cuda().half()
            for images, labels in loader:
                images = images.half()
                loss = criterion(model(images), labels)
                loss.backward()
                optimizer.step()
            """,
            line=3, message="`Net().cuda().half()`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._casts: list[_HalfCast] = []
        self._counts: dict[Optional[cst.CSTNode], int] = {}
        self._evidence: dict[Optional[cst.CSTNode], cst.Call] = {}
        self._train_loops: set = set()
        self._global = 0
        self._in_functions = 0  # training steps inside any function
        self._master_weights = False  # an optimizer or engine here trains the half model on fp32 master weights

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if last_name(func) in MASTER_WEIGHTS_LAST_NAMES and does(ctx.call_name(node), Does.KEEPS_FP32_MASTER_WEIGHTS):
            self._master_weights = True
        if not isinstance(func, cst.Attribute):
            return
        name = func.attr.value
        if name == "backward" or (name == "step" and is_optimizer(func.value, ctx)):
            self._training_step(node, ctx)
        elif name in ("half", "to", "type") and self._is_fp16_cast(node, name, ctx):
            if ctx.in_no_grad() or ctx.in_context_manager(*_AUTOCAST):
                return
            if self._not_the_trained_model(node, ctx):
                return
            loops = tuple(ctx.loops_in_function())
            if any(isinstance(lp, _COMPREHENSIONS) for lp in loops):
                return
            function = ctx.function_def
            self._casts.append(_HalfCast(node, function, self._counts.get(function, 0), self._global, loops,
                                         batch_of_training_loop(func.value, ctx, node),
                                         _cast_receiver(node) or assigned_name(node, ctx, chained=True)))

    def _training_step(self, node: cst.Call, ctx: FileContext) -> None:
        self._global += 1
        functions = [fn for fn in ctx.functions if isinstance(fn, cst.FunctionDef)]
        if functions:
            self._in_functions += 1
        for fn in functions or [None]:
            self._counts[fn] = self._counts.get(fn, 0) + 1
            self._evidence.setdefault(fn, node)
        self._train_loops.update(ctx.loops)

    @staticmethod
    def _not_the_trained_model(node: cst.Call, ctx: FileContext) -> bool:
        """A cast whose result is not what trains: a copy (``deepcopy(model).half()`` into a checkpoint),
        a round trip (``model.half().float()`` to round values), or a conditional match of an input's
        dtype (``m.half() if x.dtype is torch.float16 else m`` in a profiling helper)."""
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        while isinstance(receiver, cst.Call):
            called = ctx.qualified_name(receiver.func) or dotted_name(receiver.func) or ""
            if called.rsplit(".", 1)[-1] == "deepcopy":
                return True
            receiver = receiver.func.value if isinstance(receiver.func, cst.Attribute) else None
        parent = ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("float", "to", "type", "double"):
            return True
        return isinstance(parent, cst.IfExp)

    @staticmethod
    def _is_fp16_cast(node: cst.Call, name: str, ctx: FileContext) -> bool:
        if name == "half":
            return not node.args and ctx.qualified_name(node.func) is None
        if ctx.qualified_name(node.func) is not None:
            return False  # torch.to / np.type...: not a tensor method
        if name == "to":
            for arg in node.args:
                if arg.keyword is None or arg.keyword.value == "dtype":
                    if ctx.qualified_name(arg.value) in _FP16:
                        return True
            return False
        value = argument(node, 0, "dtype")
        if value is None:
            return False
        text = string_value(value)
        return ctx.qualified_name(value) in _FP16_TYPES or text in ("torch.HalfTensor", "torch.cuda.HalfTensor")

    def end_file(self, ctx: FileContext) -> None:
        if collects_tests(ctx):
            return  # tests of half-precision kernels: their backward checks gradients, it trains nothing
        if self._master_weights:
            return  # apex's FP16_Optimizer, a DeepSpeed engine: the half model trains on fp32 master weights
        reported: list[_HalfCast] = []
        # what the optimizers are given: a walk over every call of the file, asked only when there is a cast to judge
        optimized = optimized_names(ctx) if self._casts else None
        for cast in self._casts:
            module = cast.module
            if optimized is not None and module is not None and not cast.batch and not any(
                    name == module or name.startswith(module + ".") for name in optimized):
                continue  # no optimizer here is given this module: a frozen base in half precision trains nothing
            fn = cast.function
            if fn is None:
                trains = self._global > cast.global_count or self._in_functions > 0
            else:
                trains = self._counts.get(fn, 0) > cast.function_count
            trains = trains or any(loop in self._train_loops for loop in cast.loops)
            if not trains:
                continue
            reported.append(cast)
        weights_cast = any(not cast.batch for cast in reported)
        for cast in reported:
            if cast.batch and weights_cast:
                continue  # the batch follows the model's dtype: said once, where the weights are cast
            fn = cast.function
            evidence = self._evidence.get(fn) or self._evidence.get(None) or next(iter(self._evidence.values()), None)
            where = f"{fn.name.value}()" if fn is not None else "this script"
            step = f", which calls {code_span(short(ctx, evidence, 40))}" if evidence is not None else ""
            self.report(cast.node, f"{code_span(short(ctx, cast.node))} casts to float16 for training in {where}{step}: "
                                   f"pure fp16 weights lose small updates to underflow and rounding. Keep float32 "
                                   f"weights and use torch.autocast(\"cuda\", dtype=torch.float16) with "
                                   f"torch.amp.GradScaler")
