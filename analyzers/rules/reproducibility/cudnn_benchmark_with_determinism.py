"""TR902 cudnn-benchmark-with-determinism: cudnn.benchmark = True in a file that asks for deterministic/reproducible
runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import re
import libcst as cst

from analyzers.context import FileContext, argument, is_false, is_true, method_name, short
from analyzers.model import Category, Severity
from analyzers.program.flow import enclosing_block, exclusive_branches
from analyzers.rules.base import Invalid, Rule


@dataclass
class _Flag:
    node: cst.CSTNode
    text: str
    block: Optional[cst.CSTNode]
    seed: bool = False


_BENCHMARK = "torch.backends.cudnn.benchmark"
_DETERMINISTIC = "torch.backends.cudnn.deterministic"


class CudnnBenchmarkWithDeterminism(Rule):
    id = "TR902"
    source_hint = (re.compile(r"benchmark"), re.compile(r"determinis"))  # cudnn.benchmark with a determinism request
    slug = "cudnn-benchmark-with-determinism"
    category = Category.REPRODUCIBILITY
    severity = Severity.LOW
    summary = "cudnn.benchmark = True in a file that asks for deterministic/reproducible runs"
    what = """
        Flags `torch.backends.cudnn.benchmark = True` (under any import alias) in a file that also
        asks for determinism explicitly: `torch.backends.cudnn.deterministic = True` or
        `torch.use_deterministic_algorithms(True)`. Requests in the other branch of an `if`/`else`
        and requests next to `cudnn.benchmark = False` are fine, and so is seeding alone: a seed
        with `benchmark = True` is the usual way to get reproducible initialization and data order
        at full speed, not a request for bitwise-identical runs.
    """
    why = """
        With `benchmark = True` cuDNN times several convolution algorithms on the first batches
        and keeps the fastest, which can differ from run to run and includes non-deterministic
        ones. The seed or the determinism flag then does not give reproducible results, and the
        two settings contradict each other.
    """
    example = """
        torch.manual_seed(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = True
    """
    fix_example = """
        torch.manual_seed(0)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        # or, when speed matters more than bitwise reproducibility, drop the determinism request
    """
    VALID = [
        "import torch\nimport lightning as L\nL.seed_everything(7)\ntorch.backends.cudnn.benchmark = True\n",
        # seed + benchmark: reproducible initialization and data order, not bitwise determinism
        "import torch\ntorch.manual_seed(42)\ntorch.backends.cudnn.benchmark = True\n",
        "import torch\ntorch.backends.cudnn.benchmark = True\n",
        "import torch\ntorch.manual_seed(0)\ntorch.backends.cudnn.deterministic = True\n"
        "torch.backends.cudnn.benchmark = False\n",
        # either/or on a flag
        """
        import torch
        from torch.backends import cudnn
        if args.deterministic:
            cudnn.deterministic = True
        else:
            cudnn.benchmark = True
        """,
        # the seed helper switches benchmark off itself
        """
        import torch
        def set_seed(s):
            torch.manual_seed(s)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        """,
    ]
    INVALID = [
        Invalid("import torch\ntorch.manual_seed(42)\ntorch.backends.cudnn.deterministic = True\n"
                "torch.backends.cudnn.benchmark = True\n", line=4, message="deterministic = True"),
        Invalid("import torch\nfrom torch.backends import cudnn\ncudnn.benchmark = True\n"
                "cudnn.deterministic = True\n", line=3, message="cudnn.deterministic = True"),
        Invalid("import torch\nimport torch.backends.cudnn as cudnn\n"
                "def setup():\n    torch.use_deterministic_algorithms(True)\n    cudnn.benchmark = True\n",
                line=5, message="use_deterministic_algorithms"),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.benchmarks: list[_Flag] = []
        self.requests: list[_Flag] = []
        self.off_blocks: set[int] = set()  # blocks with ``cudnn.benchmark = False``

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        value = node.value
        if not (is_true(value) or is_false(value)):
            return
        for target in node.targets:
            expr = target.target
            if not isinstance(expr, cst.Attribute) or expr.attr.value not in ("benchmark", "deterministic"):
                continue
            qualified = ctx.qualified_name(expr)
            if qualified == _BENCHMARK:
                if is_true(value):
                    self.benchmarks.append(_Flag(node, short(ctx, expr) + " = True", enclosing_block(ctx, node)))
                else:
                    block = enclosing_block(ctx, node)
                    if block is not None:
                        self.off_blocks.add(id(block))
            elif qualified == _DETERMINISTIC and is_true(value):
                self.requests.append(_Flag(node, short(ctx, node), enclosing_block(ctx, node)))

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None:
            return
        if name == "use_deterministic_algorithms":
            if ctx.call_name(node) == "torch.use_deterministic_algorithms" and is_true(argument(node, 0, "mode")):
                self.requests.append(_Flag(node, short(ctx, node), enclosing_block(ctx, node)))

    def end_file(self, ctx: FileContext) -> None:
        # A seed alone is not a request for bitwise determinism: seed + benchmark is the standard idiom for
        # reproducible initialization and data order at full speed. Only an explicit request contradicts it.
        if not self.benchmarks or not self.requests:
            return
        requests = sorted(self.requests, key=lambda r: r.seed)  # name an explicit determinism request first
        for bench in self.benchmarks:
            for request in requests:
                if request.block is not None and id(request.block) in self.off_blocks \
                        and request.block is not bench.block:
                    continue  # benchmark switched off right where determinism is requested
                if request.seed and self.off_blocks:
                    continue  # a seed alone is a weak request, and the file switches benchmark off somewhere
                if exclusive_branches(ctx, bench.node, request.node):
                    continue
                self.report(bench.node, f"{bench.text} lets cuDNN pick non-deterministic, run-dependent algorithms, "
                                        f"contradicting {request.text}: runs will not be reproducible; set "
                                        f"benchmark = False when you need determinism")
                break
