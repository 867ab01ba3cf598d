"""Where code selects its device: a CUDA selection with a CPU fallback, and code that runs only when CUDA is there."""
from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from analyzers.context import FileContext, code_children, iter_names, string_value

# ``if torch.cuda.is_available():`` / ``if use_cuda:`` / ``if device.type == "cuda":`` / ``if args.gpu:``
CUDA_TEST = re.compile(r"cuda|gpu|is_available|device|accelerat", re.IGNORECASE)


def expression_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The expression nodes under ``node`` (``code_children``: no whitespace, far cheaper than ``.children``)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(code_children(current))


def selects_with_cpu_fallback(value: cst.BaseExpression, ctx: FileContext) -> bool:
    """``torch.device("cuda" if torch.cuda.is_available() else "cpu")`` and its spellings."""
    if not any(name.endswith("is_available") for name in iter_names(value)):
        return False  # the cheap test first: most assignments name no availability check
    nodes = list(expression_nodes(value))
    asks = any(isinstance(n, cst.Call) and ctx.call_name(n) == "torch.cuda.is_available" for n in nodes)
    return asks and any(isinstance(n, cst.SimpleString) and string_value(n) == "cpu" for n in nodes)


def _names_and_strings(expr: cst.BaseExpression) -> list[str]:
    return list(iter_names(expr)) + [string_value(n) or "" for n in expression_nodes(expr)
                                     if isinstance(n, cst.SimpleString)]


def runs_only_with_cuda(node: cst.CSTNode, selection_ids: set[int], ctx: FileContext) -> bool:
    """``node`` sits in a device selection (one of ``selection_ids``), under a test of CUDA, or in a function or
    class named for the GPU."""
    below = node
    for ancestor in ctx.ancestors(node):
        if id(ancestor) in selection_ids:
            return True  # the selection itself
        if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and below is not ancestor.test and any(
                CUDA_TEST.search(name) for name in _names_and_strings(ancestor.test)):
            return True
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)) and CUDA_TEST.search(ancestor.name.value):
            return True
        below = ancestor
    return False
