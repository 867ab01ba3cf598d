"""Checkpoints: resuming without the optimizer state, loading onto GPU 0 from every rank."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, is_false, iter_names, keyword_arg, method_name,
                               short, string_value)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program import in_compat_fallback
from analyzers.program.devices import CUDA_TEST, runs_only_with_cuda, selects_with_cpu_fallback
from analyzers.program.library import Does, does, is_ddp
from analyzers.program.values import is_optimizer, is_scheduler
from analyzers.rules.base import Invalid, Rule
from analyzers.program.flow import subtree

# optimizers whose state is more than the learning rate (moments, momentum buffers)
_STATEFUL_SGD_KEYWORDS = ("momentum",)


def _words(name: str) -> list[str]:
    return name.rsplit(".", 1)[-1].lower().replace("-", "_").split("_")


_RESTORING_HELPERS = ("restart_from_checkpoint", "resume_checkpoint", "load_checkpoint")


def _mentions_resume(node: cst.CSTNode, ctx: FileContext) -> bool:
    code = ctx.module.code_for_node(node).lower()
    return "resume" in code or "restore" in code


class ResumeWithoutOptimizerState(Rule):
    id = "TR610"
    # a torch.load on a path or under a test that says resume/restore, and an optimizer that steps
    source_hint = (re.compile(r"(?i)resume|restore"), re.compile(r"load\s*\("), re.compile(r"\.step\s*\("))
    slug = "resume-without-optimizer-state"
    category = Category.SECURITY
    severity = Severity.MEDIUM
    summary = "Training resumes from a checkpoint but never restores the optimizer (or LR scheduler) state"
    what = """
        Flags a `torch.load` on a resume path (under `if args.resume...:`, or loading a path
        named like one) in a script that then trains with a stateful optimizer (Adam, AdamW,
        RMSprop, SGD with momentum...) and never calls `optimizer.load_state_dict(...)`; and,
        when the optimizer is restored, a stepped LR scheduler that is not (no
        `scheduler.load_state_dict(...)`, no `last_epoch=`).
    """
    why = """
        The optimizer's state (Adam's moment estimates, SGD's momentum buffers, the step count
        that drives bias correction and warm-up) is part of the training run. Resuming with a
        fresh optimizer restarts it: the first updates after a resume are effectively
        uncorrected, the loss jumps, and a run interrupted and resumed no longer reproduces an
        uninterrupted one. The same goes for the LR scheduler and the GradScaler.
    """
    example = """
        if args.resume:
            model.load_state_dict(torch.load(args.resume))
        optimizer = torch.optim.Adam(model.parameters())
        for epoch in range(start, epochs):
            ...
            torch.save(model.state_dict(), "last.pt")
    """
    fix_example = """
        if args.resume:
            ckpt = torch.load(args.resume)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            start = ckpt["epoch"] + 1
        ...
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch}, "last.pt")
    """
    VALID = [
        """
        import torch
        optimizer = torch.optim.Adam(model.parameters())
        if args.resume:
            ckpt = torch.load(args.resume)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        """,
        # evaluation only
        """
        import torch
        if args.resume:
            model.load_state_dict(torch.load(args.resume))
        with torch.no_grad():
            print(model(x))
        """,
        # plain SGD keeps no state
        """
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.resume:
            model.load_state_dict(torch.load(args.resume))
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """,
        # fine-tuning from pretrained weights is not a resume
        """
        import torch
        optimizer = torch.optim.AdamW(model.parameters())
        model.load_state_dict(torch.load(args.pretrained))
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            if args.resume_snapshot:
                model = torch.load(args.resume_snapshot)
            else:
                model = Net()
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            for batch in loader:
                opt.zero_grad()
                loss = criterion(model(batch.x), batch.y)
                loss.backward()
                opt.step()
            torch.save(model, "snapshot.pt")
            """,
            line=4, message="`opt` (`torch.optim.Adam(...)`)",
        ),
        Invalid(
            """
            import torch
            def main(args):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                if args.resume:
                    state = torch.load(args.resume, map_location="cpu")
                    model.load_state_dict(state["model"])
                    start_epoch = state["epoch"]
                train(model, optimizer)
            def train(model, optimizer):
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            optimizer = torch.optim.AdamW(model.parameters())
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
            if args.resume:
                ckpt = torch.load(args.resume)
                model.load_state_dict(ckpt["model"])
                optimizer.load_state_dict(ckpt["optimizer"])
            for epoch in range(start, 100):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
                scheduler.step()
            """,
            line=6, message="`scheduler` (`torch.optim.lr_scheduler.CosineAnnealingLR(...)`) starts over",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loads: list[cst.Call] = []
        self._restores = False
        self._trains = False
        self._optimizers: list[tuple[str, cst.Call]] = []
        self._schedulers: list[tuple[str, cst.Call]] = []
        self._restores_scheduler = False
        self._steps_scheduler = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            name = func.attr.value
            if name == "load_state_dict" and is_optimizer(func.value, ctx):
                self._restores = True
            elif name == "load_state_dict" and is_scheduler(func.value, ctx):
                self._restores_scheduler = True
            elif name == "step" and is_scheduler(func.value, ctx):
                self._steps_scheduler = True
            elif name == "step" and is_optimizer(func.value, ctx):
                self._trains = True
            elif name in _RESTORING_HELPERS:
                self._restores = self._restores_scheduler = True  # a helper that restores whatever it is given
        if name_of(func) in _RESTORING_HELPERS:
            self._restores = self._restores_scheduler = True
        elif any(is_optimizer(a.value, ctx) or is_scheduler(a.value, ctx) for a in node.args) and \
                self._is_resume(node, ctx):
            # load_ckpt(path, model, optimizer, scheduler): a helper that restores what it is given
            self._restores = True
            if any(is_scheduler(a.value, ctx) for a in node.args):
                self._restores_scheduler = True
        qualified = ctx.qualified_name(func) or ""
        if qualified.startswith("torch.optim.lr_scheduler.") and qualified.rsplit(".", 1)[-1][:1].isupper():
            parent = ctx.parent(node)
            if keyword_arg(node, "last_epoch") is None and isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = dotted_name(parent.targets[0].target)
                if target:
                    self._schedulers.append((target, node))
        elif qualified.startswith("torch.optim.") and ".lr_scheduler." not in qualified and \
                qualified.rsplit(".", 1)[-1][:1].isupper():
            parent = ctx.parent(node)
            target = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = dotted_name(parent.targets[0].target)
            self._optimizers.append((target or "the optimizer", node))
        elif does(qualified, Does.READS_TORCH_CHECKPOINT) and self._is_resume(node, ctx) and not in_compat_fallback(ctx, node):
            self._loads.append(node)

    @staticmethod
    def _is_resume(node: cst.Call, ctx: FileContext) -> bool:
        path = argument(node, 0, "f")
        if path is not None and _mentions_resume(path, ctx):
            return True
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, (cst.If, cst.While)) and _mentions_resume(ancestor.test, ctx):
                return True
            if isinstance(ancestor, cst.FunctionDef):
                return "resume" in ancestor.name.value.lower()
        return False

    def end_file(self, ctx: FileContext) -> None:
        if not self._loads or not self._trains:
            return
        if self._restores:
            self._scheduler(ctx)
            return
        stateful = [(name, call) for name, call in self._optimizers if self._has_state(call, ctx)]
        if not stateful:
            return
        name, call = stateful[0]
        shown = code_span(short(ctx, call.func) + "(...)")
        load = self._loads[0]
        self.report(load, f"{code_span(short(ctx, load))} resumes training, but {code_span(name)} ({shown}) never gets "
                          f"its state back: nothing calls {code_span(name + '.load_state_dict(...)')}, so the resumed run restarts "
                          f"the optimizer's moments and step count; save and restore the optimizer (and scheduler / "
                          f"GradScaler) state with the model")

    def _scheduler(self, ctx: FileContext) -> None:
        """The optimizer comes back but the LR scheduler starts over."""
        if self._restores_scheduler or not self._steps_scheduler or not self._schedulers:
            return
        name, call = self._schedulers[0]
        load = self._loads[0]
        self.report(load, f"{code_span(short(ctx, load))} resumes training and restores the optimizer, but "
                          f"{code_span(name)} ({code_span(short(ctx, call.func) + '(...)')}) starts over: nothing calls "
                          f"{code_span(name + '.load_state_dict(...)')}, so the learning rate jumps back to its initial "
                          f"schedule after every resume; save and restore the scheduler state too")

    @staticmethod
    def _has_state(call: cst.Call, ctx: FileContext) -> bool:
        qualified = ctx.qualified_name(call.func) or ""
        if qualified.rsplit(".", 1)[-1] != "SGD":
            return True
        momentum = keyword_arg(call, "momentum")
        if momentum is None:
            return False
        value = momentum.value
        return not (isinstance(value, (cst.Integer, cst.Float)) and float(value.value) == 0.0)


def name_of(func: cst.BaseExpression) -> Optional[str]:
    if isinstance(func, cst.Name):
        return func.value
    return None


# ---------------------------------------------------------------------------------------------
# TR611

# setting up a process group means distributed training, as does wrapping a model in DDP
_INIT_PROCESS_GROUP = "torch.distributed.init_process_group"


_CHECKPOINT_WORDS = ("ckpt", "checkpoint", "resume", "model", "weight", "state", "snapshot", "pretrained", ".pth",
                     "best", "last")


class _LoadsWithoutMapLocation(Rule):
    """What TR611 and TR613 both collect: checkpoint loads without ``map_location``, the scopes where some load
    passes one, and whether the file sets up distributed training."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loads: list[tuple[cst.Call, Optional[cst.CSTNode]]] = []
        self._mapped_scopes: set[Optional[cst.CSTNode]] = set()
        self._distributed = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last not in ("load", "init_process_group") and "DistributedDataParallel" not in \
                ctx.imports.names.get(last, last):
            return
        qualified = ctx.qualified_name(func)
        if qualified == _INIT_PROCESS_GROUP or is_ddp(qualified):
            self._distributed = True
            return
        if not does(qualified, Does.READS_TORCH_CHECKPOINT):
            return
        scope = ctx.function_def
        # ``torch.load(path, device)`` maps; ``torch.load(path, weights_only=True)`` does not
        if keyword_arg(node, "map_location") is not None or sum(a.keyword is None for a in node.args) > 1 or \
                any(a.star for a in node.args):
            self._mapped_scopes.add(scope)
            return
        if self._checkpoint_like(node, ctx):
            self._loads.append((node, scope))
            self.load_seen(node, ctx)

    def load_seen(self, node: cst.Call, ctx: FileContext) -> None:
        """A candidate load, at the point of the walk where it is (for what is in scope there)."""

    @staticmethod
    def _checkpoint_like(node: cst.Call, ctx: FileContext) -> bool:
        """A model checkpoint (tensors saved from a GPU), not a cached vocabulary or CPU feature file."""
        parent = ctx.parent(node)
        if isinstance(parent, cst.Arg):
            call = ctx.parent(parent)
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
                    call.func.attr.value == "load_state_dict":
                return True
        texts = [ctx.module.code_for_node(node.args[0].value) if node.args else ""]
        if isinstance(parent, cst.Assign):
            texts.append(ctx.module.code_for_node(parent.targets[0].target))
        text = " ".join(texts).lower()
        return any(word in text for word in _CHECKPOINT_WORDS)


class DistributedLoadWithoutMapLocation(_LoadsWithoutMapLocation):
    id = "TR611"
    source_hint = re.compile(r"distributed|DDP|rank")
    slug = "distributed-load-without-map-location"
    category = Category.SECURITY
    severity = Severity.MEDIUM
    summary = "torch.load without map_location in distributed code puts every rank's copy on GPU 0"
    what = """
        Flags `torch.load(...)` without `map_location=` in a file that sets up distributed
        training (`init_process_group` / `DistributedDataParallel`), unless another `torch.load`
        in the same function passes one.
    """
    why = """
        `torch.load` restores each tensor onto the device it was saved from, usually `cuda:0`.
        In a distributed job every rank then allocates the whole checkpoint on GPU 0: rank 0
        runs out of memory or the job slows down, and the stray CUDA context on GPU 0 stays for
        the whole run. Map to the CPU (or to the rank's own device) and let `load_state_dict`
        copy the tensors where the model lives.
    """
    example = """
        dist.init_process_group("nccl")
        ...
        ckpt = torch.load(args.resume)
    """
    fix_example = """
        ckpt = torch.load(args.resume, map_location="cpu")
        # or map_location=f"cuda:{local_rank}"
    """
    VALID = [
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        ckpt = torch.load(args.resume, map_location="cpu")
        """,
        # not distributed
        """
        import torch
        ckpt = torch.load(args.resume)
        """,
        # the other branch handles it
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def resume(args):
            if args.gpu is None:
                checkpoint = torch.load(args.resume)
            else:
                checkpoint = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist
            def main(rank):
                dist.init_process_group("nccl", rank=rank)
                model = Net().to(rank)
                if args.resume:
                    model.load_state_dict(torch.load(args.resume))
            """,
            line=8, message="`torch.load(args.resume)`",
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            state = torch.load("checkpoint.pt")
            model = DDP(model, device_ids=[local_rank])
            """,
            line=4, message="usually GPU 0",
        ),
    ]

    def end_file(self, ctx: FileContext) -> None:
        if not self._loads or not self._distributed:
            return
        for call, scope in self._loads:
            if scope in self._mapped_scopes:
                continue
            self.report(call, f"{code_span(short(ctx, call))} has no `map_location` in distributed code: every rank "
                              f"restores the tensors onto the GPU they were saved from (usually GPU 0); pass "
                              f"`map_location=\"cpu\"` or the rank's device")


# ---------------------------------------------------------------------------------------------
# TR613

def _device_choice(value: cst.BaseExpression, ctx: FileContext) -> bool:
    """``torch.device("cuda" if use_cuda else "cpu")`` / ``"cuda:0" if args.cuda else "cpu"``: CUDA or the CPU,
    chosen when the script runs (TR704's ``torch.cuda.is_available()`` selection is the other spelling)."""
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
                           for n in subtree(value.test))


def _with_map_location(call: cst.Call, device: str) -> cst.Call:
    args = list(call.args)
    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    no_space = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    args.append(cst.Arg(value=cst.Name(device), keyword=cst.Name("map_location"), equal=no_space))
    return call.with_changes(args=args)


class LoadWithoutMapLocationOnCpuFallback(_LoadsWithoutMapLocation):
    id = "TR613"
    source_hint = (re.compile(r"\bload\b"), re.compile(r"""["']cpu["']"""))
    slug = "load-without-map-location-cpu-fallback"
    # map_location moves every tensor (a CPU RNG state too); a fix straight into load_state_dict is marked safe
    fix_safety = "unsafe"
    category = Category.SECURITY
    severity = Severity.LOW
    summary = "torch.load of a checkpoint without map_location in a script that falls back to the CPU"
    what = """
        Flags `torch.load(...)` of a checkpoint without `map_location=` in a file that chooses its
        device when it runs (`device = torch.device("cuda" if torch.cuda.is_available() else "cpu")`,
        `"cuda" if args.cuda else "cpu"`) and is not distributed (TR611 covers that), unless
        another load in the same function passes one or the load sits under a test of CUDA
        (`if torch.cuda.is_available():`, `if use_cuda:`). The fix adds `map_location=<device>`
        when the selected device variable is in scope; it is marked safe when the loaded state
        goes straight into `load_state_dict`.
    """
    why = """
        `torch.load` puts every tensor back on the device it was saved from. A checkpoint written
        on a GPU machine then fails to load on the CPU-only machine the device selection
        explicitly supports ("Attempting to deserialize object on a CUDA device but
        torch.cuda.is_available() is False"), and on a machine with another GPU layout the
        tensors land on `cuda:0` whatever device was selected.
    """
    example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        model.load_state_dict(torch.load("checkpoint.pt"))
    """
    fix_example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        model.load_state_dict(torch.load("checkpoint.pt", map_location=device))
    """
    VALID = [
        """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.load_state_dict(torch.load("checkpoint.pt", map_location=device))
        """,
        # no CPU fallback: the script needs a GPU anyway
        """
        import torch
        device = torch.device("cuda")
        model.load_state_dict(torch.load("checkpoint.pt"))
        """,
        # distributed: TR611's case; a load under a CUDA test; a vocabulary, not a checkpoint
        """
        import torch
        import torch.distributed as dist
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dist.init_process_group("nccl")
        ckpt = torch.load(args.resume)
        """,
        """
        import torch as th
        dev = th.device("cuda:0" if th.cuda.is_available() else "cpu")
        if th.cuda.is_available():
            state = th.load("best_model.pth")
        else:
            state = th.load("best_model.pth", map_location="cpu")
        vocab = th.load("vocab.pt")
        """,
        # the same run saved it on this machine a few lines earlier: it loads back where it was saved
        """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        for epoch in range(10):
            train(model)
            torch.save(model.state_dict(), "best-model.pt")
        model.load_state_dict(torch.load("best-model.pt"))
        """,
        # the same, through file handles
        """
        import torch
        device = torch.device("cuda" if args.cuda else "cpu")
        for epoch in range(args.epochs):
            if val_loss < best:
                with open(args.save, "wb") as f:
                    torch.save(model, f)
        with open(args.save, "rb") as f:
            model = torch.load(f)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            model.load_state_dict(torch.load("checkpoint.pt"))
            """,
            line=5, message='`torch.load("checkpoint.pt")`',
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            model.load_state_dict(torch.load("checkpoint.pt", map_location=device))
            """,
        ),
        Invalid(
            """
            from torch import load
            import torch
            use_cuda = not args.no_cuda and torch.cuda.is_available()
            dev = torch.device("cuda" if use_cuda else "cpu")
            def restore(path):
                checkpoint = load(path)
                return checkpoint["model"], checkpoint["epoch"]
            """,
            line=7, message="`map_location=dev`",
        ),
        # the choice made with if/else; the load's result kept (not straight into load_state_dict): an unsafe fix
        Invalid(
            """
            import torch
            if torch.accelerator.is_available():
                device = torch.accelerator.current_accelerator()
            else:
                device = torch.device("cpu")
            netG = Generator().to(device)
            if opt.netG != "":
                state = torch.load(opt.netG)
                netG.load_state_dict(state)
            """,
            line=9, message="`if torch.accelerator.is_available(): ... device = torch.device(\"cpu\")`",
            fixed="""
            import torch
            if torch.accelerator.is_available():
                device = torch.accelerator.current_accelerator()
            else:
                device = torch.device("cpu")
            netG = Generator().to(device)
            if opt.netG != "":
                state = torch.load(opt.netG, map_location=device)
                netG.load_state_dict(state)
            """,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.selections: list[cst.Assign] = []
        self.devices: dict[int, str] = {}  # id(load) -> the selected device's name, when in scope there
        self.own: set[int] = set()  # loads of a file this program saved before

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        if len(node.targets) == 1 and (_device_choice(node.value, ctx) or self._cpu_branch(node, ctx)):
            self.selections.append(node)

    @staticmethod
    def _cpu_branch(node: cst.Assign, ctx: FileContext) -> bool:
        """``device = torch.device("cpu")`` in the ``else:`` of ``if torch.cuda.is_available(): device = ...``
        (or of a test of the accelerator, of ``args.cuda``): the CPU is the fallback of a choice made at run time."""
        value = node.value
        if type(value) is cst.Call and value.args and method_name(value) == "device" and \
                ctx.call_name(value) == "torch.device":
            value = value.args[0].value
        if string_value(value) != "cpu":
            return False
        block = ctx.parent(ctx.parent(node))
        branch = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        test = ctx.parent(branch) if isinstance(branch, (cst.Else, cst.If)) else None
        if isinstance(branch, cst.If):
            test, branch = branch, None  # ``if not torch.cuda.is_available(): device = "cpu"``
        if not isinstance(test, cst.If) or not any(CUDA_TEST.search(name) for name in iter_names(test.test)):
            return False
        target = dotted_name(node.targets[0].target)
        return branch is None or any(isinstance(n, cst.AssignTarget) and dotted_name(n.target) == target
                                     for n in subtree(test.body))

    def load_seen(self, node: cst.Call, ctx: FileContext) -> None:
        path = argument(node, 0, "f")
        if path is not None:
            from analyzers.program import CheckpointWrites

            writes = ctx.facts(CheckpointWrites)
            path = writes.opened_path(node, path)  # ``with open(args.save, "rb") as f: torch.load(f)``
            if writes.written_before_loaded(path, ctx.origin(path)):
                self.own.add(id(node))  # written by this run on this machine: it loads back where it was saved
                return
        for selection in reversed(self.selections):
            name = selection.targets[0].target
            if isinstance(name, cst.Name):
                binding = ctx.binding(name.value)
                if binding is not None and binding.node is selection:
                    self.devices[id(node)] = name.value
                    return

    def end_file(self, ctx: FileContext) -> None:
        if not self._loads or self._distributed or not self.selections:
            return
        selection_ids = {id(s) for s in self.selections}
        first = self.selections[0]
        chooser = next((a for a in ctx.ancestors(first) if isinstance(a, cst.If)), None) \
            if self._cpu_branch(first, ctx) else None
        selected = code_span(f"if {short(ctx, chooser.test, 40)}: ... {short(ctx, first, 40)}") if chooser is not None \
            else code_span(short(ctx, first.value, 50))
        for call, scope in self._loads:
            if scope in self._mapped_scopes or id(call) in self.own or runs_only_with_cuda(call, selection_ids, ctx):
                continue
            device = self.devices.get(id(call))
            replacement = _with_map_location(call, device) if device is not None else None
            into_model = isinstance(ctx.parent(call), cst.Arg) and isinstance(ctx.parent(ctx.parent(call)), cst.Call) \
                and method_name(ctx.parent(ctx.parent(call))) == "load_state_dict"
            mapped = f"`map_location={device}`" if device is not None else "`map_location=` the selected device"
            self.report(call, f"{code_span(short(ctx, call))} has no `map_location` although this file runs on the "
                              f"CPU when no GPU is there ({selected}): a checkpoint saved "
                              f"on a GPU fails to load on such a machine, and elsewhere its tensors land on the "
                              f"GPU they were saved from; pass {mapped}",
                        replacement=replacement, safe=into_model)


# ---------------------------------------------------------------------------------------------
# TR612

def _loaded_path(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> Optional[cst.Call]:
    """The ``torch.load(...)`` call a state dict comes from: direct, through a name, or a key of one."""
    if expr is None or depth > 3:
        return None
    if isinstance(expr, cst.Call):
        return expr if does(ctx.qualified_name(expr.func), Does.READS_TORCH_CHECKPOINT) else None
    if isinstance(expr, cst.Subscript):
        return _loaded_path(expr.value, ctx, depth + 1)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _loaded_path(ctx.assigned_value(expr), ctx, depth + 1)
    return None


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
        load = _loaded_path(argument(node, 0, "state_dict"), ctx)
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
