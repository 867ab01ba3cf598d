"""The rule base of TR710, TR711, TR712 and TR713: feeds the file's calls to the model's ``AmpFacts``, which the
rules compare in ``end_file``."""
from __future__ import annotations

import libcst as cst

from analyzers.context import FileContext
from analyzers.program.amp import AmpFacts
from analyzers.program.library import Does, training_libraries_that
from analyzers.rules.base import Rule


class AmpRule(Rule):
    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        ctx.facts(AmpFacts).note(node, ctx)

    def scaling_elsewhere(self, ctx: FileContext) -> bool:
        return any(ctx.imports.imports_root(lib) for lib in training_libraries_that(Does.SCALES_LOSS))
