"""TR115 synchronize-every-step: torch.cuda.synchronize() / an all_reduce of the loss every training step only to time
or log it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    call_receiver,
    dotted_name,
    method_name,
    short)
from analyzers.markdown import code_span
from analyzers.program.devices import overlaps_work_asynchronously
from analyzers.program.flow import subtree
from analyzers.program.loops import loop_stack
from analyzers.program.values import (BACKWARD_METHODS)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import in_lightning_module
from analyzers.program.loops import guard_between as _guard_between
from analyzers.program.library import LOG_SINKS as _LOG_SINKS, SYNC_METHODS as _SYNC_METHODS


_TIMERS = {"time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.time_ns",
           "time.perf_counter_ns", "timeit.default_timer"}
_COLLECTIVE_NAMES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "all_reduce_coalesced")
_COLLECTIVES = {f"torch.distributed.{name}" for name in _COLLECTIVE_NAMES}
# Where a reduced value may go when it is only reported: a logger, a progress bar, a meter, a list.
_REPORTING = _LOG_SINKS | {"update", "add_scalar", "item"}


@dataclass
class _SyncCandidate:
    node: cst.Call
    loop: cst.CSTNode
    kind: str  # "synchronize" | "collective" | "helper"
    reduced: Optional[str]  # the name that holds the reduced value (collectives)
    helper: Optional[str]  # the same-file function called (helpers)


class PerStepSynchronizeForLogging(Rule):
    id = "TR115"
    slug = "synchronize-every-step"
    category = Category.TRAINING
    severity = Severity.LOW
    speed_only = True
    requires = "torch"
    summary = "torch.cuda.synchronize() / an all_reduce of the loss every training step only to time or log it"
    source_hint = re.compile(r"synchronize\s*\(|all_reduce|all_gather|\breduce\s*\(")
    what = """
        Flags, in a training loop (a loop that calls `.backward()`) and not behind an
        `if step % N == 0:`-style guard:
        - `torch.cuda.synchronize()` followed in the same iteration by a timer read
          (`time.time()`, `time.perf_counter()`...) or a logging call, when nothing else in the
          step reads a value on the host (a step that calls `loss.item()` already waits for the
          GPU, so one more wait costs nothing; TR105 covers that read);
        - `dist.all_reduce` / `all_gather` (or a helper of the same file that calls one) of the
          loss, when the reduced value is only logged, put in a meter, or appended.
        Files that use CUDA streams or events are left alone: there a synchronize may order work.
    """
    why = """
        `torch.cuda.synchronize()` blocks the CPU until every queued kernel has finished, so the
        next step cannot be queued while this one runs; a collective on every step adds a
        round trip across all ranks (and, with `.item()`, a host read). Doing either on every
        iteration only for a log line or a step timer costs throughput for small and medium
        models. Synchronize and reduce on the steps you log, or accumulate on the device and
        reduce once per logging interval.
    """
    example = """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            step_times.append(time.time() - start)
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            meter.update(reduced.item() / world_size)
    """
    fix_example = """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % log_every == 0:
                torch.cuda.synchronize()
                step_times.append(time.time() - start)
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                meter.update(reduced.item() / world_size)
    """
    VALID = [
        # the step already waits for the GPU (loss.item() for a NaN check): the synchronize adds nothing
        """
        import math, time
        import torch
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            if not math.isfinite(loss.item()):
                raise SystemExit(1)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            print(f"step took {time.time() - start:.3f}s")
        """,
        # behind a logging-interval guard or an opt-in flag
        """
        import time
        import torch
        import torch.distributed as dist
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if args.synchronize_step:
                torch.cuda.synchronize()
            t = time.time()
            if step % 50 == 0:
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                print(reduced.item())
        """,
        # gradients reduced by hand (that is training, not logging); a reduced loss that drives early stopping
        """
        import torch
        import torch.distributed as dist
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            optimizer.step()
            total_loss = loss.detach().clone()
            dist.all_reduce(total_loss)
            if total_loss < best:
                break
        """,
        # CUDA streams: the synchronize may order work
        """
        import time
        import torch
        copy_stream = torch.cuda.Stream()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            torch.cuda.synchronize()
            print(time.time())
        """,
        # a throughput benchmark: each pass runs forward and backward once to be timed, nothing is trained
        """
        import time
        import torch
        for width in (256, 512, 1024):
            net = make_mlp(width).cuda()
            batch = torch.randn(64, width, device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            net(batch).sum().backward()
            torch.cuda.synchronize()
            timings[width] = time.perf_counter() - t0
        """,
        # not a training loop
        """
        import time
        import torch
        with torch.no_grad():
            for x in loader:
                model(x)
                torch.cuda.synchronize()
                print(time.time())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import time
            import torch
            for i, (images, target) in enumerate(train_loader):
                output = model(images.cuda(non_blocking=True))
                loss = criterion(output, target.cuda(non_blocking=True))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                batch_time.update(time.time() - end)
                end = time.time()
            """,
            line=10, message="`torch.cuda.synchronize()` every training step",
        ),
        # streams named only in a comment and a log message: nothing here overlaps work
        Invalid(
            """
            import time
            import torch
            # no torch.cuda.Stream() or record_stream here: one stream does everything
            for i, (images, target) in enumerate(train_loader):
                loss = criterion(model(images.cuda()), target.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                log("Event(step) took", time.time() - end)
                end = time.time()
            """,
            line=10, message="`torch.cuda.synchronize()` every training step",
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            def reduce_tensor(tensor, world_size):
                rt = tensor.clone()
                dist.all_reduce(rt, op=dist.ReduceOp.SUM)
                return rt / world_size
            def train_one_epoch(model, loader, optimizer, world_size):
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    reduced_loss = reduce_tensor(loss.data, world_size)
                    losses.update(reduced_loss.item(), x.size(0))
            """,
            line=13, message="`reduce_tensor(loss.data, world_size)`",
        ),
        Invalid(
            """
            import torch.distributed as dist
            while step < max_steps:
                loss = model(next(it)).mean()
                loss.backward()
                opt.step()
                log_loss = loss.detach()
                dist.all_reduce(log_loss)
                wandb.log({"loss": log_loss.item() / dist.get_world_size()})
                step += 1
            """,
            line=8, message="all-reduces `log_loss`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.candidates: list[_SyncCandidate] = []
        self.backward_loops: set[int] = set()
        self.host_reads: dict[int, int] = {}  # id(loop) -> unguarded ``.item()`` / ``.cpu()``... in it
        self.helpers: set[str] = set()  # functions of this file that run a collective
        self.step_loops: set[int] = set()  # loops that step an optimizer (``opt.step()``, ``scaler.step(opt)``)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else None
        # only these names can be a synchronize or a collective: the others skip the name resolution
        qualified = ctx.call_name(node) if last in _COLLECTIVE_NAMES or last == "synchronize" else None
        if qualified in _COLLECTIVES and isinstance(ctx.function, cst.FunctionDef):
            self.helpers.add(ctx.function.name.value)
        if not ctx.loops:
            return
        name = method_name(node)
        if name == "step" and isinstance(func, cst.Attribute):
            self.step_loops.update(id(loop) for loop in loop_stack(ctx))
            return
        if qualified is None and name not in BACKWARD_METHODS and name not in _SYNC_METHODS and \
                not (isinstance(func, cst.Name) and node.args):
            return  # nothing this rule looks at: skip the loop bookkeeping
        stack = loop_stack(ctx)
        if not stack:
            return
        loop = stack[-1]
        if name in BACKWARD_METHODS:
            self.backward_loops.add(id(loop))
            return
        if name in _SYNC_METHODS and not node.args and call_receiver(node) is not None and \
                not _guard_between(node, loop, ctx):
            self.host_reads[id(loop)] = self.host_reads.get(id(loop), 0) + 1
            return
        if qualified == "torch.cuda.synchronize":
            kind, reduced, helper = "synchronize", None, None
        elif qualified in _COLLECTIVES:
            kind, reduced, helper = "collective", self._loss_name(node), None
            if reduced is None:
                return
        elif isinstance(node.func, cst.Name) and node.args and self._loss_name(node) is not None:
            target = self._assigned_to(node, ctx)
            if target is None:
                return
            kind, reduced, helper = "helper", target, node.func.value
        else:
            return
        if _guard_between(node, loop, ctx) or in_lightning_module(ctx):
            return
        self.candidates.append(_SyncCandidate(node, loop, kind, reduced, helper))

    @staticmethod
    def _loss_name(call: cst.Call) -> Optional[str]:
        """The loss in ``all_reduce(loss_copy)`` / ``helper(loss.data)``: a name (or attribute) mentioning loss."""
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if first is None:
            return None
        expr = first
        while True:
            if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args and \
                    expr.func.attr.value in ("detach", "clone", "float", "mean"):
                expr = expr.func.value
            elif isinstance(expr, cst.Attribute) and expr.attr.value == "data":
                expr = expr.value
            else:
                break
        name = dotted_name(expr)
        if name is None or "loss" not in name.rsplit(".", 1)[-1].lower():
            return None
        return dotted_name(first) or name

    @staticmethod
    def _assigned_to(call: cst.Call, ctx: FileContext) -> Optional[str]:
        parent = ctx.parent(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return dotted_name(parent.targets[0].target)
        return None

    def end_file(self, ctx: FileContext) -> None:
        if not self.candidates or overlaps_work_asynchronously(ctx):
            return  # streams and events: the synchronize may be needed for correctness
        for candidate in self.candidates:
            loop = candidate.loop
            if id(loop) not in self.backward_loops:
                continue
            if candidate.kind == "synchronize":
                if self.host_reads.get(id(loop)) or not self._then_timed_or_logged(candidate.node, ctx):
                    continue
                if id(loop) not in self.step_loops:
                    continue  # a backward with no optimizer step: a benchmark timing each pass, not training
                self.report(candidate.node, (
                    "`torch.cuda.synchronize()` every training step, only to time or log it: the CPU waits for the "
                    "GPU to finish each step before it can queue the next one; synchronize only on the steps you log "
                    "(inside `if step % log_every == 0:`)"))
            elif candidate.kind == "helper" and candidate.helper not in self.helpers:
                continue
            elif candidate.reduced is not None and self._only_reported(candidate, ctx):
                shown = code_span(short(ctx, candidate.node))
                what = f"all-reduces `{candidate.reduced}`" if candidate.kind == "collective" else \
                    f"runs a collective (in `{candidate.helper}`) for `{candidate.reduced}`"
                self.report(candidate.node, (
                    f"{shown} {what} on every training step although the result is only logged: each call is a "
                    f"round trip across all ranks (and its `.item()` a wait for the GPU); reduce on the steps you "
                    f"log, or accumulate the loss on the device and reduce once per logging interval"))

    @staticmethod
    def _then_timed_or_logged(node: cst.Call, ctx: FileContext) -> bool:
        """A later statement of the same block reads a timer or logs."""
        statement = ctx.statement_of(node)
        line = ctx.parent(statement)
        block = ctx.parent(line) if isinstance(line, cst.SimpleStatementLine) else None
        body = getattr(block, "body", None)
        if not isinstance(body, (list, tuple)) or line not in body:
            return False
        for later in body[body.index(line) + 1:]:
            for inner in subtree(later):
                if isinstance(inner, cst.Call) and (ctx.call_name(inner) in _TIMERS or
                                                    method_name(inner) in _LOG_SINKS):
                    return True
        return False

    @staticmethod
    def _only_reported(candidate: _SyncCandidate, ctx: FileContext) -> bool:
        """Every later read of the reduced value in the loop goes to a logger / meter / list, and one does."""
        reduced = candidate.reduced
        statement = ctx.statement_of(candidate.node)
        after = False
        reported = False
        for node in subtree(candidate.loop):
            if node is statement:
                after = True
                continue
            if not after or not isinstance(node, (cst.Name, cst.Attribute)) or dotted_name(node) != reduced:
                continue
            for ancestor in ctx.ancestors(node):
                if isinstance(ancestor, (cst.If, cst.While, cst.Comparison, cst.Return, cst.IfExp)):
                    return False  # control flow: the value is needed on every step
                if isinstance(ancestor, cst.Call) and method_name(ancestor) in _REPORTING and \
                        ancestor is not candidate.node:
                    if method_name(ancestor) != "item":
                        reported = True
                        break
                if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                    break
        return reported
