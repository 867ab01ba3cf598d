"""What TR970 and TR971 share."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import (all_children, dotted_name)
from analyzers.program.names import last_segment, name_words


# ---------------------------------------------------------------------------------------------
# scikit-learn: TR970, TR971

TEST_WORDS = {"test", "testing", "holdout"}


def name_tokens(name: str) -> set[str]:
    tokens = set(name_words(last_segment(name)))
    for token in list(tokens):
        if token[:1] in ("x", "y") and len(token) > 1:
            tokens.add(token[1:])  # Xtest, yval
        for suffix in ("set", "data", "df", "ds"):
            if token.endswith(suffix) and len(token) > len(suffix):
                tokens.add(token[: -len(suffix)])  # testset, valdata
    return tokens


def mentions_test(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    """The first name under ``expr`` that reads as test data (``X_test``, ``testset``), if any."""
    if expr is None:
        return None
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            if name is not None:
                if name_tokens(name) & TEST_WORDS:
                    return name
                continue
        stack.extend(reversed(all_children(node)))
    return None


def targets(node: cst.CSTNode) -> list[str]:
    names = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            names.append(current.value)
        elif isinstance(current, (cst.Tuple, cst.List)):
            stack.extend(reversed([e.value for e in current.elements]))
    return names
