"""What TR411, TR412 and TR414 share."""
from __future__ import annotations

from typing import Optional

import libcst as cst


def is_one(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Integer):
        return expr.value == "1"
    if isinstance(expr, cst.Float):
        try:
            return float(expr.value) == 1.0
        except ValueError:
            return False
    return False


def single_argument(call: cst.Call) -> Optional[cst.BaseExpression]:
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    return call.args[0].value


def unwrap(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.with_changes(lpar=[], rpar=[]) if getattr(expr, "lpar", None) else expr
