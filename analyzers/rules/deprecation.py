"""Mixed precision and deprecations: torch.cuda.amp, pure fp16 training, autograd.Variable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, is_false, is_true, keyword_arg, local_name_for,
                               short, string_value)
from analyzers.markdown import code_span
from analyzers.program import in_compat_fallback
from analyzers.program.names import parenthesized
from analyzers.program.values import is_optimizer
from analyzers.program.versions import VersionFacts
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule, Valid


def _last(func: cst.BaseExpression) -> Optional[str]:
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return None




_NO_SPACE_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


# ---------------------------------------------------------------------------------------------
# TR801

# qualified name -> (device, symbol in torch.amp)
_DEPRECATED_AMP = {
    "torch.cuda.amp.autocast": ("cuda", "autocast"),
    "torch.cuda.amp.autocast_mode.autocast": ("cuda", "autocast"),
    "torch.cuda.amp.GradScaler": ("cuda", "GradScaler"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("cuda", "GradScaler"),
    "torch.cpu.amp.autocast": ("cpu", "autocast"),
    "torch.cpu.amp.autocast_mode.autocast": ("cpu", "autocast"),
    "torch.cpu.amp.GradScaler": ("cpu", "GradScaler"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("cpu", "GradScaler"),
    "torch.cuda.amp.custom_fwd": ("cuda", "custom_fwd"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("cuda", "custom_fwd"),
    "torch.cuda.amp.custom_bwd": ("cuda", "custom_bwd"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("cuda", "custom_bwd"),
}
_AMP_SYMBOLS = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}
_AMP_DEPRECATED_SINCE = (2, 4)  # the FutureWarning; a project capped below it has nothing to migrate
# the torch release whose torch.amp has each replacement: a fix written for an older pinned floor would break it
_AMP_REPLACEMENT_SINCE = {"autocast": (1, 10), "GradScaler": (2, 3), "custom_fwd": (2, 4), "custom_bwd": (2, 4)}
# torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True): its positional
# arguments do not line up with torch.amp.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


class DeprecatedCudaAmp(Rule):
    id = "TR801"
    slug = "deprecated-cuda-amp"
    category = Category.DEPRECATION
    severity = Severity.MEDIUM
    summary = "torch.cuda.amp.autocast / GradScaler are deprecated; use torch.amp with a device"
    what = """
        Flags `torch.cuda.amp.autocast(...)`, `torch.cuda.amp.GradScaler(...)`,
        `torch.cpu.amp.autocast(...)` and `torch.cuda.amp.custom_fwd/custom_bwd`, through every
        import form (`from torch.cuda.amp import autocast`, `from torch.cuda import amp`,
        `import torch.cuda.amp as amp`), including `with` statements and decorators.
    """
    why = """
        Since PyTorch 2.4 these aliases emit a FutureWarning on every use and are slated for
        removal. `torch.amp.autocast(device_type, ...)` and `torch.amp.GradScaler(device, ...)`
        are the supported, device-generic API. Note that `torch.cuda.amp.autocast`'s first
        positional parameter is `enabled`, while `torch.amp.autocast`'s second is `dtype`, so
        positional arguments must become keywords when migrating.
    """
    example = """
        scaler = torch.cuda.amp.GradScaler()
        with torch.cuda.amp.autocast():
            loss = model(x)
    """
    fix_example = """
        scaler = torch.amp.GradScaler("cuda")
        with torch.amp.autocast("cuda"):
            loss = model(x)
    """
    VALID = [
        # the fallback for old torch builds
        "import torch\ntry:\n    scaler = torch.amp.GradScaler('cuda')\nexcept (AttributeError, TypeError):\n"
        "    scaler = torch.cuda.amp.GradScaler()\n",
        """
        import torch
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        """,
        """
        from torch.amp import autocast
        with autocast(device_type="cuda"):
            pass
        """,
        # a project's own autocast helper
        """
        import torch
        from utils import autocast
        with autocast():
            pass
        """,
        # every torch the pins allow predates the deprecation
        Valid("import torch\nscaler = torch.cuda.amp.GradScaler()\n", requirements="torch>=1.12,<2.4\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            """,
            line=3, message="torch.cuda.amp.GradScaler",
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            """,
        ),
        Invalid(
            """
            import torch as th
            with th.cuda.amp.autocast(enabled=use_amp):
                out = model(x)
            """,
            line=3,
            fixed="""
            import torch as th
            with th.amp.autocast("cuda", enabled=use_amp):
                out = model(x)
            """,
        ),
        # positional ``enabled`` must become a keyword
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast, GradScaler
            scaler = GradScaler(2.0**14, enabled=True)
            with autocast(True, torch.bfloat16):
                pass
            """,
            line=4, count=2,
            fixed="""
            import torch
            from torch.cuda.amp import autocast, GradScaler
            scaler = torch.amp.GradScaler("cuda", 2.0**14, enabled=True)
            with autocast(True, torch.bfloat16):
                pass
            """,
        ),
        # the pins admit torch 2.4 (deprecated) but also 1.13, which has no torch.amp.GradScaler: no fix offered
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            """,
            requirements="torch>=1.13\n",
            line=3, message="needs torch ≥ 2.3, which the pins do not guarantee",
        ),
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            """,
            requirements="torch>=2.3\n",
            line=3, message="(torch>=2.3 per requirements.txt)",
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            """,
        ),
        # no binding for torch itself: reported without a fix
        Invalid(
            """
            from torch.cuda.amp import autocast
            with autocast():
                pass
            """,
            line=3, message="torch.amp.autocast",
        ),
        Invalid(
            """
            import torch
            from torch.cuda import amp
            class Net(torch.nn.Module):
                @amp.autocast()
                def forward(self, x):
                    return x
            """,
            line=5,
            fixed="""
            import torch
            from torch.cuda import amp
            class Net(torch.nn.Module):
                @torch.amp.autocast("cuda")
                def forward(self, x):
                    return x
            """,
        ),
        Invalid(
            """
            import torch
            with torch.cpu.amp.autocast(dtype=torch.bfloat16):
                pass
            """,
            line=3,
            fixed="""
            import torch
            with torch.amp.autocast("cpu", dtype=torch.bfloat16):
                pass
            """,
        ),
        Invalid(
            """
            import torch
            from torch.cuda.amp import custom_fwd
            class Fn(torch.autograd.Function):
                @staticmethod
                @custom_fwd
                def forward(ctx, x):
                    return x
            """,
            line=6,
            fixed="""
            import torch
            from torch.cuda.amp import custom_fwd
            class Fn(torch.autograd.Function):
                @staticmethod
                @torch.amp.custom_fwd(device_type="cuda")
                def forward(ctx, x):
                    return x
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = _last(func)
        if last not in _AMP_SYMBOLS and ctx.imports.names.get(last or "") not in _DEPRECATED_AMP:
            return
        found = _DEPRECATED_AMP.get(ctx.qualified_name(func) or "")
        if found is None or in_compat_fallback(ctx, node):
            return  # the fallback for torch builds that lack the new API is the one place the old one belongs
        device, symbol = found
        self._report(node, device, symbol, node, ctx)

    def visit_Decorator(self, node: cst.Decorator, ctx: FileContext) -> None:
        expr = node.decorator
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return
        last = _last(expr)
        if last not in ("custom_fwd", "custom_bwd") and ctx.imports.names.get(last or "") not in _DEPRECATED_AMP:
            return
        found = _DEPRECATED_AMP.get(ctx.qualified_name(expr) or "")
        if found is not None:
            self._report(expr, found[0], found[1], None, ctx)

    def _report(self, node: cst.CSTNode, device: str, symbol: str, call: Optional[cst.Call], ctx: FileContext) -> None:
        versions = ctx.facts(VersionFacts)
        if not versions.admits("torch", _AMP_DEPRECATED_SINCE):
            return  # every torch the pins allow predates the deprecation
        since = _AMP_REPLACEMENT_SINCE[symbol]
        unpinned = versions.floor("torch") is None and versions.cap("torch") is None and not versions.legacy
        fixable = unpinned or versions.guarantees("torch", since)
        written = short(ctx, call.func if call is not None else node)
        if symbol in ("custom_fwd", "custom_bwd"):
            new = f'torch.amp.{symbol}(device_type="{device}")'
        else:
            new = f'torch.amp.{symbol}("{device}", ...)'
        qualified = ctx.qualified_name(call.func if call is not None else node) or ""
        if written != qualified:
            written = f"{written}` (`{qualified}`)"
        else:
            written = f"{written}`"
        replacement = self._fix(call, device, symbol, ctx) if fixable else None
        caveat = "" if fixable else (f"; `torch.amp.{symbol}` needs torch ≥ {'.'.join(map(str, since))}, which the "
                                     f"pins do not guarantee: keep the old call for older releases")
        self.report(node, f"`{written} is deprecated (FutureWarning since torch 2.4); use `{new}`{caveat} "
                          f"({versions.assumption('torch')})", replacement=replacement)

    @staticmethod
    def _fix(call: Optional[cst.Call], device: str, symbol: str, ctx: FileContext) -> Optional[cst.CSTNode]:
        torch_name = local_name_for(ctx, "torch")
        if torch_name is not None:
            callee: cst.BaseExpression = cst.Attribute(cst.Attribute(cst.Name(torch_name), cst.Name("amp")),
                                                       cst.Name(symbol))
        else:
            amp_name = local_name_for(ctx, "torch.amp")
            if amp_name is not None:
                callee = cst.Attribute(cst.Name(amp_name), cst.Name(symbol))
            else:
                direct = local_name_for(ctx, f"torch.amp.{symbol}")
                if direct is None:
                    return None
                callee = cst.Name(direct)
        args = list(call.args) if call is not None else []
        if any(a.star for a in args):
            return None
        device_string = cst.SimpleString(f'"{device}"')
        if symbol in ("custom_fwd", "custom_bwd"):
            if any(a.keyword is None for a in args):
                return None
            first = cst.Arg(device_string, keyword=cst.Name("device_type"), equal=_NO_SPACE_EQUAL)
        else:
            first = cst.Arg(device_string)
            if symbol == "autocast":
                positional = [a for a in args if a.keyword is None]
                if len(positional) > len(_AUTOCAST_POSITIONAL):
                    return None
                args = [a.with_changes(keyword=cst.Name(_AUTOCAST_POSITIONAL[i]), equal=_NO_SPACE_EQUAL)
                        if a.keyword is None else a for i, a in enumerate(args)]
        if args:
            first = first.with_changes(comma=_COMMA)
        new_args = [first] + args
        if call is None:
            return cst.Call(func=callee, args=new_args)
        return call.with_changes(func=callee, args=new_args)


# ---------------------------------------------------------------------------------------------
# TR802

_FP16 = {"torch.float16", "torch.half"}
_FP16_TYPES = _FP16 | {"torch.HalfTensor", "torch.cuda.HalfTensor"}
_AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
             "torch.cuda.amp.autocast_mode.autocast", "torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast")
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


@dataclass
class _HalfCast:
    node: cst.Call
    function: Optional[cst.FunctionDef]
    function_count: int  # training steps already seen in that function when the cast ran
    global_count: int
    loops: tuple


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
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._casts: list[_HalfCast] = []
        self._counts: dict[Optional[cst.CSTNode], int] = {}
        self._evidence: dict[Optional[cst.CSTNode], cst.Call] = {}
        self._train_loops: set = set()
        self._global = 0
        self._in_functions = 0  # training steps inside any function

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
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
            self._casts.append(_HalfCast(node, function, self._counts.get(function, 0), self._global, loops))

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
        for cast in self._casts:
            fn = cast.function
            if fn is None:
                trains = self._global > cast.global_count or self._in_functions > 0
            else:
                trains = self._counts.get(fn, 0) > cast.function_count
            trains = trains or any(loop in self._train_loops for loop in cast.loops)
            if not trains:
                continue
            evidence = self._evidence.get(fn) or self._evidence.get(None) or next(iter(self._evidence.values()), None)
            where = f"{fn.name.value}()" if fn is not None else "this script"
            step = f", which calls {code_span(short(ctx, evidence, 40))}" if evidence is not None else ""
            self.report(cast.node, f"{code_span(short(ctx, cast.node))} casts to float16 for training in {where}{step}: "
                                   f"pure fp16 weights lose small updates to underflow and rounding. Keep float32 "
                                   f"weights and use torch.autocast(\"cuda\", dtype=torch.float16) with "
                                   f"torch.amp.GradScaler")


# ---------------------------------------------------------------------------------------------
# TR803

_VARIABLE = {"torch.autograd.Variable", "torch.autograd.variable.Variable", "torch.Variable"}
class DeprecatedVariable(Rule):
    id = "TR803"
    slug = "deprecated-variable"
    category = Category.DEPRECATION
    severity = Severity.LOW
    summary = "torch.autograd.Variable is a no-op since PyTorch 0.4"
    what = """
        Flags `torch.autograd.Variable(...)` (under any import alias) and its `volatile=True`
        argument.
    """
    why = """
        Since PyTorch 0.4 tensors carry autograd state themselves: `Variable(t)` just returns
        a tensor, and `volatile=True` is ignored with a warning — code relying on it for
        inference now builds the autograd graph and wastes memory. The wrapper only adds noise
        and signals outdated code.
    """
    example = """
        x = Variable(images).cuda()
        w = Variable(torch.randn(3, 3), requires_grad=True)
        out = model(Variable(x, volatile=True))
    """
    fix_example = """
        x = images.cuda()
        w = torch.randn(3, 3).requires_grad_()
        with torch.no_grad():
            out = model(x)
    """
    VALID = [
        """
        import torch
        x = images.cuda()
        w = torch.randn(3, requires_grad=True)
        """,
        # someone else's Variable
        """
        import torch
        from tf_compat import Variable
        v = Variable(3)
        """,
        """
        import torch
        class Variable:
            pass
        v = Variable()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.autograd import Variable
            x = Variable(images).cuda()
            """,
            line=4, message="Variable(images)",
            fixed="""
            import torch
            from torch.autograd import Variable
            x = images.cuda()
            """,
        ),
        Invalid(
            """
            import torch
            w = torch.autograd.Variable(torch.randn(3, 3), requires_grad=True)
            """,
            line=3,
            fixed="""
            import torch
            w = torch.randn(3, 3).requires_grad_()
            """,
        ),
        Invalid(
            """
            import torch
            import torch.autograd as autograd
            y = autograd.Variable(a + b) * 2
            """,
            line=4,
            fixed="""
            import torch
            import torch.autograd as autograd
            y = (a + b) * 2
            """,
        ),
        Invalid(
            """
            import torch
            from torch.autograd import Variable
            out = model(Variable(x, volatile=True))
            """,
            line=4, message="volatile=True",
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        last = _last(node.func)
        if last != "Variable" and ctx.imports.names.get(last or "") not in _VARIABLE:
            return
        if ctx.qualified_name(node.func) not in _VARIABLE:
            return
        shown = short(ctx, node)
        volatile = keyword_arg(node, "volatile")
        if volatile is not None and not is_false(volatile.value):
            self.report(node, f"{code_span(shown)}: `volatile=True` has been ignored since PyTorch 0.4, so this builds the "
                              f"autograd graph anyway; drop Variable and wrap the inference in `with torch.no_grad():`")
            return
        replacement = self._fix(node)
        instead = f"; use {code_span(short(ctx, replacement))}" if replacement is not None else "; use the tensor directly"
        self.report(node, f"{code_span(shown)} uses torch.autograd.Variable, a no-op wrapper since PyTorch 0.4 "
                          f"(tensors track gradients themselves){instead}", replacement=replacement)

    @staticmethod
    def _fix(node: cst.Call) -> Optional[cst.BaseExpression]:
        if any(a.star for a in node.args):
            return None
        allowed = {"data", "requires_grad"}
        if any(a.keyword is not None and a.keyword.value not in allowed for a in node.args):
            return None
        positional = [a for a in node.args if a.keyword is None]
        if len(positional) > 1:
            return None
        data = argument(node, 0, "data")
        if data is None:
            return None
        requires = keyword_arg(node, "requires_grad")
        if requires is None or is_false(requires.value):
            if node.lpar and not data.lpar:
                return data.with_changes(lpar=node.lpar, rpar=node.rpar)
            return parenthesized(data)
        method = cst.Attribute(parenthesized(data), cst.Name("requires_grad_"))
        args = [] if is_true(requires.value) else [cst.Arg(requires.value)]
        return cst.Call(func=method, args=args, lpar=node.lpar, rpar=node.rpar)
