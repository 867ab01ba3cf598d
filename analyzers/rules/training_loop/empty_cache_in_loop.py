"""TR106 empty-cache-in-loop: torch.cuda.empty_cache() called on every loop iteration."""
from __future__ import annotations

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    method_name)
from analyzers.program.flow import subtree
from analyzers.program.loops import loop_stack, one_pass_is_a_batch
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.loops import guard_between as _guard_between


_OOM_ERRORS = {"RuntimeError", "OutOfMemoryError", "MemoryError"}


def _recovers_from_oom(loop: cst.CSTNode) -> bool:
    """The loop catches out-of-memory errors: it retries with less (a smaller batch) after emptying the cache."""
    for node in subtree(loop):
        if isinstance(node, cst.ExceptHandler) and node.type is not None:
            names = {dotted_name(e.value if isinstance(e, cst.Element) else e).rsplit(".", 1)[-1]
                     for e in (node.type.elements if isinstance(node.type, cst.Tuple) else [node.type])
                     if dotted_name(e.value if isinstance(e, cst.Element) else e)}
            if names & _OOM_ERRORS:
                return True
    return False


class EmptyCacheInLoop(Rule):
    id = "TR106"
    slug = "empty-cache-in-loop"
    category = Category.TRAINING
    severity = Severity.LOW
    speed_only = True
    requires = "torch"
    summary = "torch.cuda.empty_cache() called on every loop iteration"
    what = """
        Flags `torch.cuda.empty_cache()` in the body of a loop whose every pass is one batch (it calls
        `backward()`, steps an optimizer, takes `next()` of an iterator, or iterates a `DataLoader`),
        unless it runs only in an `except` handler (out-of-memory recovery) or behind an `if`. Once
        per epoch or per run (the batches are handled inside the functions the loop calls) costs
        nothing that matters and is not flagged.
    """
    why = """
        `empty_cache` returns the caching allocator's free blocks to the driver. It does not free
        memory that tensors still use, and the next iteration must get the memory back with
        slow `cudaMalloc` calls and a device synchronization. Calling it every step slows
        training and hides the real cause of memory growth (usually a kept reference).
    """
    example = """
        for x, y in loader:
            train_step(x, y)
            torch.cuda.empty_cache()
    """
    fix_example = """
        for x, y in loader:
            train_step(x, y)
        torch.cuda.empty_cache()  # once, if memory must be handed back at all
    """
    VALID = [
        # an out-of-memory back-off loop
        """
        import torch
        batch_size = 256
        while batch_size > 1:
            try:
                run(batch_size)
                break
            except RuntimeError:
                torch.cuda.empty_cache()
                batch_size //= 2
        """,
        # a profiler taking clean per-op memory readings
        """
        import torch
        def profile(ops, x):
            for op in ops:
                torch.cuda.empty_cache()
                op(x)
        """,
        """
        import torch
        for x, y in loader:
            train_step(x, y)
        torch.cuda.empty_cache()
        """,
        # OOM recovery
        """
        import torch
        for batch in loader:
            try:
                train_step(batch)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        """,
        # occasional
        """
        import torch
        for step, batch in enumerate(loader):
            train_step(batch)
            if step % 1000 == 0:
                torch.cuda.empty_cache()
        """,
        # once per epoch: the batches are handled by the loop nested in it, or by the function it calls
        """
        import torch as th
        for epoch in range(10):
            for batch in loader:
                step(batch)
            th.cuda.empty_cache()
        """,
        """
        import torch
        for epoch in range(epochs):
            loss = train(epoch)
            torch.cuda.empty_cache()
            evaluate()
        """,
        # something else's empty_cache
        """
        import torch
        for item in items:
            cache.empty_cache()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True)
            for x, y in loader:
                train_step(x, y)
                torch.cuda.empty_cache()
            """,
            line=6, message="torch.cuda.empty_cache()",
        ),
        Invalid(
            """
            from torch.cuda import empty_cache
            def run(loader):
                while True:
                    batch = next(loader)
                    step(batch)
                    empty_cache()
            """,
            line=7,
        ),
        Invalid(
            """
            import torch as th
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=32)
            for epoch in range(10):
                for step, (x, y) in enumerate(loader):
                    train_step(x, y)
                    th.cuda.empty_cache()
            """,
            line=8,
        ),
        Invalid(
            """
            import torch
            def fit(model, opt, batches):
                for x, y in batches:
                    model(x).mean().backward()
                    opt.step()
                    torch.cuda.empty_cache()
            """,
            line=7,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if method_name(node) != "empty_cache" or not ctx.loops:
            return
        if ctx.call_name(node) not in ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"):
            return
        stack = loop_stack(ctx)
        if not stack or _guard_between(node, stack[-1], ctx, except_handlers=True):
            return
        if len(stack) > 1 and _guard_between(stack[-1], stack[0], ctx, except_handlers=True):
            return
        if not one_pass_is_a_batch(stack[-1], ctx):
            return  # once per epoch or per run (the batches are handled inside what the loop calls), or unknown
        if _recovers_from_oom(stack[0]) or any(word in (fn.name.value.lower() if isinstance(fn, cst.FunctionDef)
                                                        else "") for fn in ctx.functions
                                               for word in ("profile", "benchmark", "measure")):
            return  # an out-of-memory back-off loop, or a profiler taking clean per-step memory readings
        self.report(node, ("torch.cuda.empty_cache() runs on every loop iteration: it frees no memory that tensors "
                           "still hold and forces slow re-allocation and a sync next iteration; call it once after "
                           "the loop, or find the reference that keeps memory alive"))
