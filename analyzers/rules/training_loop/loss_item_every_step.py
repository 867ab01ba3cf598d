"""TR105 loss-item-every-step: loss.item()/print(loss) every training step only for logging forces a GPU sync."""
from __future__ import annotations


import libcst as cst

from analyzers.context import (
    FileContext,
    call_receiver,
    dotted_name,
    method_name)
from analyzers.markdown import code_span, named
from analyzers.program.devices import file_handles_devices, keeps_gpu_busy
from analyzers.program.loops import loop_stack
from analyzers.program.names import last_segment
from analyzers.program.values import (BACKWARD_METHODS)
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import in_lightning_module
from analyzers.program.graphs import graph_kind_read
from analyzers.program.loops import guard_between as _guard_between
from analyzers.program.flow import logging_call_consuming
from analyzers.program.library import SYNC_METHODS as _SYNC_METHODS, is_logging_call




class PerStepSyncForLogging(Rule):
    id = "TR105"
    slug = "loss-item-every-step"
    category = Category.TRAINING
    severity = Severity.LOW
    speed_only = True
    requires = "torch"
    summary = "loss.item()/print(loss) every training step only for logging forces a GPU sync"
    what = """
        Flags `loss.item()`, `loss.cpu()`, `loss.numpy()` or printing the loss tensor in every
        iteration of a training loop (a loop that calls `.backward()`), when the value only goes
        to `print`, a logger, `tqdm.set_postfix`, `wandb.log`, `writer.add_scalar` or a list, and
        the call is not behind an `if step % N == 0:`-style guard, in a program built to keep the GPU
        busy (it compiles its model with `torch.compile` or captures CUDA graphs). In a plain eager
        loop the step's own kernel launches and data loading dwarf one host read for a log, and the
        finding is not worth a comment.
    """
    why = """
        Reading a CUDA tensor on the host waits for every queued kernel to finish, so the CPU
        cannot run ahead and queue the next step. Doing it every iteration can cost a noticeable
        share of throughput for small and medium models. Logging every N steps, or accumulating
        on the device and reading once, avoids the stall.
    """
    example = """
        model = torch.compile(model)
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: {loss.item():.4f}")
    """
    fix_example = """
        model = torch.compile(model)
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % log_every == 0:
                print(f"step {step}: {loss.item():.4f}")
    """
    VALID = [
        # the step already reads a value on the host every iteration: one more read changes nothing
        """
        import torch
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
            print(loss.item())
        """,
        # a plain eager loop on a GPU: nothing compiled or captured, one host read for a log is not worth a comment
        """
        import torch
        device = torch.device("cuda")
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            print(f"step {step}: {loss.item():.4f}")
        """,
        # nothing in the file uses a GPU
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(loss.item())
        """,
        # only its comments and strings speak of devices: the code places nothing on one
        """
        import torch
        # on a cuda device this would wait for the GPU every step
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print("device: cpu, loss", loss.item())
        """,
        # behind a logging-interval guard
        """
        import torch
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(loss.item())
                wandb.log({"loss": loss.item()})
        """,
        # feeds control flow
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            if loss.item() < best:
                best = loss.item()
            total += loss.item()
        """,
        # per-epoch logging after the batch loop
        """
        import torch
        for epoch in range(10):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
            print(f"epoch {epoch} loss {loss.item():.3f}")
        """,
        # not a training loop
        """
        import torch
        with torch.no_grad():
            for x, y in loader:
                loss = criterion(model(x), y)
                print(loss.item())
        """,
        # printing a float
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            loss_value = loss.item()
            print(loss_value)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            model = torch.compile(model)
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(f"step {step}: {loss.item():.4f}")
            """,
            line=9, message="loss.item()",
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            model = torch.compile(model)
            from tqdm import tqdm
            pbar = tqdm(loader)
            for x, y in pbar:
                loss = criterion(model(x), y)
                loss.backward()
                pbar.set_postfix(loss=loss.item())
                writer.add_scalar("loss", loss.detach().cpu().numpy(), step)
            """,
            line=10, message="set_postfix", count=2,
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            model = torch.compile(model)
            for batch in loader:
                loss = criterion(model(batch.x), batch.y)
                loss.backward()
                print("loss", loss)
            """,
            line=8, message="print",
        ),
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            model = torch.compile(model)
            def train(model, loader):
                history = []
                for x, y in loader:
                    loss = model(x, y).mean()
                    scaler.scale(loss).backward()
                    history.append(loss.item())
                    if is_main_process:
                        logger.info("loss %.4f", loss.item())
            """,
            line=10, message="history", count=2,
        ),
        # a compiled step function: the decorator marks the program as built for throughput
        Invalid(
            """
            import torch

            @torch.compile
            def compute_loss(x, y):
                return criterion(model(x), y)

            for x, y in loader:
                loss = compute_loss(x.cuda(), y.cuda())
                loss.backward()
                optimizer.step()
                progress.set_postfix(loss=loss.item())
            """,
            line=12, message="set_postfix",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.events: list[tuple[cst.CSTNode, int, int, str]] = []  # node, id(loop), id(sink call), message
        self.backward_loops: set = set()
        # every unguarded host read in each loop (``acc.item()`` too): one more changes nothing when
        # the step already waits for the GPU elsewhere
        self.syncs: dict[int, set[int]] = {}

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None or not ctx.loops:
            return
        if name in BACKWARD_METHODS:
            stack = loop_stack(ctx)
            if stack:
                self.backward_loops.add(id(stack[-1]))
            return
        if name in _SYNC_METHODS:
            stack = loop_stack(ctx)
            parent = ctx.parent(node)
            chained = isinstance(parent, cst.Attribute) and parent.attr.value in _SYNC_METHODS  # x.cpu().numpy()
            if stack and call_receiver(node) is not None and not node.args and not chained and \
                    not _guard_between(node, stack[-1], ctx):
                self.syncs.setdefault(id(stack[-1]), set()).add(id(node))
            if not in_lightning_module(ctx):
                self._sync_call(node, name, ctx)
        elif name != "append" and is_logging_call(name, ctx.qualified_name(node.func)) and not in_lightning_module(ctx):
            self._printed_tensor(node, name, ctx)

    def _sync_call(self, node: cst.Call, name: str, ctx: FileContext) -> None:
        receiver = call_receiver(node)
        if receiver is None or node.args:
            return
        parent = ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr.value in _SYNC_METHODS:
            return  # the outer call of ``loss.detach().cpu().numpy()`` reports
        root = receiver
        while isinstance(root, cst.Call) and call_receiver(root) is not None and \
                method_name(root) in ("detach", "cpu", "float", "double", "mean", "sum", "clone"):
            root = call_receiver(root)
        if isinstance(root, cst.Attribute) and root.attr.value == "data":
            root = root.value
        root_name = dotted_name(root)
        if root_name is None or "loss" not in last_segment(root_name).lower():
            return
        stack = loop_stack(ctx)
        if not stack:
            return
        found = logging_call_consuming(node, ctx)
        if found is None or _guard_between(node, stack[-1], ctx):
            return
        sink, sink_node = found
        shown = f"{root_name}.{name}()"
        self.events.append((node, id(stack[-1]), id(sink_node), (
            f"{shown} runs every training step only to be logged via {sink}(): each call blocks until the GPU "
            f"catches up; log every N steps (e.g. `if step % log_every == 0:`) or accumulate on the device")))

    def _printed_tensor(self, node: cst.Call, name: str, ctx: FileContext) -> None:
        for arg in node.args:
            value = arg.value
            exprs = [value]
            if isinstance(value, cst.FormattedString):
                exprs = [part.expression for part in value.parts if isinstance(part, cst.FormattedStringExpression)]
            for expr in exprs:
                if not isinstance(expr, (cst.Name, cst.Attribute)):
                    continue
                shown = dotted_name(expr)
                if shown is None or "loss" not in last_segment(shown).lower() or graph_kind_read(expr, ctx) is None:
                    continue
                stack = loop_stack(ctx)
                if not stack or _guard_between(node, stack[-1], ctx):
                    return
                self.events.append((expr, id(stack[-1]), id(node), (
                    f"`{name}()` of the {named('tensor', shown)} every training step converts it on the host and "
                    f"forces a GPU sync each iteration; log every N steps, and log {code_span(shown + '.item()')} "
                    f"rather than the tensor")))
                return

    def end_file(self, ctx: FileContext) -> None:
        if not self.events or not file_handles_devices(ctx):
            return  # nothing here runs on a GPU: reading a CPU tensor waits for nothing
        if not keeps_gpu_busy(ctx):
            return  # a plain eager step: its own launches and data loading dwarf one host read for a log
        flagged = {id(node) for node, _, _, _ in self.events}
        reported: set = set()
        for node, loop, sink, message in self.events:
            if self.syncs.get(loop, set()) - flagged:
                continue  # the step already syncs elsewhere (``acc.item()``, ``epoch_loss += loss.item()``)
            if loop in self.backward_loops and sink not in reported:
                reported.add(sink)  # one finding per logging call, however many values it reads
                self.report(node, message)
