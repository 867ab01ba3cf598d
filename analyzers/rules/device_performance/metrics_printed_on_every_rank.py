"""TR727 metrics-printed-on-every-rank: training metrics printed/logged by every DDP rank (no rank-0 guard)."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, iter_names, method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.rules.base import Invalid
from analyzers.program.loops import loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.ranks import depends_on_rank, print_kept_to_one_process, rank_guarded
from analyzers.program.values import DDP_HINT as _DDP_HINT
from analyzers.rules.device_performance._distributed import CallsOnEveryRank as _CallsOnEveryRank


_METRIC_WORDS = re.compile(r"loss|acc(?!um)|top1|top5|metric|perplexity|ppl|bleu|psnr|iou|f1|auc|score", re.IGNORECASE)
_LOGGING_CALLS = {"logging.info", "logging.warning", "logging.debug"}


def _string_text(expr: cst.CSTNode) -> str:
    return " ".join(n.value for n in subtree(expr) if isinstance(n, (cst.SimpleString, cst.FormattedStringText)))


class MetricsPrintedOnEveryRank(_CallsOnEveryRank):
    id = "TR727"
    source_hint = (_DDP_HINT, re.compile(r"backward"), re.compile(r"print|logging|getLogger"))
    slug = "metrics-printed-on-every-rank"
    category = Category.DEVICE
    severity = Severity.LOW
    summary = "training metrics printed/logged by every DDP rank (no rank-0 guard)"
    what = """
        Flags `print(...)` / `logging.info(...)` / `logger.info(...)` of a metric (a loss,
        accuracy, score, or `.item()` value) inside the training loop of a file that trains a
        `DistributedDataParallel` model, when the call is not under a rank check (`if rank == 0`,
        `if is_main_process()`...), its function does not return early on other ranks, and the
        message does not name the rank. Stays quiet about a bare `print` where the program replaces
        the built-in `print` (`builtins.print = ...`), at the file's top level or in a function it
        calls, its own or one imported from the repository: launch helpers such as DeiT's
        `init_distributed_mode` do, to print on the main process only.
    """
    why = """
        Every process prints: N interleaved copies of each line, each showing its own shard's
        loss or accuracy, not the global value - the log is N times longer and its numbers
        disagree. Print on rank 0 (after reducing the metric if it should cover all ranks).
    """
    example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.4f}")
    """
    fix_example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:
                print(f"epoch {epoch} loss {loss.item():.4f}")
    """
    VALID = [
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(rank, model, loader):
            model = DDP(model, device_ids=[rank])
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                if rank == 0:
                    print(f"loss {loss.item()}")
                print(f"[GPU{rank}] batch done, loss {loss.item()}")
        """,
        # print is replaced by a main-process-only print, through a helper that calls the one replacing it
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel
        def quiet_other_processes(is_main):
            import builtins as _builtins
            original = _builtins.print
            def print(*args, **kwargs):
                if is_main:
                    original(*args, **kwargs)
            _builtins.print = print
        def start_processes(args):
            torch.distributed.init_process_group("nccl")
            quiet_other_processes(args.rank == 0)
        def main(args):
            start_processes(args)
            model = DistributedDataParallel(build())
            for x in loader:
                loss = model(x).mean()
                loss.backward()
                print("loss", loss.item())
        """,
        # not a metric
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        for epoch in range(10):
            for x in loader:
                model(x).sum().backward()
            print("epoch finished")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            def train(rank, world_size, loader):
                model = DDP(Net().to(rank), device_ids=[rank])
                for epoch in range(10):
                    for x, y in loader:
                        opt.zero_grad()
                        loss = loss_fn(model(x), y)
                        loss.backward()
                        opt.step()
                    print(f"epoch {epoch}: loss {loss.item():.4f}")
            """,
            line=12, message="every DDP rank",
        ),
        Invalid(
            """
            import logging
            import torch
            logger = logging.getLogger(__name__)
            class Trainer:
                def fit(self):
                    self.model = torch.nn.parallel.DistributedDataParallel(self.model)
                    for step, batch in enumerate(self.loader):
                        loss = self.model(batch).mean()
                        loss.backward()
                        self.optimizer.step()
                        if step % 100 == 0:
                            logger.info("step %d loss %.3f", step, loss.item())
            """,
            line=13,
        ),
        # a launch helper that does not touch print: every process still prints, whatever the helper is called
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel
            def init_distributed_mode(args):
                torch.distributed.init_process_group("nccl", rank=args.rank)
            def main(args):
                init_distributed_mode(args)
                model = DistributedDataParallel(build())
                for x in loader:
                    loss = model(x).mean()
                    loss.backward()
                    print("loss", loss.item())
            """,
            line=12, message="every DDP rank",
        ),
    ]

    def collects(self, node: cst.Call, ctx: FileContext) -> bool:
        if not (self._is_log_call(node, ctx) and self._shows_metric(node, ctx) and not rank_guarded(node, ctx)):
            return False
        return any(loop_trains(loop, ctx) for loop in loop_stack(ctx))

    @staticmethod
    def _is_log_call(node: cst.Call, ctx: FileContext) -> bool:
        func = node.func
        if isinstance(func, cst.Name):
            return func.value == "print" and ctx.binding("print") is None
        if ctx.qualified_name(func) in _LOGGING_CALLS:
            return True
        if isinstance(func, cst.Attribute) and func.attr.value == "info":
            origin = ctx.origin(func.value)
            return isinstance(origin, cst.Call) and ctx.call_name(origin) == "logging.getLogger"
        return False

    @staticmethod
    def _shows_metric(node: cst.Call, ctx: FileContext) -> bool:
        for arg in node.args:
            if depends_on_rank(arg.value, ctx) or re.search(r"rank|gpu|device", _string_text(arg.value), re.IGNORECASE):
                return False  # a per-rank message on purpose
        return any(_METRIC_WORDS.search(name) for arg in node.args for name in iter_names(arg.value)) or any(
            isinstance(n, cst.Call) and method_name(n) == "item" for arg in node.args for n in subtree(arg.value))

    def end_file(self, ctx: FileContext) -> None:
        silenced: Optional[bool] = None  # asked once, and only of a file with a bare print to report
        reported: set[int] = set()
        for call, fn in self.unguarded_calls(ctx):
            if id(fn) in reported:
                continue
            if isinstance(call.func, cst.Name):
                if silenced is None:
                    silenced = print_kept_to_one_process(ctx)
                if silenced:
                    continue
            reported.add(id(fn))  # one per function: the fix is the same guard
            self.report(call, f"{code_span(node_text(ctx, call))} runs on every DDP rank: N interleaved copies of the "
                              f"line, each with its own shard's value; print on rank 0 (`if dist.get_rank() == 0:`), "
                              f"after reducing the metric if it should cover every rank")
