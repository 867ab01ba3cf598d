"""Where code selects its device (a CUDA selection with a CPU fallback, code that runs only when CUDA is there),
which expressions name a CUDA device, which calls move a value to one, and whether a file uses CUDA at all."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence

import libcst as cst

from analyzers.context import (FileContext, code_children, iter_names, string_value, argument, call_receiver,
                               dotted_name, is_true, keyword_arg, method_name, short)
from analyzers.program.flow import ModuleNodes, targets
from analyzers.program.names import last_segment, name_words, names_configuration
from analyzers.program.library import (AUTOCAST_APIS, HALF_PRECISION_DTYPES, HALF_PRECISION_METHODS,
                                       HALF_PRECISION_SETTINGS, PRECISION_OPTIONS, STREAM_APIS, STREAM_METHODS, Does, does,
                                       is_data_parallel)

# ``if torch.cuda.is_available():`` / ``if use_cuda:`` / ``if device.type == "cuda":`` / ``if args.gpu:``
CUDA_TEST = re.compile(r"cuda|gpu|is_available|device|accelerat", re.IGNORECASE)


def expression_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The expression nodes under ``node`` (``code_children``: no whitespace, far cheaper than ``.children``)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(code_children(current))


def selects_with_cpu_fallback(value: cst.BaseExpression, ctx: FileContext) -> bool:
    """``torch.device("cuda" if torch.cuda.is_available() else "cpu")`` and its spellings."""
    if not any(name.endswith("is_available") for name in iter_names(value)):
        return False  # the cheap test first: most assignments name no availability check
    nodes = list(expression_nodes(value))
    asks = any(isinstance(n, cst.Call) and ctx.call_name(n) == "torch.cuda.is_available" for n in nodes)
    return asks and any(isinstance(n, cst.SimpleString) and string_value(n) == "cpu" for n in nodes)


def chooses_cuda_or_cpu(value: cst.BaseExpression, ctx: FileContext) -> bool:
    """``torch.device("cuda" if use_cuda else "cpu")`` / ``"cuda:0" if args.cuda else "cpu"``: CUDA or the CPU,
    chosen when the script runs (``selects_with_cpu_fallback`` is the spelling that asks
    ``torch.cuda.is_available()``)."""
    if type(value) is cst.Call:
        if method_name(value) != "device" or not value.args or ctx.call_name(value) != "torch.device":
            return False
        value = value.args[0].value
    if type(value) is not cst.IfExp:
        return False  # most assignments: the cheap test first
    arms = {string_value(value.body), string_value(value.orelse)}
    if "cpu" in arms and any(arm is not None and arm.startswith("cuda") for arm in arms):
        return True
    if selects_with_cpu_fallback(value, ctx):  # f"cuda:{rank}" if torch.cuda.is_available() else "cpu"
        return True
    # ``torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")``
    cpu_arm = any(string_value(arm) == "cpu" or (type(arm) is cst.Call and arm.args and ctx.call_name(arm) ==
                                                 "torch.device" and string_value(arm.args[0].value) == "cpu")
                  for arm in (value.body, value.orelse))
    return cpu_arm and any(type(n) is cst.Call and ctx.call_name(n) == "torch.accelerator.is_available"
                           for n in expression_nodes(value.test))


EMBEDDING_CLASSES = {"torch.nn.Embedding", "torch.nn.modules.sparse.Embedding"}


def embedding_attributes(cls: cst.ClassDef, ctx: FileContext) -> set[str]:
    """``self.wpe`` for ``self.wpe = nn.Embedding(...)``, ``self.transformer.wpe`` inside an
    ``nn.ModuleDict(dict(wpe=nn.Embedding(...)))`` (a table passed by keyword to a container)."""
    found: set[str] = set()
    for node in expression_nodes(cls.body):
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call)):
            continue
        target = dotted_name(node.targets[0].target)
        if target is None or not target.startswith("self."):
            continue
        if ctx.call_name(node.value) in EMBEDDING_CLASSES:
            found.add(target)
            continue
        for inner in expression_nodes(node.value):
            if isinstance(inner, cst.Arg) and inner.keyword is not None and isinstance(inner.value, cst.Call) \
                    and ctx.call_name(inner.value) in EMBEDDING_CLASSES:
                found.add(f"{target}.{inner.keyword.value}")
    return found


def _names_and_strings(expr: cst.BaseExpression) -> list[str]:
    return list(iter_names(expr)) + [string_value(n) or "" for n in expression_nodes(expr)
                                     if isinstance(n, cst.SimpleString)]


def runs_only_with_cuda(node: cst.CSTNode, selection_ids: set[int], ctx: FileContext) -> bool:
    """``node`` sits in a device selection (one of ``selection_ids``), under a test of CUDA, or in a function or
    class named for the GPU."""
    below = node
    for ancestor in ctx.ancestors(node):
        if id(ancestor) in selection_ids:
            return True  # the selection itself
        if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and below is not ancestor.test and any(
                CUDA_TEST.search(name) for name in _names_and_strings(ancestor.test)):
            return True
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)) and CUDA_TEST.search(ancestor.name.value):
            return True
        below = ancestor
    return False


# Objects of a training library whose ``.device`` is the run's device (accelerate, Lightning Fabric, a Trainer)
_RUN_OBJECTS = {"accelerator", "fabric", "trainer"}


DTYPE_NAMES = {"float", "float16", "float32", "float64", "half", "double", "bfloat16", "int", "int8", "int16",
                "int32", "int64", "long", "short", "bool", "uint8", "complex64", "complex128", "cfloat", "cdouble"}


def computes_in_half_precision(ctx: FileContext) -> bool:
    """Does the file's code compute in a 16-bit float: a half dtype (``torch.float16``, ``torch.bfloat16``), an
    autocast region, ``.half()`` / ``.bfloat16()``, or a library's precision option set to one (``torch_dtype=``,
    ``mixed_precision="fp16"``, ``precision="bf16-mixed"``)? Words in comments and strings elsewhere say nothing."""
    nodes = ctx.facts(ModuleNodes)
    for node in nodes.of_type(cst.Name, cst.Attribute):
        qualified = ctx.qualified_name(node)
        if qualified in HALF_PRECISION_DTYPES or qualified in AUTOCAST_APIS:
            return True
    for call in nodes.of_type(cst.Call):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in HALF_PRECISION_METHODS and not call.args:
            return True
        for arg in call.args:
            if arg.keyword is None or arg.keyword.value not in PRECISION_OPTIONS:
                continue
            value = arg.value
            setting = string_value(value) if isinstance(value, cst.SimpleString) else \
                value.value if isinstance(value, cst.Integer) else None
            if setting in HALF_PRECISION_SETTINGS:
                return True
    return False


def overlaps_work_asynchronously(ctx: FileContext) -> bool:
    """Does the file's code order work across CUDA streams or copy to the host without waiting: a stream or an event
    (``torch.cuda.Stream()``, ``with torch.cuda.stream(s):``), ``record_stream`` / ``wait_stream``, or a
    ``non_blocking=True`` copy to the CPU? Such code may need an explicit synchronize to be correct."""
    nodes = ctx.facts(ModuleNodes)
    if any(ctx.qualified_name(node) in STREAM_APIS for node in nodes.of_type(cst.Name, cst.Attribute)):
        return True
    for call in nodes.of_type(cst.Call):
        name = method_name(call)
        if name in STREAM_METHODS and isinstance(call.func, cst.Attribute):
            return True
        if name in ("cpu", "to") and is_true(argument(call, 99, "non_blocking")) and \
                (name == "cpu" or string_value(argument(call, 0, "device")) == "cpu"):
            return True
    return False


def sets_default_device(ctx: FileContext) -> bool:
    """Does the file set the device tensors are created on without ``device=`` (:attr:`Does.SETS_DEFAULT_DEVICE`:
    ``torch.set_default_device("cuda")``)? A call, not a word: a comment or a string naming it sets nothing."""
    return any(does(ctx.call_name(call), Does.SETS_DEFAULT_DEVICE) for call in ctx.facts(ModuleNodes).of_type(cst.Call))


def keeps_gpu_busy(ctx: FileContext) -> bool:
    """Is the file's program built to keep the GPU busy (:attr:`Does.KEEPS_GPU_BUSY`): does it compile a module or
    function (``torch.compile(model)``, ``@torch.compile``) or capture CUDA graphs? Where it does, the host only
    launches the step's work, and anything that waits for the GPU every step undoes what the program set up; where
    it does not, a step's own launches and data loading already dominate and one host read more is not worth a
    comment."""
    nodes = ctx.facts(ModuleNodes)
    if any(does(ctx.call_name(call), Does.KEEPS_GPU_BUSY) for call in nodes.of_type(cst.Call)):
        return True
    return any(does(ctx.qualified_name(d.decorator), Does.KEEPS_GPU_BUSY) for d in nodes.of_type(cst.Decorator))


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
    return names_configuration(root) or root.lower() in _RUN_OBJECTS


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
    ``torch.arange(t).unsqueeze(0)[None]``, ``Variable(torch.zeros(n)).cuda()`` (a call that returns its argument)."""
    while True:
        parent = ctx.parent(node)
        grand = ctx.parent(parent) if parent is not None else None
        if isinstance(parent, cst.Attribute) and parent.value is node and isinstance(grand, cst.Call) and \
                grand.func is parent:
            node = grand
        elif isinstance(parent, cst.Subscript) and parent.value is node:
            node = parent
        elif returns_its_argument(grand, parent, ctx):
            node = grand
        else:
            return node


def returns_its_argument(call: Optional[cst.CSTNode], arg: Optional[cst.CSTNode], ctx: FileContext) -> bool:
    """``call`` hands back the tensor ``arg`` passes it (``Variable(t)``): the same value, for where it goes."""
    return isinstance(call, cst.Call) and isinstance(arg, cst.Arg) and bool(call.args) and call.args[0] is arg and \
        arg.keyword is None and does(ctx.call_name(call), Does.RETURNS_ITS_ARGUMENT)


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


# ---- where a loop's batch goes: still on the CPU, or moved -----------------------------------------------

# Calls that may move what they are given (``to_device(batch, device)``, ``batch = prepare_batch(batch)``): a loop
# that calls one is handling devices its own way, so it is not judged.
_DEVICE_HANDLING = re.compile(r"device|cuda|gpu|move|transfer|prepare|send|place", re.IGNORECASE)
# Tensor methods that keep a batch tensor where it is: ``x.view(-1, 784)`` is still on the CPU.
_KEEPS_PLACE = {"view", "reshape", "float", "long", "double", "half", "int", "bool", "squeeze", "unsqueeze",
                "permute", "transpose", "contiguous", "flatten", "clone", "detach", "t", "expand", "repeat",
                "type", "requires_grad_", "narrow", "chunk", "split", "unbind"}
_CPU, _MOVED = "cpu", "moved"


def moves_or_handles_device(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """``expr`` moves something to a device, or calls a helper that may (``to_device(b, dev)``)."""
    return any(isinstance(node, cst.Call) and _call_handles_device(node, ctx) for node in expression_nodes(expr))


def _call_handles_device(node: cst.Call, ctx: FileContext) -> bool:
    name = method_name(node) or ""
    if name == "cuda" or (name == "to" and to_moves_device(node, ctx)):
        return True
    if name == "type" and node.args and not keeps_place_type(node.args[0].value, ctx):
        return True  # ``imgs.type(Tensor)`` with ``Tensor = torch.cuda.FloatTensor if cuda else ...``
    if name != "to" and _DEVICE_HANDLING.search(name):
        return True
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == "device":
            return True
        if isinstance(arg.value, (cst.Name, cst.Attribute)) and device_like_name(dotted_name(arg.value)):
            return True
    return False


def places_on_a_device(code: cst.CSTNode, ctx: FileContext) -> bool:
    """Does ``code`` move a value or name a device to make one on: ``.to(device)``, ``.cuda()``, ``device=``, a
    ``device`` variable or attribute, a helper that moves (``to_device``). A ``.to(torch.float32)`` does not."""
    if moves_or_handles_device(code, ctx):
        return True
    return any("device" in name_words(node.value if isinstance(node, cst.Name) else node.attr.value)
               for node in expression_nodes(code) if isinstance(node, (cst.Name, cst.Attribute)))


def yields_host_tensors(code: cst.CSTNode, ctx: FileContext) -> bool:
    """Does ``code`` (a data set class) make tensors on the host: it uses torch or NumPy, or calls a tensor type or
    a transform, and never places anything on a device. Not raw text a model might tokenize and move itself."""
    if isinstance(code, cst.ClassDef):
        code = code.body  # its bases (``torch.utils.data.Dataset``) make nothing
    if places_on_a_device(code, ctx):
        return False
    for node in expression_nodes(code):
        if isinstance(node, cst.Call):
            words = name_words(last_segment(dotted_name(node.func)))
            if "tensor" in words or "transform" in words:
                return True
        elif isinstance(node, (cst.Name, cst.Attribute)) and \
                (ctx.qualified_name(node) or "").startswith(("torch.", "numpy.")):
            return True
    return False


def file_handles_devices(ctx: FileContext) -> bool:
    """Does the file's code place anything on a device, choose one or ask about one: ``.cuda()``, ``.to(device)``, a
    ``device=`` argument, ``torch.device(...)``, anything of ``torch.cuda``, a data-parallel wrapper? A file that
    never does runs its tensors where they are made, on the CPU, whatever its comments and strings say."""
    nodes = ctx.facts(ModuleNodes)
    for node in nodes.of_type(cst.Name, cst.Attribute):
        qualified = ctx.qualified_name(node) or ""
        if qualified == "torch.device" or qualified.startswith("torch.cuda.") or is_data_parallel(qualified):
            return True
    return any(_call_handles_device(call, ctx) for call in nodes.of_type(cst.Call))


def keeps_place_type(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """``x.type(torch.float32)`` / ``x.type("torch.FloatTensor")``: a conversion that keeps the tensor where it is
    (unlike ``torch.cuda.FloatTensor``, or a ``Tensor`` alias that may be one)."""
    text = string_value(expr)
    if text is not None:
        return "cuda" not in text
    dotted = dotted_name(expr) or ""
    return dotted.rsplit(".", 1)[-1] in DTYPE_NAMES and (ctx.qualified_name(expr) or "").startswith("torch.")


def _mentions(expr: cst.CSTNode, names: dict[str, str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in expression_nodes(expr))


@dataclass
class CpuBatchUse:
    call: cst.Call  # ``model(images)``
    callee: str  # "model"
    argument: str  # "images"
    root: str  # the batch variable: "images" for ``images.view(-1, 784)``
    discarded_move: Optional[cst.Call] = None  # ``images.to(device)`` whose result nobody kept


class BatchFlow:
    """Where a loop's batch goes, statement by statement: still on the CPU, or moved (or handed to a helper)."""

    def __init__(self, names: list[str], ctx: FileContext) -> None:
        self.ctx = ctx
        self.state: dict[str, str] = {name: _CPU for name in names}
        self.discarded: dict[str, cst.Call] = {}
        self.uses: list[CpuBatchUse] = []
        self.gave_up = False  # the batch went to a helper that may move it in place

    def status(self, expr: cst.BaseExpression) -> Optional[str]:
        if _mentions(expr, self.state) and moves_or_handles_device(expr, self.ctx):
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
                    moves_or_handles_device(value, self.ctx):
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
            for name in targets(target):
                self._set(name, status)
            return
        if isinstance(target, cst.Name):
            self._set(target.value, self.status(value))
        elif isinstance(target, (cst.Subscript, cst.Attribute)):
            root = receiver_root(target)
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
                root = receiver_root(arg.value) or ""
                shown = ("**" if arg.star == "**" else "*" if arg.star else "") + short(self.ctx, arg.value, 40)
                self.uses.append(CpuBatchUse(node, callee, shown, root, self.discarded.get(root)))
