"""TR704 hard-coded-cuda: hard-coded .cuda() / "cuda" in a file that selects its device with a CPU fallback."""
from __future__ import annotations

import re
import libcst as cst

from analyzers.context import (FileContext, call_receiver, keyword_arg,
                               method_name, string_value)
from analyzers.program.devices import runs_only_with_cuda, selects_with_cpu_fallback
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


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
