"""Cheap checks before libcst parses untrusted source.

libcst's native parser recurses per nesting level and is quadratic in the length of an operator
chain: 3 KB of parentheses nested ~1,500 deep crash the process (SIGSEGV, no exception to catch),
and a 40 KB ``1+1+...`` takes a minute and then crashes. Scanning with regular expressions (no
parse) estimates how deep the syntax tree gets and how much chain work a parse would do, so such
a file becomes an ``errors`` entry instead of taking a worker down. Real code is far below the
limits: CPython itself refuses more than 200 nested brackets and 100 indentation levels.

Two tiers: a quick upper bound computed in C loops (regex substitutions, ``accumulate``) clears
almost every real file; only a file it cannot clear gets the exact token scan. Together they cost
about 5% of a bare libcst parse (400 files of the torch package).
"""
from __future__ import annotations

import re
from itertools import accumulate, repeat
from typing import Optional

from analyzers.model import FileError

MAX_BRACKET_DEPTH = 200  # CPython's tokenizer limit ("too many nested parentheses")
MAX_INDENT_LEVELS = 100  # CPython's limit ("too many levels of indentation")
MAX_TREE_DEPTH = 1000  # estimated syntax-tree depth; libcst crashes somewhere past ~1,200 levels
MAX_CHAIN = 1000  # operators in one chain (a+b+..., a.b.c..., not not ...): parse time grows as n**2
SHORT_CHAIN = 32  # chains up to this long cost nothing worth counting
MAX_CHAIN_WORK = 25_000_000  # sum of (chain - SHORT_CHAIN)**2 over a file: about 5 s of libcst parsing

_TOKEN = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>(?P<prefix>[rRbBuUfF]{0,2})(?:'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"
                                             |'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
  | (?P<word>\b(?:and|or|not|if|else|lambda|await|in|is)\b)
  | (?P<open>[(\[{])
  | (?P<close>[)\]}])
  | (?P<comma>[,;])
  | (?P<newline>\n)
  | (?P<op>\*\*|//|<<|>>|<=|>=|==|!=|:=|[-+*/%@&|^~<>.])
  | (?P<continuation>\\\r?\n)
""", re.VERBOSE | re.DOTALL)


class TooComplex(ValueError):
    """The source would make the parser crash or take too long; ``str()`` says why."""


def complexity_error(source: str, path: str) -> Optional[FileError]:
    """A ``too-complex`` error for ``path`` when its source must not reach the parser, else None."""
    problem = complexity_problem(source)
    if problem is None:
        return None
    return FileError(path, "too-complex", f"{problem}; not parsed (it could crash or stall the parser)")


def complexity_problem(source: str) -> Optional[str]:
    """Why ``source`` is too complex to hand to libcst, or None when it is fine."""
    if _surely_fine(source):
        return None
    try:
        _scan(source)
    except TooComplex as exc:
        return str(exc)
    return None


# The quick bound, all in C loops: strings and comments replaced by one operator each, then only
# brackets, operators and newlines kept. Every count is at least what the exact scan counts, so
# "fine" here is fine there; anything else gets the exact scan.
# Each string's body as runs of ordinary characters between escapes and lone quotes (no per-character
# alternation: docstrings are most of the text): the same matches as the lazy ``(?:[^\\]|\\.)*?'''``, at half the cost.
_STRINGS_COMMENTS = re.compile(
    r"#[^\n]*"
    r"|'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''|\"\"\"[^\"\\]*(?:(?:\\.|\"(?!\"\"))[^\"\\]*)*\"\"\""
    r"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'|\"[^\"\\\n]*(?:\\.[^\"\\\n]*)*\"", re.DOTALL)
# Keyword operators, once strings and comments are gone: a plain substitution, no Python call per match.
# No leading \b: "main" counts, harmlessly.
_WORD_OPERATORS = re.compile(r"(?:and|or|not|if|else|lambda|await|in|is)\b")
_NOT_STRUCTURE = re.compile(r"[^()\[\]{}\n+\-*/%@&|^~<>.]+")
_INDENT = re.compile(r"^[ \t]*(?=[^\s#])", re.MULTILINE)
_DELTA = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}


def _blank(match: re.Match) -> str:
    text = match.group()
    if text[0] == "#":
        return ""
    if "f" in match.string[max(0, match.start() - 2):match.start()].lower():
        # an f-string: its expressions nest at most as deep as it has opening brackets
        return "+" * (1 + text.count("{") + text.count("(") + text.count("["))
    return "+"


def _surely_fine(source: str) -> bool:
    code = _WORD_OPERATORS.sub("+", _STRINGS_COMMENTS.sub(_blank, source))
    indent = max(map(len, _INDENT.findall(code)), default=0)  # columns: at least the indentation levels
    if indent > MAX_INDENT_LEVELS:
        return False
    structure = _NOT_STRUCTURE.sub("", code)
    depths = list(accumulate(map(_DELTA.get, structure, repeat(0))))
    if max(depths, default=0) > MAX_BRACKET_DEPTH:
        return False
    work, start = 0, 0
    ends = [m.start() for m in re.finditer("\n", structure)] + [len(structure)]
    for at in ends:
        if at < len(structure) and depths[at] > 0:
            continue  # inside brackets: the logical line goes on
        length = at - start  # at least the operators and brackets of this logical line
        start = at + 1
        if indent + length > MAX_TREE_DEPTH or length > MAX_CHAIN:
            return False
        if length > SHORT_CHAIN:
            work += (length - SHORT_CHAIN) ** 2
    return work <= MAX_CHAIN_WORK


def _scan(source: str) -> None:
    counters: list[int] = [0]  # operator-chain length at each bracket level, innermost last
    chained = 0  # sum(counters): the tree depth the open chains add
    indents: list[int] = []
    work = 0
    line_start = True  # the next significant token starts a logical line
    newline_at = -1
    previous_string = False

    def bump(amount: int, at: int) -> None:
        nonlocal chained
        counters[-1] += amount
        chained += amount
        if counters[-1] > MAX_CHAIN:
            raise TooComplex(f"line {_line(source, at)}: a chain of over {MAX_CHAIN} operators in one expression")
        depth = len(indents) + len(counters) + chained
        if depth > MAX_TREE_DEPTH:
            raise TooComplex(f"line {_line(source, at)}: code nested over {MAX_TREE_DEPTH} levels deep")

    def end_chain(at: int) -> None:
        nonlocal chained, work
        value = counters[-1]
        chained -= value
        counters[-1] = 0
        if value > SHORT_CHAIN:
            work += (value - SHORT_CHAIN) ** 2
            if work > MAX_CHAIN_WORK:
                raise TooComplex(f"line {_line(source, at)}: too many long operator chains to parse in reasonable time")

    for match in _TOKEN.finditer(source):
        kind = match.lastgroup
        if kind == "prefix":  # the named group inside "string" can be the last one matched
            kind = "string"
        if kind == "comment" or kind == "continuation":
            continue
        if kind == "newline":
            if len(counters) == 1:  # a logical line ends
                end_chain(match.start())
                line_start, newline_at = True, match.start()
            previous_string = False
            continue
        if line_start:
            line_start = False
            column = match.start() - newline_at - 1
            while indents and column < indents[-1]:
                indents.pop()
            if column > (indents[-1] if indents else 0):
                indents.append(column)
        if kind == "string":
            text = match.group()
            if previous_string:
                bump(1, match.start())  # implicit concatenation nests in libcst
            if "f" in match.group("prefix").lower():
                _scan_fstring(text, bump, match.start())
            previous_string = True
            continue
        previous_string = False
        if kind == "open":
            bump(1, match.start())  # a call, subscript or parenthesized operand adds a level
            counters.append(0)
            if len(counters) - 1 > MAX_BRACKET_DEPTH:
                raise TooComplex(f"line {_line(source, match.start())}: brackets nested over {MAX_BRACKET_DEPTH} deep")
        elif kind == "close":
            if len(counters) > 1:
                end_chain(match.start())
                counters.pop()
        elif kind == "comma":
            end_chain(match.start())
        else:  # op, word: other names and numbers are never matched (a "." in a number counts: harmless)
            bump(1, match.start())


def _scan_fstring(text: str, bump, at: int) -> None:
    """Expressions inside an f-string's braces are parsed too: count how deep they nest."""
    depth = deepest = 0
    for char in text.replace("{{", "").replace("}}", ""):
        if char in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "})]" and depth:
            depth -= 1
    if deepest:
        bump(deepest, at)


def _line(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1
