"""TR815 iterator-next-method: iter(loader).next() is Python 2; it raises AttributeError on current PyTorch."""
from __future__ import annotations


import libcst as cst

from analyzers.context import (FileContext, short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import item_values
from analyzers.program.values import makes_iterator
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule


class IteratorNextMethod(Rule):
    id = "TR815"
    syntactic = True
    slug = "iterator-next-method"
    pinned_package = "torch"
    category = Category.DEPRECATION
    severity = Severity.HIGH
    summary = "iter(loader).next() is Python 2; it raises AttributeError on current PyTorch"
    what = """
        Flags `.next()` called on an iterator made by `iter(...)`: `dataiter = iter(loader)`
        followed by `dataiter.next()`, or `iter(loader).next()`.
    """
    why = """
        Python 3 iterators have `__next__`, not `next`. DataLoader iterators kept a `next` alias
        for Python 2 until PyTorch removed it, so this line now raises
        `AttributeError: '_SingleProcessDataLoaderIter' object has no attribute 'next'`
        (and on any other iterator it always did).
    """
    example = """
        dataiter = iter(trainloader)
        images, labels = dataiter.next()
    """
    fix_example = """
        dataiter = iter(trainloader)
        images, labels = next(dataiter)
    """
    VALID = [
        """
        import torch
        dataiter = iter(trainloader)
        images, labels = next(dataiter)
        """,
        # an object with its own next() method
        """
        import torch
        sampler = Sampler(data)
        batch = sampler.next()
        """,
        # a list that also holds something else than iterators
        """
        import torch
        feeds = [iter(loader_a)]
        feeds.append(Stream())
        for feed in feeds:
            batch = feed.next()
        """,
    ]
    INVALID = [
        # an item of a list every value put into which is an iterator
        Invalid(
            """
            import torch
            class Mixed:
                def __init__(self, loaders):
                    self.loaders = loaders
                    self.iters = []
                    for loader in loaders:
                        self.iters.append(iter(loader))
                def batch(self):
                    for i, it in enumerate(self.iters):
                        try:
                            x = it.next()
                        except StopIteration:
                            self.iters[i] = iter(self.loaders[i])
                            x = self.iters[i].next()
            """,
            line=12, count=2, message="`it.next()`",
        ),
        Invalid(
            """
            import torch
            dataiter = iter(trainloader)
            images, labels = dataiter.next()
            """,
            line=4, message="`dataiter.next()`",
            fixed="""
            import torch
            dataiter = iter(trainloader)
            images, labels = next(dataiter)
            """,
        ),
        Invalid(
            """
            import torch
            x, y = iter(loader).next()
            """,
            line=3,
            fixed="""
            import torch
            x, y = next(iter(loader))
            """,
        ),
        # nn.Module.parameters() is a generator
        Invalid(
            """
            import torch
            w = model.parameters().next().data
            """,
            line=3, message="`model.parameters().next()`",
            fixed="""
            import torch
            w = next(model.parameters()).data
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "next" or node.args:
            return
        receiver = func.value
        made = receiver if isinstance(receiver, cst.Call) else ctx.assigned_value(receiver)
        # an item of a list of iterators (``iters.append(iter(loader))``, then ``for it in iters: it.next()``)
        items = item_values(ctx, receiver) if made is None else None
        if not (makes_iterator(made, ctx) or (items and all(makes_iterator(item, ctx) for item in items))) or \
                ctx.binding("next") is not None:
            return
        if not ctx.facts(VersionFacts).admits("torch", (2, 0)):
            return
        replacement = cst.Call(func=cst.Name("next"), args=[cst.Arg(receiver)])
        self.report(node, f"{code_span(short(ctx, node))} calls the Python 2 `next()` method, which iterators no longer "
                          f"have (DataLoader iterators dropped it): it raises AttributeError; use "
                          f"{code_span(short(ctx, replacement))}", replacement=replacement)
