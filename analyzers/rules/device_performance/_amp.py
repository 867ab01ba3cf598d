"""The rule base of TR710, TR711, TR712 and TR713: feeds the file's calls to the model's ``AmpFacts``, which the
rules compare in ``end_file``."""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext
from analyzers.program.amp import AmpFacts
from analyzers.rules.base import Rule


class AmpRule(Rule):
    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        ctx.facts(AmpFacts).note(node, ctx)
