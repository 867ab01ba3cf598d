"""Which rules may report on a source text, from their ``source_hint`` patterns, cheaply.

Every rule's hint is a regular expression searched over the whole file before the rule runs. Rules share hints
(``backward`` is nine rules' hint), and an alternation of words (``synchronize\\s*\\(|all_reduce|...``) makes the
regex engine try every branch at every position. So each distinct pattern is searched once per file, and only
where a plain substring test (``str.__contains__``, far faster than the regex) finds a literal that every match
of the pattern must contain: the answer is the regex's own, the literal test only skips searches that cannot
match. A pattern that only spells out words (``DataLoader``, ``wandb|mlflow``) is answered by the substring test.
"""
from __future__ import annotations

import re
from typing import Optional

try:
    from re import _parser as _sre  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

# pattern -> (literals one of which every match contains, or None; whether a match is exactly one of them)
_LITERALS: dict[re.Pattern, tuple[Optional[tuple[str, ...]], bool]] = {}


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
            literals, exact = _LITERALS.get(pattern) or _read(pattern)
            if literals is None:
                found = pattern.search(source) is not None
            else:
                found = any(literal in source for literal in literals) and (exact or pattern.search(source) is not None)
            self.found[pattern] = found
        return found


def necessary_literals(pattern: re.Pattern) -> Optional[tuple[str, ...]]:
    """Substrings one of which every match of ``pattern`` contains (``("all_reduce", "all_gather", "reduce")``);
    None when no such set is known (case-insensitive patterns, character classes only, anything unusual)."""
    return _read(pattern)[0]


def exact_literals(pattern: re.Pattern) -> Optional[tuple[str, ...]]:
    """The strings ``pattern`` matches when they are a few plain words (``DataLoader``, ``wandb|mlflow``): then
    finding one of them is the whole search."""
    literals, exact = _read(pattern)
    return literals if exact else None


def _read(pattern: re.Pattern) -> tuple[Optional[tuple[str, ...]], bool]:
    found: tuple[Optional[tuple[str, ...]], bool] = (None, False)
    if not pattern.flags & re.IGNORECASE:
        try:
            items = list(_sre.parse(pattern.pattern, pattern.flags))
            words = _words(items)
            found = (tuple(words), True) if words else (_sequence_literals(items), False)
        except Exception:  # a construct this reading does not know: search with the regex alone
            found = (None, False)
    if len(_LITERALS) < 1024:
        _LITERALS[pattern] = found
    return found


def _words(items: list) -> Optional[list[str]]:
    """Every string a sequence of regex items matches, when it only spells out literals and alternations of
    them; None otherwise."""
    words = [""]
    for op, value in items:
        if op is _sre.LITERAL:
            words = [word + chr(value) for word in words]
        elif op is _sre.BRANCH or (op is _sre.SUBPATTERN and not value[1] & re.IGNORECASE):
            branches = [_words(list(branch)) for branch in value[1]] if op is _sre.BRANCH else [_words(list(value[-1]))]
            if not all(branches):
                return None
            words = [word + tail for word in words for branch in branches for tail in branch]
        elif op is _sre.IN and all(kind is _sre.LITERAL for kind, _ in value):  # [ab], or re's own b|c
            words = [word + chr(char) for word in words for _, char in value]
        else:
            return None
        if len(words) > 64:
            return None
    return words if all(words) else None


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
