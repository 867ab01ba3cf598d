"""What TR801 and TR803 share."""
from __future__ import annotations

from typing import Optional

import libcst as cst


def last_name(func: cst.BaseExpression) -> Optional[str]:
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return None
