"""The rule base of TR611 and TR613: checkpoint loads without ``map_location``."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, keyword_arg)
from analyzers.program.library import Does, does, is_ddp
from analyzers.program.roles import loads_model_checkpoint
from analyzers.rules.base import Rule


# setting up a process group means distributed training, as does wrapping a model in DDP
INIT_PROCESS_GROUP = "torch.distributed.init_process_group"


class LoadsWithoutMapLocation(Rule):
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
        if qualified == INIT_PROCESS_GROUP or is_ddp(qualified):
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
        if loads_model_checkpoint(node, ctx):
            self._loads.append((node, scope))
            self.load_seen(node, ctx)

    def load_seen(self, node: cst.Call, ctx: FileContext) -> None:
        """A candidate load, at the point of the walk where it is (for what is in scope there)."""
