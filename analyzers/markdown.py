"""GitHub-flavoured Markdown for text we did not write: the one place that escapes it.

Everything the App posts (review comments, the summary, check-run output, smoke results, command
replies) can quote a pull request: file names, code, rule messages that quote code, exception
text. Such text is data. It must render as exactly those characters, and never as emphasis, a
link, an image, HTML, a hidden comment, an @mention or an issue cross-reference.

* :func:`code_span` — text as inline code; :func:`named` — "optimizer `opt`" in a rule message.
* :func:`literal` — text as literal prose (whatever could become markup escaped).
* :func:`message` — a rule message: prose whose code is marked with backticks, as rules write it.
* :func:`table_cell` — an inline Markdown fragment made safe for one cell of a GFM table.
* :func:`code_block` — text (exception output, configuration) as a fenced code block.
* :func:`redact_urls` — drop credentials and query strings from URLs before text is shown.

Rules build their messages with :func:`code_span` (so quoted code that contains backticks stays
one span); this module lives in ``analyzers`` so they can, and the bot imports it from here.
"""
from __future__ import annotations

import re

# A zero-width space breaks what GitHub would otherwise link or ping, without changing what
# readers see: around "@" (mentions, e-mail autolinks), after "#" (issue references), inside "//"
# and "www." (URL autolinks).
BREAK = "\u200b"

_BACKTICK_RUN = re.compile(r"`+")
# Characters that start inline markup anywhere: escapes, code, emphasis, strikethrough, links and
# images, HTML and autolinks, entities, table pipes, GitHub math. "@" and "#" get a BREAK instead.
_INLINE = re.compile(r"[\\`*_~\[\]<>&|$@#]")
# What starts a block at the beginning of a line: list items, setext underlines, ordered lists.
_LINE_START = re.compile(r"^([-+=])|^(\d{1,9})([.)])")
# GitHub autolinks "scheme://..." and "www." without any markup; a BREAK inside stops that.
_AUTOLINK = re.compile(r"/(?=/)|\bwww(?=\.)", re.IGNORECASE)
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}  # entities keep "<!--" out of the raw body
# A URL ends before trailing punctuation, as in "failed for url: https://host/x?token=y."
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,:;!?)\]]")
_GH_REFERENCE = re.compile(r"\b(GH-)(?=\d)", re.IGNORECASE)  # GitHub links "GH-12" like "#12"


def code_span(text: str) -> str:
    """``text`` as inline code; GitHub shows exactly these characters (line breaks as spaces).

    The fence is one backtick longer than the longest run inside, and a space pads content that
    starts or ends with a backtick or a space (CommonMark strips one space on each side).
    """
    text = re.sub(r"\r\n?|\n", " ", str(text))
    if not text:
        return ""
    fence = "`" * (longest_backtick_run(text) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def named(noun: str, code: str) -> str:
    """``noun `code` `` in a rule message, or just `` `code` `` when the code already says the noun:
    "optimizer `opt`" but "`optimizer`", never "optimizer `optimizer`"."""
    if noun.lower().replace(" ", "") in code.lower().replace("_", ""):
        return code_span(code)
    return f"{noun} {code_span(code)}"


def literal(text: str) -> str:
    """``text`` as literal inline Markdown, on one line (runs of whitespace become one space).

    Only what could become markup is escaped, so the raw text stays readable.
    """
    return _at_line_start(_escaped(str(text)).strip())


def _escaped(text: str) -> str:
    flat = re.sub(r"[ \t\r\n\f\v]+", " ", text)  # ASCII whitespace only: a no-break space is content
    flat = _AUTOLINK.sub(lambda m: m.group(0) + BREAK, flat)
    flat = _GH_REFERENCE.sub(r"\1" + BREAK, flat)
    return _INLINE.sub(_escape_char, flat)


def _escape_char(match: re.Match) -> str:
    char = match.group(0)
    if char in _ENTITIES:
        return _ENTITIES[char]
    if char == "@":
        return BREAK + char + BREAK
    if char == "#":
        return char + BREAK
    return "\\" + char


def _at_line_start(markdown: str) -> str:
    """Escape what would start a list or a heading underline when the text begins a line."""
    return _LINE_START.sub(lambda m: f"\\{m.group(1)}" if m.group(1) else f"{m.group(2)}\\{m.group(3)}", markdown)


def message(text: str) -> str:
    """A rule message (prose with code between backticks, CommonMark style) as safe Markdown.

    The code spans stay code; everything else is literal, so ``__init__`` or ``*_like`` outside
    backticks is not emphasis and nothing in the message can become a link, HTML or a mention.
    A backtick run with no closing run of the same length is a literal backtick.
    """
    rendered = "".join(code_span(chunk) if is_code else _escaped(chunk) for is_code, chunk in split_code(str(text)))
    return _at_line_start(rendered.strip())


def split_code(text: str) -> list[tuple[bool, str]]:
    """``text`` as (is_code, chunk) pieces, code spans found as CommonMark finds them."""
    pieces: list[tuple[bool, str]] = []
    plain_start = 0
    position = 0
    while True:
        opening = _BACKTICK_RUN.search(text, position)
        if opening is None:
            break
        closing = _closing_run(text, opening.end(), len(opening.group(0)))
        if closing is None:
            position = opening.end()  # no closer: these backticks are literal text
            continue
        if opening.start() > plain_start:
            pieces.append((False, text[plain_start:opening.start()]))
        pieces.append((True, _code_content(text[opening.end():closing.start()])))
        plain_start = position = closing.end()
    if plain_start < len(text):
        pieces.append((False, text[plain_start:]))
    return pieces


def _closing_run(text: str, start: int, length: int):
    for run in _BACKTICK_RUN.finditer(text, start):
        if len(run.group(0)) == length:
            return run
    return None


def _code_content(raw: str) -> str:
    content = re.sub(r"\r\n?|\n", " ", raw)
    if len(content) >= 2 and content[0] == " " and content[-1] == " " and content.strip(" "):
        content = content[1:-1]
    return content


def table_cell(markdown: str) -> str:
    """An inline Markdown fragment (built with the functions above) as one GFM table cell.

    Pipes split cells even inside code spans, so every pipe is escaped; GFM removes that
    backslash before parsing the cell, inside code too.
    """
    return " ".join(markdown.splitlines()).replace("|", "\\|")


def code_block(text: str, info: str = "") -> str:
    """``text`` as a fenced code block whose fence no line of ``text`` can close."""
    body = str(text).rstrip("\n")
    fence = "`" * max(3, longest_backtick_run(body) + 1)
    return f"{fence}{info}\n{body}\n{fence}"


def longest_backtick_run(text: str) -> int:
    return max((len(run) for run in _BACKTICK_RUN.findall(text)), default=0)


def redact_urls(text: str) -> str:
    """``text`` with each URL's credentials, query string and fragment removed.

    Errors from fetching a repository quote signed URLs (``codeload...tar.gz?token=...``,
    ``https://x-access-token:...@github.com``); those tokens must never be posted.
    """
    return _URL.sub(_redact_url, str(text))


def _redact_url(match: re.Match) -> str:
    url = match.group(0)
    scheme, _, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    host = host.rpartition("@")[2]
    path = re.split(r"[?#]", path, maxsplit=1)[0]
    return f"{scheme}://{host.split('?')[0].split('#')[0]}{slash}{path}"
