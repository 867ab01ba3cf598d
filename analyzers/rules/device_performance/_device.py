"""The rule base of TR702 and TR703: the DataLoader calls of a file, as the program model reads them."""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext
from analyzers.program.data import Loader, loader_of_call
from analyzers.program.devices import observe, observe_assign
from analyzers.rules.base import Rule


class LoaderRule(Rule):
    """Collects the loaders a subclass :meth:`wants`; the device facts (``device_facts``) are fed on the way."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.loaders: list[Loader] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        observe_assign(node, ctx)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = observe(node, ctx)
        if name == "DataLoader" or (name is not None and name[:1].isupper() and isinstance(node.func, cst.Name)
                                    and name in ctx.imports.names):
            loader = loader_of_call(node, ctx)
            if loader is not None and self.wants(loader):
                self.loaders.append(loader)

    def wants(self, loader: Loader) -> bool:
        raise NotImplementedError
