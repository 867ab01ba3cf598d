"""What TR701, TR702, TR703 and TR705 share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional
import libcst as cst

from analyzers.context import (FileContext, argument, call_receiver, dotted_name, is_true, keyword_arg,
                               method_name, short, string_value)
from analyzers.program.library import Does, does, is_data_loader, is_data_parallel
from analyzers.program.data import dataset_in_memory
from analyzers.program.names import last_segment, names_evaluation_data
from analyzers.rules.base import Rule


# ---------------------------------------------------------------------------------------------
# "Does this file use CUDA?" — facts shared by the rules of this module, collected once per call
# node whichever rule sees it first, and judged only at end_file (``.cuda()`` may come last).

# Roots of expressions that carry run configuration: ``args.device``, ``cfg.device``...
CONFIG_ROOTS = {"args", "arg", "cfg", "config", "conf", "opt", "opts", "options", "hparams", "hp", "params",
                 "settings", "flags", "FLAGS", "training_args", "train_args", "accelerator", "fabric", "CFG",
                 "Config", "cfgs", "hyperparams", "hyp", "trainer"}
DTYPE_NAMES = {"float", "float16", "float32", "float64", "half", "double", "bfloat16", "int", "int8", "int16",
                "int32", "int64", "long", "short", "bool", "uint8", "complex64", "complex128", "cfloat", "cdouble"}


def device_like_name(dotted: Optional[str]) -> bool:
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
    return root in CONFIG_ROOTS or root.lower().endswith(("args", "cfg", "config"))


def is_cuda_device(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> bool:
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
        return is_cuda_device(expr.body, ctx, depth + 1) or is_cuda_device(expr.orelse, ctx, depth + 1)
    if isinstance(expr, cst.Call):
        name = method_name(expr)
        if name == "device":
            if ctx.call_name(expr) not in ("torch.device", "torch.cuda.device"):
                return False
            arg = argument(expr, 0, "type")
            if arg is None:
                arg = argument(expr, 0, "device")
            if isinstance(arg, (cst.Name, cst.Attribute)) and device_like_name(dotted_name(arg)):
                return True  # torch.device(args.device)
            return is_cuda_device(arg, ctx, depth + 1)
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
        if dotted in device_facts(ctx).cuda_names:
            return True  # assigned a CUDA device in one branch (``if use_cuda: device = ...``)
        binding = ctx.binding(dotted) if dotted else None
        if binding is not None and binding.kind in ("assign", "annassign", "walrus") and binding.value is not None:
            return is_cuda_device(binding.value, ctx, depth + 1) or (
                isinstance(binding.value, (cst.Name, cst.Attribute)) and device_like_name(dotted_name(binding.value))
                and ctx.binding(dotted_name(binding.value) or "") is None)
        if binding is not None and binding.kind == "param" and isinstance(binding.value, cst.Name) and \
                binding.value.value == "None":
            return False  # ``def __init__(self, dim, device=None)``: the factory-kwargs convention, the caller's choice
        if binding is None or binding.kind in ("param", "for", "with"):
            return device_like_name(dotted)
    return False


def receiver_root(expr: Optional[cst.BaseExpression]) -> Optional[str]:
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
class DeviceFacts:
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
            cuda = is_cuda_device(value, ctx)
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
            root = receiver_root(receiver)
            if root is not None and (name != "to" or to_moves_device(node, ctx)):
                self.moved_roots.setdefault(id(ctx.function_def), set()).add(root)
            if name == "type_as":
                return
            if name == "cuda":
                moved = True
            else:
                target = keyword_arg(node, "device")
                target_expr = target.value if target is not None else argument(node, 0, "device")
                moved = is_cuda_device(target_expr, ctx)
            if moved:
                self.cuda_evidence = True
                if not self.batch_moves and ctx.loop is not None and root is not None and loop_variable(root, ctx):
                    self.batch_moves = True
            return
        if name == "device" or name == "set_device":
            if ctx.call_name(node) in ("torch.cuda.set_device",) or is_cuda_device(node, ctx):
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
                if arg.keyword is not None and arg.keyword.value == "device" and is_cuda_device(arg.value, ctx):
                    self.cuda_evidence = True
                    return


def loop_variable(root: str, ctx: FileContext) -> bool:
    """A variable bound by, or assigned inside, a loop: a batch, not the model."""
    binding = ctx.binding(root)
    if binding is None:
        return True  # comprehension targets are bound after their element is visited
    return binding.kind == "for" or binding.loop is not None


class FileDeviceFacts(DeviceFacts):
    """The device facts of one file, kept with the file's other facts (``ctx.facts``)."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__()


def device_facts(ctx: FileContext) -> DeviceFacts:
    return ctx.facts(FileDeviceFacts)


OBSERVED = {"to", "cuda", "type_as", "device", "set_device", "DataParallel", "DistributedDataParallel", "prepare"}


def observe(node: cst.Call, ctx: FileContext) -> Optional[str]:
    name = method_name(node)
    facts = device_facts(ctx)
    if name in OBSERVED or (not facts.cuda_evidence and node.args and any(
            a.keyword is not None and a.keyword.value == "device" for a in node.args)):
        facts.observe(node, name, ctx)
    return name


def observe_assign(node: cst.Assign, ctx: FileContext) -> None:
    facts = device_facts(ctx)
    if node is not facts.last_assign:
        facts.last_assign = node
        facts.observe_assign(node, ctx)


def chain_top(node: cst.CSTNode, ctx: FileContext) -> cst.CSTNode:
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


def to_moves_device(call: cst.Call, ctx: FileContext) -> bool:
    """``.to(x.device)``/``.to(device)``/``.to(other)`` move; ``.to(torch.float32)``/``.to(dtype=...)`` do not."""
    if keyword_arg(call, "device") is not None:
        return True
    first = argument(call, 0, "device")
    if first is None:
        return False
    dotted = dotted_name(first)
    if dotted is not None:
        last = dotted.rsplit(".", 1)[-1]
        if last in DTYPE_NAMES and (ctx.qualified_name(first) or "").startswith("torch."):
            return False
        if last == "dtype" or last.endswith("_dtype"):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# DataLoader rules

@dataclass
class Loader:
    call: cst.Call
    label: str  # ``train_loader = DataLoader(train_ds, ...)`` → "train_loader"
    training: bool
    in_memory: bool = False  # MNIST-like or TensorDataset: nothing to decode, little to copy


def loader_of_call(node: cst.Call, ctx: FileContext) -> Optional[Loader]:
    if not is_data_loader(ctx.call_name(node)):
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
    if names_evaluation_data(last_segment(target)) or names_evaluation_data(last_segment(dataset_name)):
        training = False  # a shuffled test loader is still a test loader
    label = target or (f"DataLoader({dataset_name})" if dataset_name else short(ctx, node, 50))
    return Loader(node, label, training, dataset_in_memory(dataset, ctx))


class LoaderRule(Rule):
    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.loaders: list[Loader] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        observe_assign(node, ctx)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = observe(node, ctx)
        if name == "DataLoader" or (name is not None and name[:1].isupper() and isinstance(node.func, cst.Name)
                                    and name in ctx.imports.names):
            loader = loader_of_call(node, ctx)
            if loader is not None and self.wants(loader):
                self.loaders.append(loader)

    def wants(self, loader: Loader) -> bool:
        raise NotImplementedError
