"""Device placement and input-pipeline performance on CUDA."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import re
import libcst as cst

from analyzers.context import (FileContext, argument, call_receiver, dotted_name, is_false, is_true, keyword_arg,
                               method_name, string_value)
from analyzers.markdown import named
from analyzers.program.devices import expression_nodes, runs_only_with_cuda, selects_with_cpu_fallback
from analyzers.program.flow import assignment_before, call_site_values, parameter_index, subtree
from analyzers.program.library import Does, does, is_data_parallel
from analyzers.program.loops import iterated
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule

# ---------------------------------------------------------------------------------------------
# "Does this file use CUDA?" — facts shared by the rules of this module, collected once per call
# node whichever rule sees it first, and judged only at end_file (``.cuda()`` may come last).

# Roots of expressions that carry run configuration: ``args.device``, ``cfg.device``...
_CONFIG_ROOTS = {"args", "arg", "cfg", "config", "conf", "opt", "opts", "options", "hparams", "hp", "params",
                 "settings", "flags", "FLAGS", "training_args", "train_args", "accelerator", "fabric", "CFG",
                 "Config", "cfgs", "hyperparams", "hyp", "trainer"}
_DTYPE_NAMES = {"float", "float16", "float32", "float64", "half", "double", "bfloat16", "int", "int8", "int16",
                "int32", "int64", "long", "short", "bool", "uint8", "complex64", "complex128", "cfloat", "cdouble"}


def _device_like_name(dotted: Optional[str]) -> bool:
    """An unresolved device variable: ``device``, ``args.device``, ``self.cfg.device``, ``local_device``."""
    if not dotted:
        return False
    parts = dotted.split(".")
    last = parts[-1].lower()
    if not (last in ("device", "dev") or last.endswith("_device")):
        return False
    if len(parts) == 1:
        return True
    if parts[0] == "self":
        # ``self.device`` of a Lightning/HF module is wherever the module is, not CUDA per se;
        # ``self.args.device`` / ``self.cfg.device`` are configuration
        parts = parts[1:]
        if len(parts) < 2:
            return False
    root = parts[0]
    return root in _CONFIG_ROOTS or root.lower().endswith(("args", "cfg", "config"))


def _is_cuda_device(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> bool:
    """Whether ``expr`` names a CUDA device (``"cuda:0"``, ``torch.device("cuda")``, the usual ternary...)."""
    if expr is None or depth > 5:
        return False
    text = string_value(expr)
    if text is not None:
        return text.startswith("cuda")
    if isinstance(expr, cst.Integer):
        return True  # ``.to(0)`` / ``.cuda(1)``: a CUDA device index
    if isinstance(expr, cst.FormattedString):
        first = expr.parts[0] if expr.parts else None
        return isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda")
    if isinstance(expr, cst.IfExp):
        return _is_cuda_device(expr.body, ctx, depth + 1) or _is_cuda_device(expr.orelse, ctx, depth + 1)
    if isinstance(expr, cst.Call):
        name = method_name(expr)
        if name == "device":
            if ctx.call_name(expr) not in ("torch.device", "torch.cuda.device"):
                return False
            arg = argument(expr, 0, "type")
            if arg is None:
                arg = argument(expr, 0, "device")
            if isinstance(arg, (cst.Name, cst.Attribute)) and _device_like_name(dotted_name(arg)):
                return True  # torch.device(args.device)
            return _is_cuda_device(arg, ctx, depth + 1)
        if name == "current_device":
            return ctx.call_name(expr) == "torch.cuda.current_device"
        if name == "current_accelerator":  # torch >= 2.6: CUDA where there is a GPU
            return ctx.call_name(expr) == "torch.accelerator.current_accelerator"
        if name == "format":
            receiver = string_value(call_receiver(expr))
            return receiver is not None and receiver.startswith("cuda")
        return False
    if isinstance(expr, (cst.Name, cst.Attribute)):
        dotted = dotted_name(expr)
        if dotted in _facts(ctx).cuda_names:
            return True  # assigned a CUDA device in one branch (``if use_cuda: device = ...``)
        binding = ctx.binding(dotted) if dotted else None
        if binding is not None and binding.kind in ("assign", "annassign", "walrus") and binding.value is not None:
            return _is_cuda_device(binding.value, ctx, depth + 1) or (
                isinstance(binding.value, (cst.Name, cst.Attribute)) and _device_like_name(dotted_name(binding.value))
                and ctx.binding(dotted_name(binding.value) or "") is None)
        if binding is not None and binding.kind == "param" and isinstance(binding.value, cst.Name) and \
                binding.value.value == "None":
            return False  # ``def __init__(self, dim, device=None)``: the factory-kwargs convention, the caller's choice
        if binding is None or binding.kind in ("param", "for", "with"):
            return _device_like_name(dotted)
    return False


def _receiver_root(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    """``batch`` for ``batch["x"].float()``; the root variable of a receiver chain."""
    while expr is not None:
        if isinstance(expr, cst.Name):
            return expr.value
        if isinstance(expr, cst.Attribute):
            expr = expr.value
        elif isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call):
            expr = expr.func
        else:
            return None
    return None


@dataclass
class _DeviceFacts:
    last: Optional[cst.CSTNode] = None
    last_assign: Optional[cst.CSTNode] = None
    cuda_evidence: bool = False
    batch_moves: bool = False
    non_blocking: bool = False  # some copy asks to overlap with compute, which needs pinned memory
    # names/roots later moved with ``.to``/``.cuda``/``.type_as`` per enclosing function
    moved_roots: dict[int, set[str]] = field(default_factory=dict)
    # names assigned a CUDA device anywhere so far, whichever branch assigned them last
    cuda_names: set[str] = field(default_factory=set)

    def observe_assign(self, node: cst.Assign, ctx: FileContext) -> None:
        value = node.value
        if isinstance(value, cst.SimpleString):
            cuda = (string_value(value) or "").startswith("cuda")
        elif isinstance(value, cst.Call) and method_name(value) in ("device", "current_accelerator"):
            cuda = _is_cuda_device(value, ctx)
        else:
            return
        if cuda:
            for target in node.targets:
                name = dotted_name(target.target)
                if name is not None:
                    self.cuda_names.add(name)

    def observe(self, node: cst.Call, name: Optional[str], ctx: FileContext) -> None:
        if node is self.last:
            return
        self.last = node
        if name in ("to", "cuda", "type_as"):
            if is_true(argument(node, 99, "non_blocking")):
                self.non_blocking = True
            receiver = call_receiver(node)
            if receiver is None:
                return
            root = _receiver_root(receiver)
            if root is not None and (name != "to" or _to_moves_device(node, ctx)):
                self.moved_roots.setdefault(id(ctx.function_def), set()).add(root)
            if name == "type_as":
                return
            if name == "cuda":
                moved = True
            else:
                target = keyword_arg(node, "device")
                target_expr = target.value if target is not None else argument(node, 0, "device")
                moved = _is_cuda_device(target_expr, ctx)
            if moved:
                self.cuda_evidence = True
                if not self.batch_moves and ctx.loop is not None and root is not None and _loop_variable(root, ctx):
                    self.batch_moves = True
            return
        if name == "device" or name == "set_device":
            if ctx.call_name(node) in ("torch.cuda.set_device",) or _is_cuda_device(node, ctx):
                self.cuda_evidence = True
            return
        if name in ("DataParallel", "DistributedDataParallel"):
            if is_data_parallel(ctx.call_name(node)):
                self.cuda_evidence = True
            return
        if name == "prepare":
            receiver = call_receiver(node)
            origin = ctx.origin_call_name(receiver) if receiver is not None else None
            if origin is not None and does(f"{origin}.prepare", Does.MOVES_MODULE):
                self.cuda_evidence = True
            return
        if not self.cuda_evidence:
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value == "device" and _is_cuda_device(arg.value, ctx):
                    self.cuda_evidence = True
                    return


def _loop_variable(root: str, ctx: FileContext) -> bool:
    """A variable bound by, or assigned inside, a loop: a batch, not the model."""
    binding = ctx.binding(root)
    if binding is None:
        return True  # comprehension targets are bound after their element is visited
    return binding.kind == "for" or binding.loop is not None


class _FileDeviceFacts(_DeviceFacts):
    """The device facts of one file, kept with the file's other facts (``ctx.facts``)."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__()


def _facts(ctx: FileContext) -> _DeviceFacts:
    return ctx.facts(_FileDeviceFacts)


_OBSERVED = {"to", "cuda", "type_as", "device", "set_device", "DataParallel", "DistributedDataParallel", "prepare"}


def _observe(node: cst.Call, ctx: FileContext) -> Optional[str]:
    name = method_name(node)
    facts = _facts(ctx)
    if name in _OBSERVED or (not facts.cuda_evidence and node.args and any(
            a.keyword is not None and a.keyword.value == "device" for a in node.args)):
        facts.observe(node, name, ctx)
    return name


def _observe_assign(node: cst.Assign, ctx: FileContext) -> None:
    facts = _facts(ctx)
    if node is not facts.last_assign:
        facts.last_assign = node
        facts.observe_assign(node, ctx)


def _short(ctx: FileContext, node: cst.CSTNode, limit: int = 70) -> str:
    text = " ".join(ctx.module.code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 5] + "...)"


# ---------------------------------------------------------------------------------------------

_CREATION = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace", "logspace",
             "eye", "tensor", "as_tensor", "randperm"}
_MOVES = {"to", "cuda", "type_as"}
# Host-side use of a freshly created tensor: bookkeeping, not model math.
_HOST_USES = {"item", "tolist", "numpy", "cpu"}
_HOST_SINKS = {"log", "log_dict", "print", "append", "extend", "format", "info", "debug", "add_scalar", "write"}


@dataclass
class _Candidate:
    call: cst.Call
    fn: cst.FunctionDef
    owner: str
    target: Optional[str]


class TensorWithoutDevice(Rule):
    id = "TR701"
    slug = "tensor-without-device"
    category = Category.DEVICE
    severity = Severity.MEDIUM  # a device mismatch fails loudly on the first batch; CUDA use is inferred per file
    summary = "tensor created in forward/training step without device= in a model that runs on CUDA"
    what = """
        Flags `torch.zeros/ones/empty/full/rand/randn/randint/arange/linspace/eye/tensor/as_tensor`
        calls without `device=` inside the `forward` of an `nn.Module` subclass or inside a
        training-step function, in a file that moves its model to CUDA (`.cuda()`,
        `.to("cuda")`, `.to(device)` with a CUDA device, `device="cuda"`...).
        Creation followed by `.to(...)`, `.cuda()` or `.type_as(...)`, `*_like` factories and
        `x.new_*` methods are fine. Indices made this way and fed to an `nn.Embedding` of the
        module (`self.wpe(torch.arange(t))`, nanoGPT's `ModuleDict` layout too) or to
        `F.embedding` are reported as high: that lookup always raises on CUDA. In a model file
        that never moves anything itself (the training script does), those position ids are
        still reported, at medium.
    """
    why = """
        Factory functions allocate on the CPU by default. When the model lives on the GPU the
        new tensor either breaks the step with "Expected all tensors to be on the same
        device", or, for 0-dim tensors that PyTorch silently accepts, adds a host-to-device
        copy (and often a synchronization) to every forward pass.
    """
    example = """
        def forward(self, x):
            mask = torch.ones(x.size(0), x.size(1))
            return self.encoder(x, mask)
    """
    fix_example = """
        def forward(self, x):
            mask = torch.ones(x.size(0), x.size(1), device=x.device)
            # or: x.new_ones(x.size(0), x.size(1)) / torch.ones_like(x)
            return self.encoder(x, mask)
    """
    VALID = [
        # the default device is set: new tensors are created on it
        """
        import torch
        import torch.nn as nn
        torch.set_default_device("cuda")
        class Net(nn.Module):
            def forward(self, x):
                return x + torch.zeros(x.shape[-1])
        model = Net().to("cuda")
        """,
        # a 0-dim tensor of a size: combines with CUDA tensors as a scalar
        """
            import torch as th
            from torch import nn
            class Attention(nn.Module):
                def forward(self, q, k):
                    scores = q @ k.transpose(-2, -1)
                    return scores / th.sqrt(th.tensor(q.size(-1)))
            device = th.device("cuda:0")
            model = Attention().to(device)
            """,
        # a float constant made a 0-dim tensor (a tanh-approximated activation): CUDA ops take it as a scalar
        """
        import math
        import torch
        from torch import nn
        class TanhGelu(nn.Module):
            def forward(self, h):
                c = torch.sqrt(torch.tensor(2 / math.pi))
                return 0.5 * h * (1.0 + torch.tanh(c * (h + 0.044715 * h ** 3))) * torch.tensor(-1.5)
        net = nn.Sequential(nn.Linear(8, 8), TanhGelu()).to("cuda")
        """,
        # only the factory-kwargs convention (``device=None``, the caller's choice) says anything about devices
        """
        import torch
        from torch import nn
        class Stats(nn.Module):
            def __init__(self, dim, device=None, dtype=None):
                super().__init__()
                self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)
            def forward(self, x):
                means = torch.zeros([3, 64])
                return self.proj(x), means
        """,
        # sizes read off the inputs, for Python-side bookkeeping
        """
        import torch
        import torch.nn as nn
        class MultiCrop(nn.Module):
            def forward(self, x):
                idx = torch.cumsum(torch.unique_consecutive(torch.tensor([inp.shape[-1] for inp in x]),
                                                            return_counts=True)[1], 0)
                return self.head(torch.cat(x).cuda())
        """,
        # device passed
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                h = torch.zeros(x.size(0), 16, device=x.device)
                return x + h.sum()
        model = Net().cuda()
        """,
        # *_like / new_* / moved in the same expression / moved later in the function
        """
        import torch
        from torch import nn
        class Net(nn.Module):
            def forward(self, x):
                a = torch.zeros_like(x)
                b = x.new_ones(x.shape)
                c = torch.arange(x.size(1)).unsqueeze(0).to(x.device)
                d = torch.tensor([1.0, 2.0]).type_as(x)
                pos = torch.arange(x.size(1))
                pos = pos.to(x.device)
                return a + b + c + d + pos
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        """,
        # file never moves the model to CUDA
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x + torch.ones(x.shape)
        model = Net()
        """,
        # register_buffer in __init__ is the right place
        """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("scale", torch.tensor(2.0))
            def forward(self, x):
                return x * self.scale
        model = Net().cuda()
        """,
        # not an nn.Module; host-side bookkeeping in a training step
        """
        import torch
        class Helper:
            def forward(self, x):
                return torch.zeros(3)
        def train_step(model, batch, opt):
            loss = model(batch)
            print(torch.tensor([loss.item()]).mean().item())
            return loss
        model = torch.nn.Linear(2, 2).cuda()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Encoder(nn.Module):
                def forward(self, x):
                    h0 = torch.zeros(2, x.size(0), 64)
                    return self.rnn(x, h0)
            model = Encoder().cuda()
            """,
            line=6, message="torch.zeros(2, x.size(0), 64) in Encoder.forward()",
        ),
        Invalid(
            """
            import torch
            def train_step(model, batch, optimizer, device):
                x, y = batch
                noise = torch.randn(x.shape)
                loss = model(x.to(device) + noise, y.to(device))
                loss.backward()
                optimizer.step()
            """,
            line=5, message="train_step()",
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def forward(self, x):
                    idx = torch.arange(x.size(1))
                    return x[:, idx]
            def main(args):
                net = Net()
                net.to(args.device)
            """,
            line=6, message="torch.arange",
        ),
        # position ids fed to an embedding table: always a crash on CUDA, so high
        Invalid(
            """
            import torch
            from torch import nn
            class Decoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.layers = nn.ModuleDict(dict(tok=nn.Embedding(100, 16), pos=nn.Embedding(32, 16)))
                def forward(self, tokens):
                    positions = torch.arange(tokens.size(1)).unsqueeze(0)
                    return self.layers.tok(tokens) + self.layers.pos(positions)
            model = Decoder().to("cuda")
            """,
            line=9, message="feeds them to the embedding `self.layers.pos`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[_Candidate] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        _observe_assign(node, ctx)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = _observe(node, ctx)
        if name not in _CREATION:
            return
        fn = ctx.function_def
        if fn is None:
            return
        fname = fn.name.value
        lowered = fname.lower()
        owner = None
        if fname == "forward":
            cls = ctx.class_def
            if cls is not None and ctx.parent(ctx.parent(fn)) is cls and ctx.is_module_subclass(cls):
                owner = f"{cls.name.value}.forward()"
        elif lowered == "training_step" or ("train" in lowered and "step" in lowered):
            owner = f"{fname}()"
        if owner is None:
            return
        qualified = ctx.call_name(node)
        if qualified is None or qualified != f"torch.{name}":
            return
        if any(a.star for a in node.args) or keyword_arg(node, "device") is not None or keyword_arg(node, "out"):
            return
        if self._moved_or_host(node, ctx):
            return
        if name == "tensor" and node.args and _shape_metadata(node.args[0].value):
            return  # sizes read off other tensors (``[x.shape[-1] for x in crops]``): CPU-side bookkeeping
        if name == "tensor" and node.args and _constant_scalar(node.args[0].value) and \
                _has_fraction(node.args[0].value) and keyword_arg(node, "dtype") is None:
            # ``torch.tensor(2.0 / math.pi)``: a 0-dim float constant, which CUDA ops take as a plain scalar
            # (an integer one may be an index, and index ops want it on the device)
            return
        target = None
        top = _chain_top(node, ctx)  # ``pos = torch.arange(t).unsqueeze(0)``: the name the chain is assigned to
        parent = ctx.parent(top)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = dotted_name(parent.targets[0].target)
        elif isinstance(parent, (cst.AnnAssign, cst.NamedExpr)):
            target = dotted_name(parent.target)
        self.candidates.append(_Candidate(node, fn, owner, target))

    def _moved_or_host(self, node: cst.Call, ctx: FileContext) -> bool:
        current: cst.CSTNode = node
        while True:
            parent = ctx.parent(current)
            grand = ctx.parent(parent) if parent is not None else None
            if isinstance(parent, cst.Attribute) and parent.value is current and isinstance(grand, cst.Call) \
                    and grand.func is parent:
                attr = parent.attr.value
                if attr in _MOVES:
                    if attr == "to" and not _to_moves_device(grand, ctx):
                        current = grand
                        continue
                    return True
                if attr in _HOST_USES:
                    return True
                current = grand
                continue
            if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)) or (
                    isinstance(parent, cst.Subscript) and parent.value is current):
                current = parent  # ``(torch.arange(n) + 1).to(device)``, ``torch.ones(n)[None].cuda()``
                continue
            if isinstance(parent, cst.Arg) and isinstance(grand, cst.Call):
                sink = method_name(grand)
                if sink in _HOST_SINKS:
                    return True
                if isinstance(grand.func, cst.Attribute) and (ctx.call_name(grand) or "").startswith("torch."):
                    current = grand  # ``torch.triu(torch.ones(n, n)).to(device)``: follow the torch op
                    continue
                return False
            return False

    def end_file(self, ctx: FileContext) -> None:
        if not self.candidates or "set_default_device" in ctx.source:
            return  # ``torch.set_default_device("cuda")``: tensors made without device= land on it
        cuda = _facts(ctx).cuda_evidence
        moved = _facts(ctx).moved_roots
        for cand in self.candidates:
            if cand.target is not None and cand.target.split(".")[0] in moved.get(id(cand.fn), ()):
                continue
            # a model file that moves nothing itself (nanoGPT's model.py: train.py moves it) is still told about
            # position ids for its own embedding, which break on any GPU, one level lower
            embedding = self._embedding_fed(cand, ctx) if cuda or cand.owner.endswith(".forward()") else None
            if not cuda and embedding is None:
                continue
            shown = _short(ctx, cand.call)
            hint = self._device_hint(cand.fn)
            if embedding is not None:
                # CPU indices into a CUDA embedding table always raise: not a slowdown, a crash on the first step
                where = ("whose table this file puts on CUDA: the lookup raises" if cuda else
                         "as soon as the model runs on a GPU the lookup raises")
                self.report(cand.call, f"{shown} in {cand.owner} creates CPU indices without device= and feeds them "
                                       f"to the embedding `{embedding}`, {where} \"Expected all tensors to be on the "
                                       f"same device\" on the first step (CPU-only tests pass); pass {hint}",
                            severity=Severity.HIGH if cuda else Severity.MEDIUM)
                continue
            self.report(cand.call, f"{shown} in {cand.owner} creates a CPU tensor without device=, but this file "
                                   f"runs the model on CUDA: a device mismatch or a host-to-device copy every "
                                   f"step; pass {hint} (or use *_like / x.new_*)")

    @staticmethod
    def _device_hint(fn: cst.FunctionDef) -> str:
        params = [p.name.value for p in fn.params.params if p.name.value not in ("self", "cls")]
        devices = [p for p in params if _device_like_name(p)]
        if devices:
            return f"device={devices[0]}"
        if fn.name.value == "forward" and params:
            return f"device={params[0]}.device"
        return "device=<the batch's device>"

    @staticmethod
    def _embedding_fed(cand: _Candidate, ctx: FileContext) -> Optional[str]:
        """The embedding layer (``self.wpe``, ``self.transformer.wpe``, ``F.embedding``) the new tensor indexes."""
        cls = next((a for a in ctx.ancestors(cand.fn) if isinstance(a, cst.ClassDef)), None)
        tables = _embedding_attributes(cls, ctx) if cls is not None else set()
        # ``pos = self.pos_ids[:t]`` after ``pos = torch.arange(t)``: the name then holds something else (a rebinding
        # from itself, ``pos = pos.unsqueeze(0)``, still holds the new tensor)
        rebound = cand.target is not None and any(
            isinstance(node, cst.Assign) and node.value is not None and not _chain_holds(node.value, cand.call)
            and any(dotted_name(t.target) == cand.target for t in node.targets)
            and not any(isinstance(n, cst.Name) and n.value == cand.target for n in expression_nodes(node.value))
            for node in expression_nodes(cand.fn.body))
        for node in expression_nodes(cand.fn.body):
            if not isinstance(node, cst.Call) or not node.args:
                continue
            callee = dotted_name(node.func)
            functional = ctx.call_name(node) == "torch.nn.functional.embedding"
            if callee not in tables and not functional:
                continue
            first = _chain_root(node.args[0].value, cand.call)  # ``pos.unsqueeze(0)``: ``pos``
            if first is cand.call or (isinstance(first, cst.Name) and first.value == cand.target and not rebound):
                return callee if not functional else "F.embedding"
        return None


def _chain_top(node: cst.CSTNode, ctx: FileContext) -> cst.CSTNode:
    """The outermost method call or subscript of the chain ``node`` starts: ``Net().to(device).train()``,
    ``torch.arange(t).unsqueeze(0)[None]``."""
    while True:
        parent = ctx.parent(node)
        grand = ctx.parent(parent) if parent is not None else None
        if isinstance(parent, cst.Attribute) and parent.value is node and isinstance(grand, cst.Call) and \
                grand.func is parent:
            node = grand
        elif isinstance(parent, cst.Subscript) and parent.value is node:
            node = parent
        else:
            return node


def _chain_root(value: cst.BaseExpression, stop: cst.CSTNode) -> cst.BaseExpression:
    """What a method chain/subscript is taken on (``pos`` for ``pos.unsqueeze(0)[None]``), or ``stop`` if reached."""
    while value is not stop:
        if isinstance(value, cst.Subscript):
            value = value.value
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            value = value.func.value
        else:
            break
    return value


def _chain_holds(value: cst.BaseExpression, call: cst.Call) -> bool:
    """``value`` is ``call`` or a method chain/subscript on it: ``torch.arange(t).unsqueeze(0)``."""
    return _chain_root(value, call) is call


_EMBEDDINGS = {"torch.nn.Embedding", "torch.nn.modules.sparse.Embedding"}


def _embedding_attributes(cls: cst.ClassDef, ctx: FileContext) -> set[str]:
    """``self.wpe`` for ``self.wpe = nn.Embedding(...)``, ``self.transformer.wpe`` inside an
    ``nn.ModuleDict(dict(wpe=nn.Embedding(...)))`` (nanoGPT's layout)."""
    found: set[str] = set()
    for node in expression_nodes(cls.body):
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call)):
            continue
        target = dotted_name(node.targets[0].target)
        if target is None or not target.startswith("self."):
            continue
        if ctx.call_name(node.value) in _EMBEDDINGS:
            found.add(target)
            continue
        for inner in expression_nodes(node.value):
            if isinstance(inner, cst.Arg) and inner.keyword is not None and isinstance(inner.value, cst.Call) \
                    and ctx.call_name(inner.value) in _EMBEDDINGS:
                found.add(f"{target}.{inner.keyword.value}")
    return found


_CONSTANTS = {"pi", "e", "tau", "inf"}


def _constant_scalar(expr: cst.BaseExpression) -> bool:
    """A number known when the code is written: ``2.0``, ``-1``, ``2.0 / math.pi``, ``math.sqrt(2 / torch.pi)``."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _constant_scalar(expr.expression)
    if isinstance(expr, cst.BinaryOperation):
        return _constant_scalar(expr.left) and _constant_scalar(expr.right)
    if isinstance(expr, cst.Attribute):
        return expr.attr.value in _CONSTANTS and dotted_name(expr.value) in ("math", "torch", "np", "numpy")
    if isinstance(expr, cst.Call) and dotted_name(expr.func) in ("math.sqrt", "math.log", "math.exp", "float"):
        return len(expr.args) == 1 and _constant_scalar(expr.args[0].value)
    return False


def _has_fraction(expr: cst.BaseExpression) -> bool:
    """A float literal, a math constant or a division in the expression: a float value, not an index."""
    return any(isinstance(n, cst.Float) or (isinstance(n, cst.Attribute) and n.attr.value in _CONSTANTS)
               or (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Divide))
               or isinstance(n, cst.Call) for n in subtree(expr))


def _shape_metadata(expr: cst.BaseExpression) -> bool:
    """Python ints taken from shapes: ``[inp.shape[-1] for inp in x]``, ``[len(s) for s in seqs]``."""
    for node in subtree(expr):
        if isinstance(node, cst.Attribute) and node.attr.value == "shape":
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, (cst.Name, cst.Attribute)) and \
                (dotted_name(node.func) or "").rsplit(".", 1)[-1] in ("len", "size", "numel", "dim"):
            return True
    return False


def _to_moves_device(call: cst.Call, ctx: FileContext) -> bool:
    """``.to(x.device)``/``.to(device)``/``.to(other)`` move; ``.to(torch.float32)``/``.to(dtype=...)`` do not."""
    if keyword_arg(call, "device") is not None:
        return True
    first = argument(call, 0, "device")
    if first is None:
        return False
    dotted = dotted_name(first)
    if dotted is not None:
        last = dotted.rsplit(".", 1)[-1]
        if last in _DTYPE_NAMES and (ctx.qualified_name(first) or "").startswith("torch."):
            return False
        if last == "dtype" or last.endswith("_dtype"):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# DataLoader rules

_DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}


@dataclass
class _Loader:
    call: cst.Call
    label: str  # ``train_loader = DataLoader(train_ds, ...)`` → "train_loader"
    training: bool
    in_memory: bool = False  # MNIST-like or TensorDataset: nothing to decode, little to copy


# Data sets that live in memory as small tensors: loading them costs nothing worth a worker or pinning.
_IN_MEMORY_DATASETS = {"TensorDataset", "MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST"}
_EVALUATION_WORDS = ("val", "test", "eval", "dev", "holdout")


def _is_evaluation_name(name: Optional[str]) -> bool:
    last = (name or "").rsplit(".", 1)[-1].lower()
    return any(word in last for word in _EVALUATION_WORDS)


def _in_memory(dataset: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    origin = ctx.origin(dataset) if dataset is not None else None
    if not isinstance(origin, cst.Call):
        return False
    called = (ctx.call_name(origin) or dotted_name(origin.func) or "").rsplit(".", 1)[-1]
    if called not in _IN_MEMORY_DATASETS:
        return False
    # random augmentation makes even MNIST worth decoding in workers
    return "Random" not in ctx.module.code_for_node(origin)


def _loader(node: cst.Call, ctx: FileContext) -> Optional[_Loader]:
    if ctx.call_name(node) not in _DATALOADERS:
        return None
    if any(a.star for a in node.args):
        return None  # ``**loader_kwargs`` may carry the setting
    dataset = argument(node, 0, "dataset")
    dataset_name = dotted_name(dataset) if dataset is not None else None
    parent = ctx.parent(node)
    target = None
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        target = dotted_name(parent.targets[0].target)
    elif isinstance(parent, cst.AnnAssign):
        target = dotted_name(parent.target)
    fn = ctx.function_def
    training = is_true(argument(node, 2, "shuffle")) or any(
        n is not None and "train" in n.lower() for n in (dataset_name, target))
    if not training and isinstance(parent, cst.Return) and fn is not None and "train" in fn.name.value.lower():
        training = True
    if _is_evaluation_name(target) or _is_evaluation_name(dataset_name):
        training = False  # a shuffled test loader is still a test loader
    label = target or (f"DataLoader({dataset_name})" if dataset_name else _short(ctx, node, 50))
    return _Loader(node, label, training, _in_memory(dataset, ctx))


class _LoaderRule(Rule):
    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.loaders: list[_Loader] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        _observe_assign(node, ctx)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = _observe(node, ctx)
        if name == "DataLoader" or (name is not None and name[:1].isupper() and isinstance(node.func, cst.Name)
                                    and name in ctx.imports.names):
            loader = _loader(node, ctx)
            if loader is not None and self.wants(loader):
                self.loaders.append(loader)

    def wants(self, loader: _Loader) -> bool:
        raise NotImplementedError


class DataLoaderNoWorkers(_LoaderRule):
    id = "TR702"
    source_hint = re.compile(r"DataLoader")  # a DataLoader call
    slug = "dataloader-no-workers"
    category = Category.DEVICE
    severity = Severity.LOW
    summary = "training DataLoader loads batches in the main process (no num_workers) on a CUDA job"
    what = """
        Flags a training `DataLoader` (`shuffle=True`, or a dataset/loader named `train*`) that
        does not pass `num_workers`, or passes `num_workers=0`, in a file that trains on CUDA.
    """
    why = """
        With `num_workers=0` every batch is loaded, decoded and collated in the training
        process, between GPU steps: the GPU idles while Python reads files and augments images.
        Worker processes prepare the next batches in parallel with the step.
    """
    example = """
        train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)
        model = model.cuda()
    """
    fix_example = """
        train_loader = DataLoader(train_ds, batch_size=64, shuffle=True,
                                  num_workers=4, pin_memory=True, persistent_workers=True)
        model = model.cuda()
    """
    VALID = [
        # in-memory data: MNIST with ToTensor only, a TensorDataset; and a (shuffled) test loader
        "import torch\nfrom torchvision import datasets, transforms\nfrom torch.utils.data import DataLoader\n"
        "train_ds = datasets.MNIST('data', train=True, transform=transforms.ToTensor())\n"
        "train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)\n"
        "test_loader = DataLoader(test_folder, batch_size=64, shuffle=True)\n"
        "for x, y in train_loader:\n    x = x.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=8)\nmodel.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=args.workers)\nmodel.cuda()\n",
        # CPU-only file
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(train_ds, shuffle=True)\n",
        # evaluation loader
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(test_ds, batch_size=256)\nmodel.to('cuda')\n",
        # settings passed through **kwargs
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_ds, shuffle=True, **loader_kwargs)\nmodel.cuda()\n",
    ]
    INVALID = [
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "train_loader = DataLoader(train_ds, batch_size=32, shuffle=True)\nmodel = Net().cuda()\n",
                line=3, message="train_loader"),
        Invalid("import torch\nfrom torch.utils.data import DataLoader as DL\n"
                "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
                "loader = DL(trainset, batch_size=32, num_workers=0)\nmodel.to(device)\n",
                line=4, message="num_workers=0"),
        Invalid("import torch.utils.data as tud\nimport torch\n"
                "dl = tud.DataLoader(ds, batch_size=8, shuffle=True)\n"
                "for x, y in dl:\n    x = x.to('cuda')\n",
                line=3, message="dl"),
    ]

    def wants(self, loader: _Loader) -> bool:
        if not loader.training or loader.in_memory:
            return False
        workers = keyword_arg(loader.call, "num_workers")
        if workers is None:
            return len([a for a in loader.call.args if a.keyword is None]) < 6  # positional num_workers
        return isinstance(workers.value, cst.Integer) and workers.value.evaluated_value == 0

    def end_file(self, ctx: FileContext) -> None:
        if not self.loaders or not _facts(ctx).cuda_evidence:
            return
        for loader in self.loaders:
            workers = keyword_arg(loader.call, "num_workers")
            how = "`num_workers=0`" if workers is not None else "no `num_workers`"
            self.report(loader.call, f"training {named('DataLoader', loader.label)} has {how}: batches are loaded in the "
                                     f"training process and the GPU waits for them; pass num_workers>0 "
                                     f"(e.g. num_workers=4, persistent_workers=True)")


class MissingPinMemory(_LoaderRule):
    id = "TR703"
    source_hint = re.compile(r"DataLoader")  # a DataLoader call
    slug = "missing-pin-memory"
    category = Category.DEVICE
    severity = Severity.LOW
    summary = "DataLoader without pin_memory=True while batches are copied to CUDA"
    what = """
        Flags a `DataLoader` without `pin_memory=True` (absent or `False`) in a script whose
        loop copies batches to the GPU (`batch.to(device)`, `x.cuda()`...).
    """
    why = """
        Host-to-device copies from pageable memory go through an extra staging copy and cannot
        overlap with compute. Pinned (page-locked) batches copy faster, and with
        `.to(device, non_blocking=True)` the copy overlaps with the GPU work.
    """
    example = """
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
    """
    fix_example = """
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    """
    VALID = [
        # in-memory data: MNIST with ToTensor only, a TensorDataset; and a (shuffled) test loader
        "import torch\nfrom torchvision import datasets, transforms\nfrom torch.utils.data import DataLoader\n"
        "train_ds = datasets.MNIST('data', train=True, transform=transforms.ToTensor())\n"
        "train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)\n"
        "test_loader = DataLoader(test_folder, batch_size=64, shuffle=True)\n"
        "for x, y in train_loader:\n    x = x.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\ndevice = torch.device('cuda')\n"
        "loader = DataLoader(ds, num_workers=4, pin_memory=True)\nfor x, y in loader:\n    x = x.to(device)\n",
        # batches never moved to CUDA in a loop (only the model)
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=4)\n"
        "model = model.cuda()\n",
        # CPU training
        "import torch\nfrom torch.utils.data import DataLoader\ndevice = torch.device('cpu')\n"
        "loader = DataLoader(ds, num_workers=4)\nfor x, y in loader:\n    x = x.to(device)\n",
        # decided at run time
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds, pin_memory=use_cuda)\n"
        "for x, y in loader:\n    x = x.cuda()\n",
    ]
    INVALID = [
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
                "train_loader = DataLoader(train_ds, batch_size=64, num_workers=4)\n"
                "for x, y in train_loader:\n    x, y = x.to(device), y.to(device)\n",
                line=4, message="train_loader"),
        Invalid("import torch\nfrom torch.utils import data\n"
                "train_loader = data.DataLoader(ds, num_workers=2, pin_memory=False)\n"
                "def train(model, args):\n    for batch in loader:\n"
                "        batch = {k: v.to(args.device) for k, v in batch.items()}\n",
                line=3, message="pin_memory=False"),
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "loader = DataLoader(ds, num_workers=2)\nfor step, (x, y) in enumerate(loader):\n"
                "    out = model(x.cuda(non_blocking=True))\n",
                line=3),
    ]

    def wants(self, loader: _Loader) -> bool:
        if loader.in_memory:
            return False
        pin = keyword_arg(loader.call, "pin_memory")
        if pin is None:
            return len([a for a in loader.call.args if a.keyword is None]) < 8  # positional pin_memory
        return is_false(pin.value)

    def end_file(self, ctx: FileContext) -> None:
        facts = _facts(ctx)
        if not self.loaders or not facts.cuda_evidence or not facts.batch_moves:
            return
        for loader in self.loaders:
            if not loader.training and not facts.non_blocking:
                continue  # pinning pays on training loaders, or wherever non_blocking copies rely on it
            pin = keyword_arg(loader.call, "pin_memory")
            how = "`pin_memory=False`" if pin is not None else "no `pin_memory=True`"
            self.report(loader.call, f"{named('DataLoader', loader.label)} has {how} while its batches are copied to CUDA: "
                                     f"copies from pageable memory are slower and cannot overlap compute; pass "
                                     f"pin_memory=True and move batches with non_blocking=True")


# ---------------------------------------------------------------------------------------------
# TR704


class HardCodedCuda(Rule):
    id = "TR704"
    source_hint = (re.compile(r"is_available"), re.compile(r"""["']cpu["']"""), re.compile(r"cuda"))
    slug = "hard-coded-cuda"
    category = Category.DEVICE
    severity = Severity.LOW
    summary = "hard-coded .cuda() / \"cuda\" in a file that selects its device with a CPU fallback"
    what = """
        Flags `x.cuda()`, `.to("cuda")`, `torch.device("cuda:0")` and `device="cuda"` in a file
        that selects its device with a CPU fallback
        (`device = torch.device("cuda" if torch.cuda.is_available() else "cpu")`), unless the
        call sits under a test of CUDA (`if torch.cuda.is_available():`, `if use_cuda:`,
        `if device.type == "cuda":`, `if args.gpu:`) or in a function named for the GPU.
    """
    why = """
        The selection promises the script runs without a GPU; the hard-coded line breaks that
        promise ("Torch not compiled with CUDA enabled" / "no CUDA GPUs are available" on a CPU
        machine, a laptop or CI), and when the selection picks another device (`cuda:1`, `mps`)
        the tensors land somewhere else than the model.
    """
    example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
    """
    fix_example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
    """
    VALID = [
        """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        use_cuda = torch.cuda.is_available()
        model = Net().to(device)
        if use_cuda:
            model = model.cuda()
        x = x.cuda() if torch.cuda.is_available() else x
        if device.type == "cuda":
            torch.cuda.synchronize()
            y = y.to("cuda:0")
        def to_gpu(t):
            return t.cuda()
        """,
        # no CPU fallback promised: CUDA everywhere is consistent
        """
        import torch
        device = torch.device("cuda")
        model = Net().cuda()
        x = x.to("cuda:0")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            for images, labels in loader:
                images, labels = images.cuda(), labels.cuda()
                loss = criterion(model(images), labels)
            """,
            line=6, message="`images.cuda()`", count=2,
        ),
        Invalid(
            """
            import torch as T
            dev = "cuda:0" if T.cuda.is_available() else "cpu"
            def evaluate(model, batch):
                mask = T.ones(batch.shape, device="cuda")
                return model(batch.to(T.device("cuda:0")), mask)
            """,
            line=5, message='`device="cuda"`', count=2,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.selections: list[cst.Assign] = []
        self.candidates: list[tuple[cst.CSTNode, str]] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        if selects_with_cpu_fallback(node.value, ctx):
            self.selections.append(node)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        positional = [a for a in node.args if a.keyword is None]
        if name == "cuda" and call_receiver(node) is not None and ctx.qualified_name(node.func) is None and \
                all(isinstance(a.value, cst.Integer) for a in positional):  # ``.cuda()``, ``.cuda(0)``
            self.candidates.append((node, ctx.module.code_for_node(node)))
            return
        if name == "to" and node.args and node.args[0].keyword is None and self._cuda_literal(node.args[0].value):
            self.candidates.append((node, ctx.module.code_for_node(node)))
            return
        if node.args and self._cuda_literal(node.args[0].value) and ctx.call_name(node) == "torch.device":
            self.candidates.append((node, ctx.module.code_for_node(node)))
            return
        device = keyword_arg(node, "device")
        if device is not None and self._cuda_literal(device.value):
            self.candidates.append((device, f'device={ctx.module.code_for_node(device.value)}'))

    @staticmethod
    def _cuda_literal(expr: cst.BaseExpression) -> bool:
        text = string_value(expr)
        return text is not None and text.startswith("cuda")

    def end_file(self, ctx: FileContext) -> None:
        if not self.selections:
            return
        selection_ids = {id(s) for s in self.selections}
        for node, shown in self.candidates:
            if runs_only_with_cuda(node, selection_ids, ctx):
                continue
            self.report(node, f"`{' '.join(shown.split())}` hard-codes CUDA although this file selects its device "
                              f"with a CPU fallback: on a machine without a GPU this line raises, and when the "
                              f"selection picks another device the tensors land away from the model; use the "
                              f"selected device (`.to(device)`)")


# ---------------------------------------------------------------------------------------------
# TR705

# Calls that may move what they are given (``to_device(batch, device)``, ``batch = prepare_batch(batch)``): a loop
# that calls one is handling devices its own way, so it is not judged.
_DEVICE_HANDLING = re.compile(r"device|cuda|gpu|move|transfer|prepare|send|place", re.IGNORECASE)
# Tensor methods that keep a batch tensor where it is: ``x.view(-1, 784)`` is still on the CPU.
_KEEPS_PLACE = {"view", "reshape", "float", "long", "double", "half", "int", "bool", "squeeze", "unsqueeze",
                "permute", "transpose", "contiguous", "flatten", "clone", "detach", "t", "expand", "repeat",
                "type", "requires_grad_", "narrow", "chunk", "split", "unbind"}
_CPU_DATASETS = ("torchvision.", "torchaudio.")
_MOVES_IN_TEXT = re.compile(r"\.(?:to|cuda)\s*\(|device")
_MAKES_TENSORS = re.compile(r"torch\.|[Tt]ensor|transform|numpy|np\.")
_CPU, _MOVED = "cpu", "moved"


def _moves_or_handles_device(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """``expr`` moves something to a device, or calls a helper that may (``to_device(b, dev)``)."""
    for node in expression_nodes(expr):
        if not isinstance(node, cst.Call):
            continue
        name = method_name(node) or ""
        if name == "cuda" or (name == "to" and _to_moves_device(node, ctx)):
            return True
        if name == "type" and node.args and not _cpu_type(node.args[0].value, ctx):
            return True  # ``imgs.type(Tensor)`` with ``Tensor = torch.cuda.FloatTensor if cuda else ...``
        if name != "to" and _DEVICE_HANDLING.search(name):
            return True
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "device":
                return True
            if isinstance(arg.value, (cst.Name, cst.Attribute)) and _device_like_name(dotted_name(arg.value)):
                return True
    return False


def _cpu_type(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """``x.type(torch.float32)`` / ``x.type("torch.FloatTensor")``: a conversion that keeps the tensor where it is
    (unlike ``torch.cuda.FloatTensor``, or a ``Tensor`` alias that may be one)."""
    text = string_value(expr)
    if text is not None:
        return "cuda" not in text
    dotted = dotted_name(expr) or ""
    return dotted.rsplit(".", 1)[-1] in _DTYPE_NAMES and (ctx.qualified_name(expr) or "").startswith("torch.")


def _mentions(expr: cst.CSTNode, names: dict[str, str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in expression_nodes(expr))


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _target_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _target_paths(target: cst.BaseExpression) -> list[str]:
    """``self.loader`` for ``self.loader = ...``; every element's path for ``self.model, self.loader = ...``."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [path for element in target.elements for path in _target_paths(element.value)]
    if isinstance(target, cst.StarredElement):
        return _target_paths(target.value)
    path = dotted_name(target)
    return [path] if path is not None else []


@dataclass
class _CpuBatchUse:
    call: cst.Call  # ``model(images)``
    callee: str  # "model"
    argument: str  # "images"
    root: str  # the batch variable: "images" for ``images.view(-1, 784)``
    discarded_move: Optional[cst.Call] = None  # ``images.to(device)`` whose result nobody kept


class _BatchFlow:
    """Where a loop's batch goes, statement by statement: still on the CPU, or moved (or handed to a helper)."""

    def __init__(self, names: list[str], ctx: FileContext) -> None:
        self.ctx = ctx
        self.state: dict[str, str] = {name: _CPU for name in names}
        self.discarded: dict[str, cst.Call] = {}
        self.uses: list[_CpuBatchUse] = []
        self.gave_up = False  # the batch went to a helper that may move it in place

    def status(self, expr: cst.BaseExpression) -> Optional[str]:
        if _mentions(expr, self.state) and _moves_or_handles_device(expr, self.ctx):
            return _MOVED
        while True:
            if isinstance(expr, cst.Name):
                return self.state.get(expr.value)
            if isinstance(expr, (cst.Subscript, cst.Attribute)):
                expr = expr.value
            elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
                    expr.func.attr.value in _KEEPS_PLACE:
                expr = expr.func.value
            else:
                return None

    def run(self, statements: Iterable[cst.CSTNode]) -> None:
        for statement in statements:
            if self.gave_up:
                return
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._small(small)
                continue
            for header in self._headers(statement):
                self._calls(header)
            for block in self._blocks(statement):
                self.run(block)

    @staticmethod
    def _headers(statement: cst.CSTNode) -> list[cst.CSTNode]:
        if isinstance(statement, (cst.If, cst.While)):
            return [statement.test]
        if isinstance(statement, cst.For):
            return [statement.iter]
        if isinstance(statement, cst.With):
            return [item.item for item in statement.items]
        return []

    @staticmethod
    def _blocks(statement: cst.CSTNode) -> list[Sequence[cst.CSTNode]]:
        blocks = []
        for attr in ("body", "orelse", "finalbody"):
            part = getattr(statement, attr, None)
            while part is not None:
                inner = getattr(part, "body", None)
                if isinstance(inner, Sequence):
                    blocks.append(inner)
                    break
                part = inner
            if isinstance(part, cst.If):  # ``elif``
                blocks.append([part])
        for handler in getattr(statement, "handlers", ()):
            blocks.append(handler.body.body)
        return blocks

    def _small(self, small: cst.CSTNode) -> None:
        if isinstance(small, cst.Assign):
            self._calls(small.value)
            for target in small.targets:
                self._assign(target.target, small.value)
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and small.value is not None:
            self._calls(small.value)
            self._assign(small.target, small.value)
        elif isinstance(small, cst.Expr):
            value = small.value
            if isinstance(value, cst.Call) and _mentions(value, self.state) and \
                    _moves_or_handles_device(value, self.ctx):
                receiver = call_receiver(value)
                name = method_name(value)
                if name in ("to", "cuda") and isinstance(receiver, cst.Name) and \
                        self.state.get(receiver.value) == _CPU and not any(_mentions(a.value, self.state)
                                                                            for a in value.args):
                    self.discarded[receiver.value] = value  # ``x.to(device)``: a tensor's .to returns a copy
                else:
                    self.gave_up = True  # ``to_device(batch, device)``, ``batch.to_gpu()``: may move in place
                    return
            self._calls(value)
        else:
            self._calls(small)

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
                for t, v in zip(target.elements, value.elements):
                    self._assign(t.value, v.value)
                return
            status = self.status(value)
            for name in _target_names(target):
                self._set(name, status)
            return
        if isinstance(target, cst.Name):
            self._set(target.value, self.status(value))
        elif isinstance(target, (cst.Subscript, cst.Attribute)):
            root = _receiver_root(target)
            if root in self.state and self.status(value) == _MOVED:
                self.state[root] = _MOVED  # ``batch["x"] = batch["x"].to(device)``

    def _set(self, name: str, status: Optional[str]) -> None:
        if status is None:
            self.state.pop(name, None)
        else:
            self.state[name] = status
        self.discarded.pop(name, None)

    def _calls(self, expr: cst.CSTNode) -> None:
        """Calls of a module (``model(x)``, ``self.net(**batch)``) given a batch value still on the CPU."""
        for node in expression_nodes(expr):
            if not isinstance(node, cst.Call) or not node.args:
                continue
            callee = dotted_name(node.func)
            if callee is None or (isinstance(node.func, cst.Attribute) and not callee.startswith("self.")):
                continue
            # only the main input: later ones may stay on the CPU on purpose (pack_padded_sequence's lengths)
            arg = node.args[0]
            if self.status(arg.value) == _CPU:
                root = _receiver_root(arg.value) or ""
                shown = ("**" if arg.star == "**" else "*" if arg.star else "") + _short(self.ctx, arg.value, 40)
                self.uses.append(_CpuBatchUse(node, callee, shown, root, self.discarded.get(root)))


@dataclass
class _LoaderLoop:
    loop: cst.For
    fn: Optional[cst.FunctionDef]
    cls: Optional[cst.ClassDef]
    iterable: cst.BaseExpression  # the loader expression, unwrapped from enumerate()/tqdm()


class BatchNotMovedToDevice(Rule):
    id = "TR705"
    source_hint = (re.compile(r"DataLoader"), re.compile(r"\.(?:to|cuda)\s*\("))
    slug = "batch-not-moved-to-device"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "model moved to a (CUDA-capable) device, but the batches of its DataLoader loop are fed to it unmoved"
    what = """
        Flags a call of a model that was moved with `.to(device)` / `.cuda()` (to a device that can
        be CUDA: `"cuda" if torch.cuda.is_available() else "cpu"`, `args.device`...) inside a loop
        over a `torch.utils.data.DataLoader` of this file, when an input of the call comes from the
        loader's batch and nothing in the loop moves it: `.to(...)`/`.cuda()` on it, or any helper
        that handles devices. A `x.to(device)` whose result is thrown away does not count as a
        move. Quiet when the loader has a `collate_fn`, when its dataset is not one the file shows
        to stay on the CPU (torchvision/torchaudio data sets, `TensorDataset` of unmoved tensors, a
        `Dataset` class of the file that never mentions a device), when the model is wrapped in
        `DataParallel`/`DistributedDataParallel` (they move inputs themselves), or when the
        model's class moves its inputs in `forward`.
    """
    why = """
        A DataLoader yields CPU tensors. The model's parameters are on the GPU, so the first
        forward raises "Expected all tensors to be on the same device" as soon as the script runs
        where CUDA is available, typically on the training machine, after a CPU-only test passed.
        A `tensor.to(device)` written as a statement does nothing: unlike `Module.to`, it returns
        a moved copy and leaves the tensor where it was.
    """
    example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        for images, labels in train_loader:
            labels = labels.to(device)
            loss = criterion(model(images), labels)
    """
    fix_example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            loss = criterion(model(images), labels)
    """
    VALID = [
        # every batch value is moved, in each of the usual spellings
        """
        import torch
        from torch.utils.data import DataLoader
        from torchvision import datasets
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        loader = DataLoader(datasets.MNIST("data", download=True), batch_size=64)
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            out = model(data)
        for i, (images, labels) in enumerate(loader):
            images = images.reshape(-1, 28 * 28).to(device)
            out = model(images)
        for batch in loader:
            batch = tuple(t.to(device) for t in batch)
            x, y = batch
            out = model(x)
        for x, y in loader:
            out = model(x.to(device, non_blocking=True))
        for x, y in loader:
            if use_cuda:
                x, y = x.cuda(), y.cuda()
            out = model(x)
        """,
        # a helper moves the batch; a collate_fn may; DataParallel scatters CPU inputs itself
        """
        import torch
        from torch.utils.data import DataLoader
        from torchvision.datasets import CIFAR10
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = Net().to(device)
        loader = DataLoader(CIFAR10("data"), batch_size=64)
        for batch in loader:
            batch = to_device(batch, device)
            out = model(batch[0])
        gpu_loader = DataLoader(CIFAR10("data"), collate_fn=collate_to_gpu)
        for x, y in gpu_loader:
            out = model(x)
        """,
        """
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader
        from torchvision.datasets import CIFAR10
        model = nn.DataParallel(Net()).cuda()
        for x, y in DataLoader(CIFAR10("data")):
            out = model(x)
        """,
        # a loader rebound by accelerate's prepare (it moves the batches); a legacy GAN's ``.type(Tensor)`` copy,
        # ``Tensor`` being ``torch.cuda.FloatTensor`` when CUDA is used
        """
        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader, TensorDataset
        from torchvision.datasets import MNIST
        accelerator = Accelerator()
        model = Net().to(accelerator.device)
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64)), batch_size=8)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for x, y in loader:
            out = model(x)
        cuda = torch.cuda.is_available()
        critic = Critic()
        if cuda:
            critic.cuda()
        Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
        for imgs, _ in DataLoader(MNIST("data"), batch_size=64):
            score = critic(imgs.type(Tensor))
        """,
        # the model stays on the CPU; a data set of the file that already holds GPU tensors
        """
        import torch
        from torch.utils.data import DataLoader, Dataset, TensorDataset
        model = Net()
        loader = DataLoader(TensorDataset(xs, ys), batch_size=8)
        for x, y in loader:
            out = model(x)
        class OnGpu(Dataset):
            def __getitem__(self, i):
                return self.x[i].to(self.device)
        net = Net().cuda()
        for x in DataLoader(OnGpu()):
            out = net(x)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            train_loader = DataLoader(datasets.MNIST("data", train=True), batch_size=64, shuffle=True)
            for epoch in range(10):
                for images, labels in train_loader:
                    labels = labels.to(device)
                    loss = criterion(model(images), labels)
            """,
            line=11, message="`images` from `train_loader` reaches `model(...)`",
        ),
        # the loader passed to a training function; ``x.to(device)`` thrown away
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            def train(net, loader, optimizer, device):
                for step, (x, y) in enumerate(loader):
                    x.to(device)
                    y = y.to(device)
                    out = net(x.view(x.size(0), -1))
                    loss = F.nll_loss(out, y)

            device = "cuda:0" if torch.cuda.is_available() else "cpu"
            model = MLP().to(device)
            data = DataLoader(TensorDataset(torch.randn(100, 4), torch.randint(0, 2, (100,))), batch_size=10)
            train(model, data, opt, device)
            """,
            line=9, message="`x.to(device)` on line 7 returns a moved copy that is thrown away",
        ),
        # a model attribute, a dict batch given as keywords
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision.datasets import ImageFolder

            class Trainer:
                def __init__(self, args):
                    self.model = Classifier().to(args.device)
                    self.loader = None

                def fit(self):
                    loader = DataLoader(ImageFolder("train"), batch_size=32, shuffle=True)
                    for batch in tqdm(loader, desc="train"):
                        logits = self.model(batch[0])
            """,
            line=14, message="`self.model`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.loops: list[_LoaderLoop] = []
        # (scope, name) -> the call that moved that module to a device that can be CUDA; the scope is the
        # enclosing function (None: module level) or, for ``self.x``, the class
        self.moved: dict[tuple[Optional[int], str], cst.Call] = {}
        self.wrapped = False  # DataParallel / DistributedDataParallel scatter CPU inputs themselves
        self.moved_back: set[str] = set()  # modules also moved to the CPU somewhere: which device holds them is unclear

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        _observe_assign(node, ctx)  # ``device = ...`` in one branch of an ``if``: its CUDA names

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        iterable = iterated(node.iter)
        if isinstance(iterable, (cst.Name, cst.Attribute, cst.Call)):
            self.loops.append(_LoaderLoop(node, ctx.function_def, ctx.class_def, iterable))

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name in ("DataParallel", "DistributedDataParallel") and is_data_parallel(ctx.call_name(node)):
            self.wrapped = True
            return
        if name == "cpu" or (name == "to" and string_value(argument(node, 0, "device")) == "cpu"):
            back = call_receiver(node)
            if isinstance(back, (cst.Name, cst.Attribute)):
                self.moved_back.add(dotted_name(back) or "")  # ``model.cpu()`` for export or CPU inference
            return
        if name == "cuda":
            cuda = not any(a.keyword is None and not isinstance(a.value, cst.Integer) for a in node.args)
        elif name == "to" and _to_moves_device(node, ctx):
            device = keyword_arg(node, "device")
            cuda = _is_cuda_device(device.value if device is not None else argument(node, 0, "device"), ctx)
        else:
            return
        if not cuda:
            return
        statement = ctx.statement_of(node)
        moved: Optional[str] = None
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1 and _chain_top(node, ctx) is \
                statement.value:
            moved = dotted_name(statement.targets[0].target)
        elif isinstance(statement, cst.Expr) and statement.value is node:
            moved = dotted_name(call_receiver(node))
        if moved is None or "loss" in moved.lower() or "criterion" in moved.lower():
            return
        if moved.startswith("self."):
            scope = id(ctx.class_def) if ctx.class_def is not None else None
        else:
            scope = id(ctx.function_def) if ctx.function_def is not None else None
        self.moved.setdefault((scope, moved), node)

    def end_file(self, ctx: FileContext) -> None:
        if self.wrapped or not self.moved:
            return
        for entry in self.loops:
            loader = self._loader(entry.iterable, entry.loop, entry.fn, 0, entry.cls)
            if loader is None or not self._stays_on_cpu(loader, ctx):
                continue
            flow = _BatchFlow([n for n in self._batch_names(entry.loop)], ctx)
            flow.run(entry.loop.body.body)
            for use in flow.uses:
                move = self._model_move(use.callee, entry)
                if move is None or self._forward_moves_inputs(move, ctx):
                    continue
                self.report(use.call, self._message(use, entry, move, ctx), related=((move, "the model is moved here"),))
                break

    def _message(self, use: _CpuBatchUse, entry: _LoaderLoop, move: cst.Call, ctx: FileContext) -> str:
        loader = _short(ctx, entry.iterable, 40)
        if method_name(move) == "to":
            target = keyword_arg(move, "device")
            device = ctx.module.code_for_node(target.value if target is not None else move.args[0].value)
            moved_to = f"`.to({device})`"
            device = self._device_in_loop(device, move, entry)
            copy = f".to({device})"
        else:
            device, moved_to, copy = "the GPU", "`.cuda()`", ".cuda()"
        # one code-generation pass for both lines
        positions = ctx.positions([n for n in (move, use.discarded_move) if n is not None])
        line = positions[move].start.line
        if use.discarded_move is not None:
            discarded_line = positions[use.discarded_move].start.line
            how = (f"`{_short(ctx, use.discarded_move, 40)}` on line {discarded_line} returns a moved copy that is "
                   f"thrown away (a tensor's `.to` is not in place), so `{use.argument}` from `{loader}` still "
                   f"reaches `{use.callee}(...)` on the CPU")
            fix = f"keep the copy: `{use.root} = {_short(ctx, use.discarded_move, 40)}`"
        else:
            how = f"`{use.argument}` from `{loader}` reaches `{use.callee}(...)` without being moved"
            fix = (f"move it in the loop (`{use.root} = {use.root}{copy}`)" if use.argument == use.root
                   else f"move each tensor of `{use.root}` to {device if device == 'the GPU' else f'`{device}`'} "
                        f"in the loop")
        return (f"{how}, while `{use.callee}` was moved with {moved_to} (line {line}): a DataLoader yields CPU "
                f"tensors, so where CUDA is available the forward raises \"Expected all tensors to be on the same "
                f"device\"; {fix}")

    def _device_in_loop(self, device: str, move: cst.Call, entry: _LoaderLoop) -> str:
        """The device as the loop can spell it: ``self.device`` for a trainer whose ``__init__`` moved the model with
        its ``device`` parameter and kept it (``self.device = device``)."""
        if entry.cls is None or self._function_of(move) is entry.fn or "." in device:
            return device
        for node in expression_nodes(entry.cls.body):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Name) and \
                    node.value.value == device and (dotted_name(node.targets[0].target) or "").startswith("self."):
                return dotted_name(node.targets[0].target) or device
        return device

    @staticmethod
    def _batch_names(loop: cst.For) -> list[str]:
        target = loop.target
        if isinstance(loop.iter, cst.Call) and dotted_name(loop.iter.func) == "enumerate" and \
                isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
            target = target.elements[1].value  # ``for i, (x, y) in enumerate(loader)``: not the counter
        return _target_names(target)

    def _loader(self, expr: cst.BaseExpression, use: cst.CSTNode, fn: Optional[cst.FunctionDef],
                depth: int, cls: Optional[cst.ClassDef] = None) -> Optional[cst.Call]:
        """The ``DataLoader(...)`` call of this file that ``expr`` holds, following assignments and, for a
        parameter, every call of its function; None when any of them is something else or unknown."""
        if depth > 3:
            return None
        if isinstance(expr, cst.Call):
            return expr if self.ctx.call_name(expr) in _DATALOADERS else None
        name = dotted_name(expr)
        if name is None:
            return None
        if cls is not None and name.startswith("self.") and name.count(".") == 1:
            value = self._only_assignment(cls, name)  # ``self.train_loader = DataLoader(...)`` in ``__init__``
            return self._loader(value, value, None, depth + 1) if value is not None else None
        # ``model, loader = accelerator.prepare(model, loader)``: the prepared loader, which moves its batches
        value = assignment_before(self.ctx, use, name, unpacked=True)
        if value is not None:
            return self._loader(value, use, fn, depth + 1)
        if fn is None or "." in name or parameter_index(fn, name) is None and not any(
                p.name.value == name for p in fn.params.kwonly_params):
            return None
        values = call_site_values(self.ctx, fn, name)
        if not values:
            return None
        found = [self._loader(v, v, self._function_of(v), depth + 1) for v in values]
        return found[0] if all(found) else None

    @staticmethod
    def _only_assignment(cls: cst.ClassDef, name: str) -> Optional[cst.BaseExpression]:
        """The value of the one statement of the class that binds the attribute ``name`` (``self.loader``); None when
        several do, or one unpacks (``self.model, self.loader = accelerator.prepare(...)``)."""
        values = [node.value for node in expression_nodes(cls.body) if isinstance(node, cst.Assign)
                  for target in node.targets if name in _target_paths(target.target)]
        augmented = any(isinstance(node, (cst.AugAssign, cst.AnnAssign)) and dotted_name(node.target) == name
                        for node in expression_nodes(cls.body))
        if len(values) != 1 or augmented:
            return None
        return values[0] if isinstance(values[0], cst.Call) else None

    def _function_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        return next((a for a in self.ctx.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def _stays_on_cpu(self, loader: cst.Call, ctx: FileContext) -> bool:
        """Whether this file shows that the loader's batches are CPU tensors."""
        for arg in loader.args:
            if arg.star and not self._plain_options(arg.value, loader, ctx):
                return False
        collate = keyword_arg(loader, "collate_fn")
        if collate is not None and not (isinstance(collate.value, cst.Name) and collate.value.value == "None"):
            return False
        dataset: Optional[cst.BaseExpression] = argument(loader, 0, "dataset")
        for _ in range(4):
            if not isinstance(dataset, (cst.Name, cst.Attribute)):
                break
            dataset = assignment_before(ctx, loader, dotted_name(dataset) or "", unpacked=True)
        if not isinstance(dataset, cst.Call):
            return False
        called = ctx.call_name(dataset) or dotted_name(dataset.func) or ""
        if called.startswith(_CPU_DATASETS):
            return True
        if called.rsplit(".", 1)[-1] == "TensorDataset":
            for arg in dataset.args:
                value = arg.value
                if isinstance(value, (cst.Name, cst.Attribute)):
                    value = assignment_before(ctx, loader, dotted_name(value) or "", unpacked=True)
                    if value is None:
                        return False
                if _MOVES_IN_TEXT.search(ctx.module.code_for_node(value)):
                    return False
            return True
        cls = self._class_in_file(called, ctx)
        if cls is None:
            return False
        text = ctx.module.code_for_node(cls)
        # it never names a device, and it makes tensors (not raw text a model might tokenize and move itself)
        return not _MOVES_IN_TEXT.search(text) and _MAKES_TENSORS.search(text) is not None

    @staticmethod
    def _plain_options(expr: cst.BaseExpression, loader: cst.Call, ctx: FileContext) -> bool:
        """``**train_kwargs`` built in this file as a dict (``{"batch_size": 64}``, updated with more), in a file that
        never names a collate function: the options cannot carry one."""
        if "collate" in ctx.source:
            return False
        if isinstance(expr, (cst.Name, cst.Attribute)):
            expr = assignment_before(ctx, loader, dotted_name(expr) or "")
        branches = [expr.body, expr.orelse] if isinstance(expr, cst.IfExp) else [expr]  # ``{...} if cuda else {}``
        return all(isinstance(e, cst.Dict) or (isinstance(e, cst.Call) and dotted_name(e.func) == "dict")
                   for e in branches)

    @staticmethod
    def _class_in_file(name: str, ctx: FileContext) -> Optional[cst.ClassDef]:
        return next((s for s in ctx.module.body if isinstance(s, cst.ClassDef) and s.name.value == name), None)

    def _model_move(self, callee: str, entry: _LoaderLoop) -> Optional[cst.Call]:
        if "loss" in callee.lower() or "criterion" in callee.lower() or callee in self.moved_back:
            return None
        if callee.startswith("self."):
            return self.moved.get((id(entry.cls) if entry.cls is not None else None, callee))
        fn = entry.fn
        if fn is not None and callee in self._bound_names(fn):
            own = self.moved.get((id(fn), callee))
            if own is not None:
                return own
            if parameter_index(fn, callee) is None:
                return None
            values = call_site_values(self.ctx, fn, callee) or []
            for value in values:
                name = dotted_name(value)
                scope = self._function_of(value)
                found = self.moved.get((id(scope) if scope is not None else None, name or ""))
                if found is not None:
                    return found
            return None
        return self.moved.get((None, callee))

    @staticmethod
    def _bound_names(fn: cst.FunctionDef) -> set[str]:
        names = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
        for node in expression_nodes(fn.body):
            if isinstance(node, cst.AssignTarget):
                names.update(_target_names(node.target))
        return names

    def _forward_moves_inputs(self, move: cst.Call, ctx: FileContext) -> bool:
        """The model's class (of this file) moves what it is given: ``x = x.to(self.device)`` in forward."""
        built = move
        while isinstance(built, cst.Call) and isinstance(built.func, cst.Attribute):
            built = built.func.value
        if isinstance(built, (cst.Name, cst.Attribute)):
            built = assignment_before(ctx, move, dotted_name(built) or "")
        if not isinstance(built, cst.Call):
            return False
        cls = self._class_in_file((dotted_name(built.func) or "").rsplit(".", 1)[-1], ctx)
        if cls is None:
            return False
        for forward in cls.body.body:
            if not (isinstance(forward, cst.FunctionDef) and forward.name.value == "forward"):
                continue
            inputs = {p.name.value for p in (*forward.params.params, *forward.params.kwonly_params)} - {"self"}
            for node in expression_nodes(forward.body):
                if isinstance(node, cst.Call) and method_name(node) in ("to", "cuda", "type_as") and \
                        _receiver_root(call_receiver(node)) in inputs:
                    return True
        return False
