"""Notebooks as IPython reads them, line for line.

* :func:`read_cells` streams the cells out of a ``.ipynb``; outputs go by unkept, so the size
  limit applies to the code and not to embedded images.
* :func:`cell_to_python` turns one cell into Python with IPython's own input transformer
  (``%magic``, ``!cmd``, ``x = !cmd``, ``obj?``, prompts, an indented cell), keeping every line
  where it was: a finding or a syntax error in the program is on the same line of the cell.
* :func:`json_source_lines` says on which line of the ``.ipynb`` text each line of a cell's
  source is, which is where GitHub's diff of the notebook shows it; :func:`json_fix` turns a fix
  of cell lines into the same fix of those JSON lines.
"""
from __future__ import annotations

import ast
import bisect
import codecs
import io
import itertools
import json
import os
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import BinaryIO, Mapping, Optional, Union

from analyzers.model import Fix

# GitHub stores no file over 100 MB; a notebook larger than that is not read at all.
MAX_NOTEBOOK_BYTES = 100_000_000

# Cell magics whose body is Python that IPython runs (timed, captured, profiled...): analyzed.
# Every other cell magic (%%writefile, %%bash, %%html, %%sql, ...) holds something else: skipped.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "memit", "px", "python", "python3"})

_CELL_MAGIC = re.compile(r"%%(\w+)")
# Lines that may be IPython syntax: an escape first (%, !, ?, /, ",", ;), "= %" or "= !", a "?" last.
_MAYBE_IPYTHON = re.compile(r"^[ \t]*[%!?/,;]|=[ \t]*[%!]|\?[ \t]*$", re.M)
# A pasted interactive session, which IPython strips: ">>> ", "... ", "In [1]: ".
_PROMPT = re.compile(r"^[ \t]*(>>>|\.\.\.)( |$)|^In \[\d+\]: ", re.M)
# Said where a cell in IPython syntax could not be analyzed because IPython is not installed.
IPYTHON_HINT = ("IPython syntax (%magic, !command, a pasted prompt) needs IPython: "
                "pip install 'torchreview[notebooks]'")
# What IPython makes of a line magic that times or profiles a statement, ``%time stmt``.
_TIMED = re.compile(r"^(.*?)get_ipython\(\)\.run_line_magic\('(time|timeit|prun)', ('.*'|\".*\")\)\n$")


_SOURCE_DEPTH = 4  # notebook > "cells" > a cell > its "source" list: the containers read_cells looks into


class NotebookError(ValueError):
    pass


@dataclass(frozen=True)
class Cell:
    number: int  # 1-based over all cells, markdown included, as Jupyter shows them
    cell_type: str
    source: str


def read_cells(data: Union[bytes, str, BinaryIO]) -> list[Cell]:
    """The cells of a notebook's JSON (text, bytes or a binary file), streamed: outputs (images,
    widget state) go past one value at a time and are never held, so memory follows the code."""
    import ijson  # here: only notebooks need it

    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if isinstance(data, bytes):
        data = io.BytesIO(data)
    if data.read(3) != codecs.BOM_UTF8:  # some editors write one; JSON parsers refuse it
        data.seek(0)
    # The open containers down to a cell's source list: [is_map, current key]. Those deeper (outputs, metadata)
    # are only counted: a file of nothing but "[" would cost a list per bracket (30 MB of them: 2.6 GB).
    stack: list[list] = []
    deeper = 0
    cells: list[Cell] = []
    current: Optional[dict] = None  # the cell being read
    found = False
    items = 0
    try:
        # basic_parse: no per-event path strings, which would grow with nesting depth
        for event, value in ijson.basic_parse(data, use_float=True):
            if deeper:
                deeper += 1 if event in ("start_map", "start_array") else -1 if event in ("end_map", "end_array") else 0
                continue
            if event == "map_key":
                stack[-1][1] = value
                continue
            if event in ("end_map", "end_array"):
                closed = stack.pop()
                if current is not None and len(stack) == 2 and closed[0]:
                    cells.append(Cell(current["number"], current["type"], "".join(current["source"])))
                    current = None
                continue
            depth = len(stack)
            in_cells = depth >= 2 and stack[0] == [True, "cells"] and not stack[1][0]
            if depth == 1 and stack[0] == [True, "cells"] and event == "start_array":
                found = True
            elif depth == 2 and in_cells:  # an item of "cells": numbered even when it is not a cell
                items += 1
                current = {"number": items, "type": "", "source": []} if event == "start_map" else None
            elif current is not None and depth == 3 and in_cells and event == "string":
                if stack[2][1] == "cell_type":
                    current["type"] = value
                elif stack[2][1] == "source":
                    current["source"] = [value]
            elif (current is not None and depth == 4 and in_cells and event == "string"
                  and stack[2][1] == "source" and not stack[3][0]):
                current["source"].append(value)
            if event in ("start_map", "start_array"):
                if depth < _SOURCE_DEPTH:
                    stack.append([event == "start_map", None])
                else:
                    deeper = 1
    except (ijson.JSONError, ValueError) as exc:
        raise NotebookError(f"not a readable .ipynb notebook: {_first_line(exc)}") from None
    if not found:
        raise NotebookError("not a readable .ipynb notebook: no 'cells' list")
    return cells


def _first_line(exc: Exception) -> str:
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).strip().split("\n")[0]


@dataclass(frozen=True)
class PythonCell:
    """A cell as Python: ``source`` has exactly as many lines as the cell; ``columns[i]`` is how many
    characters were taken off the start of line i + 1 (a dedent, a prompt), to map columns back;
    ``rewritten`` holds the lines IPython turned into something else (a magic into a call)."""

    source: str
    columns: tuple[int, ...]
    rewritten: frozenset[int] = frozenset()
    # IPython is not installed and the cell may be in its syntax: left as it is, it may not parse
    needs_ipython: bool = False


def cell_to_python(source: str) -> Optional[PythonCell]:
    """One code cell as the Python IPython runs, line for line; None for a cell that is not Python
    (a cell magic such as ``%%writefile`` or ``%%bash``)."""
    original = source.split("\n")
    lines = [line + "\n" for line in original]
    # An indented cell runs (IPython dedents it); blank lines do not count.
    lines = _split(textwrap.dedent("".join(lines)), len(original))
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None:
        magic = _CELL_MAGIC.match(lines[first])
        if magic and not lines[first].startswith(f"%%{magic.group(1)}?"):
            if magic.group(1) not in PYTHON_CELL_MAGICS:
                return None
            lines[first] = "\n"  # the body is Python; the magic's own line is not
    # Without IPython (the base install, no `notebooks` extra) cells are analyzed as they are.
    manager, prompt_strippers = _ipython() or (None, ())
    joined = "".join(lines)
    needs_ipython = manager is None and bool(_MAYBE_IPYTHON.search(joined) or _PROMPT.search(joined))
    try:
        for strip in prompt_strippers:  # ">>> " and "In [1]: " of a pasted session; they only shorten lines
            lines = strip(lines)
        if manager is not None and _MAYBE_IPYTHON.search("".join(lines)):
            lines = manager.do_token_transforms(lines)  # IPython re-tokenizes the cell per magic: not for plain Python
    except (SyntaxError, RuntimeError, ValueError):
        # IPython could not make sense of it either: analyze what is there, errors included.
        lines = [line + "\n" for line in original]
    if len(lines) != len(original):  # never expected: each transform keeps its line count
        lines = [line + "\n" for line in original]
    text = "".join(lines)[:-1]
    columns = tuple(_removed_chunk(before, after[:-1]) for before, after in zip(original, lines))
    rewritten = frozenset(n for n, (before, after) in enumerate(zip(original, lines), 1)
                          if not before.endswith(after[:-1]) or (after == "\n" and before.strip()))
    return PythonCell(text, columns, rewritten, needs_ipython)


def _split(text: str, count: int) -> list[str]:
    lines = [line + "\n" for line in text.split("\n")]
    return lines[:count] if len(lines) > count else lines


def _removed_chunk(before: str, after: str) -> int:
    """How many characters a line lost when ``after`` is ``before`` less one stretch (an indent, a
    prompt, the ``%time`` of ``x = %time f()``), so columns past it move back; else 0."""
    if not after or len(after) >= len(before):
        return 0
    prefix = len(os.path.commonprefix([before, after]))
    suffix = len(os.path.commonprefix([before[::-1], after[::-1]]))
    return len(before) - len(after) if prefix + suffix >= len(after) else 0


@lru_cache(maxsize=1)
def _ipython():
    """IPython's transformer and prompt strippers, or None where IPython is not installed."""
    # Imported here: IPython is needed only for notebooks, and costs ~0.1 s to import.
    try:
        from IPython.core import inputtransformer2 as it2
    except ImportError:
        return None

    def keep_line_count(base):
        """The transform, with blank lines where it joined continued lines (``!cmd \\``) into one."""

        class Kept(base):
            def transform(self, lines):
                out = super().transform(lines)
                line = out[self.start_line]
                timed = _TIMED.match(line)
                if timed:  # ``%time train()`` runs ``train()``: analyze the statement, not a string
                    statement = ast.literal_eval(timed.group(3))
                    if statement and not statement.startswith("-"):
                        out[self.start_line] = timed.group(1) + statement.strip() + "\n"
                missing = len(lines) - len(out)
                if missing > 0:
                    at = self.start_line + 1
                    out = out[:at] + ["\n"] * missing + out[at:]
                return out

        Kept.__name__ = base.__name__
        return Kept

    manager = it2.TransformerManager()
    manager.token_transformers = [keep_line_count(t) for t in manager.token_transformers]
    return manager, (it2.classic_prompt, it2.ipython_prompt)


# ---- where a cell's lines are in the .ipynb text ---------------------------------------------

class _Located(str):
    """A JSON string value that remembers where it starts in the text."""

    __slots__ = ("offset",)


def json_source_lines(text: str) -> dict[int, list[int]]:
    """``{cell number: [line of the .ipynb text holding cell line 1, line 2, ...]}`` (all 1-based)."""
    return json_source_layout(text)[0]


def json_source_layout(text: str) -> tuple[dict[int, list[int]], dict[int, str]]:
    """:func:`json_source_lines`, and the text of each line of the ``.ipynb`` it names (what :func:`json_fix`
    reads of a notebook).

    nbformat writes one source line per JSON line, so each cell line gets its own; a source
    written as one string puts all of a cell's lines on that string's line. Empty when the
    text is not a notebook.

    Only the path to the cells' sources is walked here; every other value (outputs, metadata) is
    stepped over by the C scanner and dropped at once, so time and memory follow the notebook's
    structure, not the count of strings in its outputs.
    """
    try:
        notebook, _ = _json_object(text, _skip_space(text, 0), _notebook_member)
    except (StopIteration, ValueError, RecursionError, IndexError):
        return {}, {}
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        return {}, {}
    line_of, line_texts = _lines_at(text, sorted({p.offset for cell in cells if isinstance(cell, dict)
                                                  for p in _pieces(cell.get("source")) if isinstance(p, _Located)}))
    out: dict[int, list[int]] = {}
    for number, cell in enumerate(cells, 1):
        pieces = _pieces(cell.get("source") if isinstance(cell, dict) else None)
        if not pieces or not all(isinstance(p, _Located) for p in pieces):
            continue
        ends = list(itertools.accumulate(len(p) for p in pieces))
        joined = "".join(pieces)
        starts = [0] + [i + 1 for i, ch in enumerate(joined) if ch == "\n"]  # where each cell line starts
        lines = []
        for start in starts:
            piece = pieces[min(bisect.bisect_right(ends, start), len(pieces) - 1)]
            lines.append(line_of[piece.offset])
        out[number] = lines
    return out, line_texts


_STEP_OVER = json.scanner.make_scanner(json.JSONDecoder())  # the C scanner where there is one


def _skip_space(text: str, at: int) -> int:
    return json.decoder.WHITESPACE.match(text, at).end()


def _skipped(text: str, at: int) -> tuple[None, int]:
    return None, _STEP_OVER(text, at)[1]


def _located(text: str, at: int) -> tuple[object, int]:
    if text[at] != '"':
        return _skipped(text, at)
    value, end = json.decoder.scanstring(text, at + 1)
    located = _Located(value)
    located.offset = at
    return located, end


def _notebook_member(text: str, key: str, at: int) -> tuple[object, int]:
    if key == "cells" and text[at] == "[":
        return _json_array(text, at, lambda at: _json_object(text, at, _cell_member) if text[at] == "{"
                           else _skipped(text, at))
    return _skipped(text, at)


def _cell_member(text: str, key: str, at: int) -> tuple[object, int]:
    if key != "source":
        return _skipped(text, at)
    if text[at] == "[":
        return _json_array(text, at, lambda at: _located(text, at))
    return _located(text, at)


def _json_object(text: str, at: int, member) -> tuple[dict, int]:
    """The JSON object at ``at`` as ``{key: member(text, key, position of its value)}``, and where it ends."""
    if text[at] != "{":
        raise ValueError("not a JSON object")
    out: dict = {}
    at = _skip_space(text, at + 1)
    if text[at] == "}":
        return out, at + 1
    while True:
        if text[at] != '"':
            raise ValueError("expected a key")
        key, at = json.decoder.scanstring(text, at + 1)
        at = _skip_space(text, at)
        if text[at] != ":":
            raise ValueError("expected ':'")
        out[key], at = member(text, key, _skip_space(text, at + 1))
        at = _skip_space(text, at)
        if text[at] == "}":
            return out, at + 1
        if text[at] != ",":
            raise ValueError("expected ',' or '}'")
        at = _skip_space(text, at + 1)


def _json_array(text: str, at: int, item) -> tuple[list, int]:
    """The JSON array at ``at`` as ``[item(position of each value)]``, and where it ends."""
    out: list = []
    at = _skip_space(text, at + 1)
    if text[at] == "]":
        return out, at + 1
    while True:
        value, at = item(at)
        out.append(value)
        at = _skip_space(text, at)
        if text[at] == "]":
            return out, at + 1
        if text[at] != ",":
            raise ValueError("expected ',' or ']'")
        at = _skip_space(text, at + 1)


def _pieces(source) -> list:
    return source if isinstance(source, list) else [source]


_MAX_FIXED_LINE = 1 << 20


def _lines_at(text: str, offsets: list[int]) -> tuple[dict[int, int], dict[int, str]]:
    """The 1-based line of each of the sorted ``offsets``, and the text of those lines (newlines counted
    and found in C: the text is never split into all of its lines)."""
    lines, texts, line, counted = {}, {}, 1, 0
    for offset in offsets:
        line += text.count("\n", counted, offset)
        lines[offset], counted = line, offset
        if line not in texts:
            start, end = text.rfind("\n", 0, offset) + 1, text.find("\n", offset)
            end = len(text) if end == -1 else end
            if end - start <= _MAX_FIXED_LINE:  # a longer one (a notebook on one line) is no cell line to fix
                texts[line] = text[start:end]
    return lines, texts


_JSON_STRING_LINE = re.compile(r'([ \t]*)("(?:[^"\\]|\\.)*")(,?)[ \t\r]*')


def json_fix(text: str, cell_lines: list[int], fix: Fix, lines: Optional[Mapping[int, str]] = None) -> Optional[Fix]:
    """A fix of cell lines as the same fix of the ``.ipynb`` text (JSON strings, one per line), so it
    can be a committable suggestion on GitHub's diff of the notebook; None unless each fixed cell line
    is one whole JSON line of its own (as nbformat writes them). ``lines``: the text's lines by number
    where known (:func:`json_source_layout`), so that a large notebook is not split into all of its lines."""
    if not 0 < fix.start_line <= fix.end_line <= len(cell_lines):
        return None
    numbers = cell_lines[fix.start_line - 1: fix.end_line]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        return None  # two cell lines in one string, or one line split over two
    if lines is None:
        lines = dict(enumerate(text.split("\n"), 1))
    found = [_JSON_STRING_LINE.fullmatch(lines[n]) if n in lines else None for n in numbers]
    if not all(found):
        return None
    last_value = json.loads(found[-1].group(2))
    pieces = fix.replacement.split("\n")[:-1] if fix.replacement.endswith("\n") else fix.replacement.split("\n")
    pieces = [piece + "\n" for piece in pieces]
    if pieces and not last_value.endswith("\n"):  # the cell's last line has no newline in the JSON
        pieces[-1] = pieces[-1][:-1]
    indent = found[0].group(1)
    out = [f"{indent}{json.dumps(piece, ensure_ascii=False)}," for piece in pieces]
    if out:
        out[-1] = out[-1][:-1] + found[-1].group(3)
    return Fix(numbers[0], numbers[-1], "".join(line + "\n" for line in out))
