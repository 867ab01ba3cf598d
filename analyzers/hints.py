"""Which rules may report on a source text, from their ``source_hint`` patterns, cheaply.

Every rule's hint is a regular expression searched over the whole file before the rule runs. Rules share hints
(``backward`` is nine rules' hint), and an alternation of words (``synchronize\\s*\\(|all_reduce|...``) makes the
regex engine try every branch at every position. So each distinct pattern is searched once per file, and only
where a plain substring test (``str.__contains__``, far faster than the regex) finds a literal that every match
of the pattern must contain: the answer is the regex's own, the literal test only skips searches that cannot
match.
"""
from __future__ import annotations

import re
from typing import Optional

try:
    from re import _parser as _sre  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

_LITERALS: dict[re.Pattern, Optional[tuple[str, ...]]] = {}


class SourceHints:
    """``Rule.may_report_on`` for every rule of one file, each distinct pattern searched at most once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.found: dict[re.Pattern, bool] = {}

    def admit(self, rule: type) -> bool:
        hint = rule.source_hint
        if hint is None:
            return True
        return all(self._search(pattern) for pattern in (hint if isinstance(hint, tuple) else (hint,)))

    def _search(self, pattern: re.Pattern) -> bool:
        found = self.found.get(pattern)
        if found is None:
            source = self.source
            literals = _LITERALS[pattern] if pattern in _LITERALS else necessary_literals(pattern)
            found = (literals is None or any(literal in source for literal in literals)) and \
                pattern.search(source) is not None
            self.found[pattern] = found
        return found


def necessary_literals(pattern: re.Pattern) -> Optional[tuple[str, ...]]:
    """Substrings one of which every match of ``pattern`` contains (``("all_reduce", "all_gather", "reduce")``);
    None when no such set is known (case-insensitive patterns, character classes only, anything unusual)."""
    literals: Optional[tuple[str, ...]] = None
    if not pattern.flags & re.IGNORECASE:
        try:
            literals = _sequence_literals(list(_sre.parse(pattern.pattern, pattern.flags)))
        except Exception:  # a construct this reading does not know: search with the regex alone
            literals = None
    if len(_LITERALS) < 1024:
        _LITERALS[pattern] = literals
    return literals


def _sequence_literals(items: list) -> Optional[tuple[str, ...]]:
    """The best of the choices a sequence of regex items offers: its longest run of literal characters, or one of
    its alternations whose every branch has literals; best is the longest shortest literal."""
    choices: list[tuple[str, ...]] = []
    run = ""
    for op, value in items:
        if op is _sre.LITERAL:
            run += chr(value)
            continue
        if op is _sre.AT:  # \b, ^, $: zero-width, the run goes on
            continue
        if run:
            choices.append((run,))
            run = ""
        if op is _sre.BRANCH:
            branches = [_sequence_literals(list(branch)) for branch in value[1]]
            if all(branches):
                choices.append(tuple(literal for branch in branches for literal in branch))
        elif op is _sre.SUBPATTERN and not value[1] & re.IGNORECASE:  # (?i:...) is not literal
            inner = _sequence_literals(list(value[-1]))
            if inner:
                choices.append(inner)
    if run:
        choices.append((run,))
    if not choices:
        return None
    return max(choices, key=lambda literals: min(map(len, literals)))
