"""What TR901 and TR902 share."""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext


def short(ctx: FileContext, node: cst.CSTNode, limit: int = 60) -> str:
    text = " ".join(ctx.module.code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 5] + "...)"
