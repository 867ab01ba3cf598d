"""TR701 tensor-without-device: tensor created in forward/training step without device= in a model that runs on CUDA."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
import libcst as cst

from analyzers.context import (FileContext, dotted_name, keyword_arg,
                               method_name, short)
from analyzers.program.devices import embedding_attributes, expression_nodes, sets_default_device
from analyzers.program.flow import (computed_into, decides_branch, makes_python_number, read_only_as_host_scalar,
                                   reads_of, subtree)
from analyzers.program.state import runs_only_off_cuda
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.devices import (device_like_name as _device_like_name, device_facts as _facts,
                                       observe as _observe, observe_assign as _observe_assign,
                                       chain_top as _chain_top, returns_its_argument,
                                       to_moves_device as _to_moves_device)


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
        # wrapped in the deprecated Variable (which returns the tensor it is given), then moved under the flag that
        # moves the model
        """
        import torch
        from torch import nn
        from torch.autograd import Variable
        ON_GPU = torch.cuda.is_available()
        class Scorer(nn.Module):
            def forward(self, x):
                scores = Variable(torch.zeros(x.size(0)))
                if ON_GPU:
                    scores = scores.cuda()
                return scores + x.sum(1)
        model = Scorer()
        if ON_GPU:
            model.cuda()
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
        # computed once into a cache, which keeps it on the input's device
        """
        import torch
        import torch.nn as nn
        class Rotary(nn.Module):
            def forward(self, x):
                if self.theta is None:
                    theta = 1.0 / (10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))
                    self.theta = theta.to(x.device).to(x.dtype)
                return x * self.theta
        model = Rotary().cuda()
        """,
        # the CPU branch of a device test: the mask meets CPU inputs there
        """
        import torch
        import torch.nn as nn
        class MaskedDrop(nn.Module):
            def forward(self, x):
                on_gpu = x.is_cuda
                if on_gpu:
                    self.mask = (torch.rand(x.shape[1]) > 0.5).float().to("cuda")
                else:
                    self.mask = (torch.rand(x.shape[1]) > 0.5).float()
                return x * self.mask
        model = MaskedDrop().cuda()
        """,
        # random crop offsets: 0-dim tensors Python reads as slice bounds, on the host
        """
        import torch
        import torch.nn as nn
        class RandomCrops(nn.Module):
            def forward(self, images, n: int):
                crops = []
                for _ in range(n):
                    size = int(torch.rand([]) * self.size) + 1
                    top = torch.randint(0, images.shape[2] - self.size + 1, ())
                    left = torch.randint(0, images.shape[3] - self.size + 1, ())
                    crops.append(images[:, :, top : top + self.size, left : left + self.size])
                return torch.cat(crops)
        model = RandomCrops().cuda()
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
        # the default device named in a comment and a message, never set
        Invalid(
            """
            import torch
            import torch.nn as nn
            # without torch.set_default_device("cuda") the noise below is made on the CPU
            class Noisy(nn.Module):
                def forward(self, x):
                    return x + torch.randn(x.shape[-1])
            model = Noisy().cuda()
            print("call set_default_device to change this")
            """,
            line=7, message="torch.randn",
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
        if self._moved_or_host(node, ctx) or runs_only_off_cuda(ctx, node):
            return  # moved, read on the host, or made where the input was found to be on the CPU
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
            if isinstance(parent, cst.ComparisonTarget) and isinstance(grand, cst.Comparison) or \
                    isinstance(parent, cst.Comparison) and parent.left is current:
                comparison = grand if isinstance(parent, cst.ComparisonTarget) else parent
                if decides_branch(comparison, ctx) and not any(
                        isinstance(operand, cst.Call) for operand in
                        [comparison.left, *(target.comparator for target in comparison.comparisons)]
                        if operand is not current):
                    return True  # ``if torch.rand(1) < p:`` a host-side draw decides a branch
                current = comparison  # ``(torch.rand(n) > p).float().to(device)``: a mask, then moved
                continue
            if returns_its_argument(grand, parent, ctx):
                current = grand  # ``Variable(torch.zeros(n)).cuda()``: the same tensor, moved
                continue
            if isinstance(parent, cst.Arg) and isinstance(grand, cst.Call):
                sink = method_name(grand)
                if sink in _HOST_SINKS or makes_python_number(grand, ctx):
                    return True
                if isinstance(grand.func, cst.Attribute) and (ctx.call_name(grand) or "").startswith("torch."):
                    current = grand  # ``torch.triu(torch.ones(n, n)).to(device)``: follow the torch op
                    continue
                return False
            return False

    def end_file(self, ctx: FileContext) -> None:
        if not self.candidates or sets_default_device(ctx):
            return  # ``torch.set_default_device("cuda")``: tensors made without device= land on it
        cuda = _facts(ctx).cuda_evidence
        moved = _facts(ctx).moved_roots
        for cand in self.candidates:
            if cand.target is not None and cand.target.split(".")[0] in moved.get(id(cand.fn), ()):
                continue
            if cand.target is not None and "." not in cand.target and \
                    read_only_as_host_scalar(ctx, cand.fn, cand.target):
                continue  # a random offset used as a slice bound: Python reads it on the host, no device sees it
            holder = cand.target or computed_into(cand.call, ctx)
            reads = reads_of(ctx, cand.fn, holder) if holder is not None and "." not in holder else []
            if reads and all(self._moved_or_host(read, ctx) for read in reads):
                continue  # every use moves it first (``self.theta = theta.to(x.device)``, a cache filled once)
            # a model file that moves nothing itself (nanoGPT's model.py: train.py moves it) is still told about
            # position ids for its own embedding, which break on any GPU, one level lower
            embedding = self._embedding_fed(cand, ctx) if cuda or cand.owner.endswith(".forward()") else None
            if not cuda and embedding is None:
                continue
            shown = short(ctx, cand.call, 70)
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
        tables = embedding_attributes(cls, ctx) if cls is not None else set()
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
