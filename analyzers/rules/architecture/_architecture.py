"""What TR301, TR302 and TR303 share."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext


def direct_method_class(node: cst.FunctionDef, ctx: FileContext) -> Optional[cst.ClassDef]:
    """The class whose body defines ``node`` directly, or None (functions, nested defs)."""
    cls = ctx.class_def
    if cls is None:
        return None
    block = ctx.parent(node)
    return cls if block is not None and ctx.parent(block) is cls else None
