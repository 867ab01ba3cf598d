"""Which rules may report on a source text, from their ``source_hint`` patterns, cheaply.

Every rule's hint is a regular expression searched over the whole file before the rule runs. Rules share hints
(``backward`` is nine rules' hint), and an alternation of words (``synchronize\\s*\\(|all_reduce|...``) makes the
regex engine try every branch at every position. So each distinct pattern is searched once per file, and only
where a plain substring test (``str.__contains__``, far faster than the regex) finds a literal that every match
of the pattern must contain: the answer is the regex's own, the literal test only skips searches that cannot
match. A pattern that only spells out words (``DataLoader``, ``wandb|mlflow``) is answered by the substring test;
one whose every match starts with a word (``\\bload\\b``, ``\\.step\\s*\\(``) is tried only where that word stands.
"""
from __future__ import annotations

import re
from typing import Optional

try:
    from re import _parser as _sre  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

# pattern -> how to search it: (literals or None, how they relate to a match: EXACT, PREFIX or INSIDE)
_LITERALS: dict[re.Pattern, tuple[Optional[tuple[str, ...]], str]] = {}
EXACT = "exact"  # a match is one of the literals
PREFIX = "prefix"  # every match starts with one of them (after zero-width assertions such as \b)
INSIDE = "inside"  # every match contains one of them
_SHORTEST_PREFIX = 3  # shorter prefixes ("." or "D") occur too often to try a match at each


class SourceHints:
    """``Rule.may_report_on`` for every rule of one file, each distinct pattern searched at most once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.found: dict[re.Pattern, bool] = {}

    def admit(self, rule: type) -> bool:
        hint = rule.source_hint
        if hint is None:
            return True
        return all(map(self._search, hint)) if type(hint) is tuple else self._search(hint)

    def _search(self, pattern: re.Pattern) -> bool:
        found = self.found.get(pattern)
        if found is None:
            found = self.found[pattern] = search(pattern, self.source)
        return found


def prepare(patterns) -> None:
    """Read what each pattern's matches must contain now, once per process (the rules' hints, as the rules load),
    rather than on the first file that happens to ask: a file's cost is then its own."""
    for pattern in patterns:
        if pattern not in _LITERALS:
            _read(pattern)


def search(pattern: re.Pattern, source: str) -> bool:
    """``pattern.search(source) is not None``, sooner."""
    literals, relation = _LITERALS.get(pattern) or _read(pattern)
    if literals is None:
        return pattern.search(source) is not None
    if relation == PREFIX:  # a match only where a prefix stands: try those places alone
        match = pattern.match
        for literal in literals:
            at = source.find(literal)
            while at != -1:
                if match(source, at):
                    return True
                at = source.find(literal, at + 1)
        return False
    return any(literal in source for literal in literals) and (relation == EXACT or pattern.search(source) is not None)


def necessary_literals(pattern: re.Pattern) -> Optional[tuple[str, ...]]:
    """Substrings one of which every match of ``pattern`` contains (``("all_reduce", "all_gather", "reduce")``);
    None when no such set is known (case-insensitive patterns, character classes only, anything unusual)."""
    return _read(pattern)[0]


def exact_literals(pattern: re.Pattern) -> Optional[tuple[str, ...]]:
    """The strings ``pattern`` matches when they are a few plain words (``DataLoader``, ``wandb|mlflow``): then
    finding one of them is the whole search."""
    literals, relation = _read(pattern)
    return literals if relation == EXACT else None


def _read(pattern: re.Pattern) -> tuple[Optional[tuple[str, ...]], str]:
    found: tuple[Optional[tuple[str, ...]], str] = (None, INSIDE)
    if not pattern.flags & re.IGNORECASE:
        try:
            items = list(_sre.parse(pattern.pattern, pattern.flags))
            words = _words(items)
            prefixes = _prefixes(items) if not words else None
            if words:
                found = (tuple(words), EXACT)
            elif prefixes and min(map(len, prefixes)) >= _SHORTEST_PREFIX:
                found = (tuple(prefixes), PREFIX)
            else:
                found = (_sequence_literals(items), INSIDE)
        except Exception:  # a construct this reading does not know: search with the regex alone
            found = (None, INSIDE)
    if len(_LITERALS) < 1024:
        _LITERALS[pattern] = found
    return found


def _item_words(op, value) -> Optional[list[str]]:
    """The strings one regex item matches, when they are a few plain words; None otherwise."""
    if op is _sre.LITERAL:
        return [chr(value)]
    if op is _sre.IN and all(kind is _sre.LITERAL for kind, _ in value):  # [ab], or re's own b|c
        return [chr(char) for _, char in value]
    if op is _sre.BRANCH or (op is _sre.SUBPATTERN and not value[1] & re.IGNORECASE):  # (?i:...) is not plain
        branches = [_words(list(branch)) for branch in value[1]] if op is _sre.BRANCH else [_words(list(value[-1]))]
        if all(branches):
            return [word for branch in branches for word in branch]
    return None


def _prefixes(items: list) -> Optional[list[str]]:
    """Words one of which every match of a sequence of regex items starts with (leading ``\\b`` or ``^`` are
    zero-width); None when it may start otherwise."""
    words = [""]
    for op, value in items:
        if op is _sre.AT and words == [""]:
            continue
        step = _item_words(op, value)
        if step is None:
            if op is _sre.BRANCH:  # alternatives, each with its own start: they go on the words so far
                starts = [_prefixes(list(branch)) for branch in value[1]]
                if all(starts):
                    words = [word + tail for word in words for start in starts for tail in start]
            break
        words = [word + tail for word in words for tail in step]
        if len(words) > 64:
            return None
    return words if all(words) else None


def _words(items: list) -> Optional[list[str]]:
    """Every string a sequence of regex items matches, when it only spells out literals and alternations of
    them; None otherwise."""
    words = [""]
    for op, value in items:
        step = _item_words(op, value)
        if step is None:
            return None
        words = [word + tail for word in words for tail in step]
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
