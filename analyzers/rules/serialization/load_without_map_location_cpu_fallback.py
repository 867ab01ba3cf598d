"""TR613 load-without-map-location-cpu-fallback: torch.load of a checkpoint without map_location in a script that falls
back to the CPU.
"""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, iter_names, method_name,
                               short, string_value)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.devices import CUDA_TEST, chooses_cuda_or_cpu, runs_only_with_cuda
from analyzers.rules.base import Invalid
from analyzers.program.flow import subtree
from analyzers.rules.serialization._checkpoints import LoadsWithoutMapLocation as _LoadsWithoutMapLocation


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
        if len(node.targets) == 1 and (chooses_cuda_or_cpu(node.value, ctx) or self._cpu_branch(node, ctx)):
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
