"""TR801 deprecated-cuda-amp: torch.cuda.amp.autocast / GradScaler are deprecated; use torch.amp with a device."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, local_name_for,
                               short)
from analyzers.program import in_compat_fallback
from analyzers.program.versions import VersionFacts
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule, Valid
from analyzers.program.names import last_name as _last


_NO_SPACE_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


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
