"""Render Markdown as GitHub would (CommonMark + GFM tables, strikethrough and autolinks) and read
back what a reader sees, for the tests of what the App posts."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from markdown_it import MarkdownIt

from analyzers.markdown import BREAK

# Elements plain text, code and our own tables may produce; anything else (a, img, raw HTML) means
# PR text became markup.
SAFE_TAGS = {"p", "code", "pre", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "br"}
# What GitHub turns into a ping or a cross-reference when it follows a non-word character.
MENTION = re.compile(r"(?:^|[^\w`])@[A-Za-z0-9]")
ISSUE_REF = re.compile(r"(?:^|[^\w&])#\d|\bGH-\d", re.IGNORECASE)
# GFM's extended autolinks (www. and scheme://) in plain text; stricter than GitHub, never laxer.
AUTOLINK = re.compile(r"www\.|://", re.IGNORECASE)

_renderer = MarkdownIt("commonmark", {"linkify": True, "html": True}).enable(["table", "strikethrough", "linkify"])
# linkify-it's fuzzy mode links "model.py" (a TLD), which GitHub does not; AUTOLINK covers www.
_renderer.linkify.set({"fuzzy_link": False})


@dataclass
class Rendered:
    html: str
    tags: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    text: str = ""  # what a reader sees, zero-width breaks removed
    prose: str = ""  # text outside code, breaks kept: GitHub links and pings only there
    code: list[str] = field(default_factory=list)  # the text of each <code> element

    @property
    def unsafe_tags(self) -> set[str]:
        return set(self.tags) - SAFE_TAGS

    @property
    def mentions(self) -> list[str]:
        return MENTION.findall(self.prose)

    @property
    def autolinks(self) -> list[str]:
        return AUTOLINK.findall(self.prose)

    @property
    def issue_refs(self) -> list[str]:
        return ISSUE_REF.findall(self.prose)


class _Reader(HTMLParser):
    def __init__(self, out: Rendered) -> None:
        super().__init__(convert_charrefs=True)
        self.out = out
        self.parts: list[str] = []
        self.prose_parts: list[str] = []
        self.code_depth = 0
        self.code_parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.out.tags.append(tag)
        if tag == "code":
            self.code_depth += 1
            self.code_parts = []

    def handle_endtag(self, tag):
        if tag == "code":
            self.code_depth -= 1
            self.out.code.append("".join(self.code_parts))

    def handle_data(self, data):
        self.parts.append(data)
        if self.code_depth:
            self.code_parts.append(data)
        else:
            self.prose_parts.append(data)

    def handle_comment(self, data):
        self.out.comments.append(data)


def render(markdown: str) -> Rendered:
    html = _renderer.render(markdown)
    out = Rendered(html)
    reader = _Reader(out)
    reader.feed(html)
    reader.close()
    out.prose = "".join(reader.prose_parts)
    out.text = "".join(reader.parts).strip().replace(BREAK, "")
    out.code = [c.replace(BREAK, "") for c in out.code]
    return out


def table_cells(markdown: str) -> list[list[str]]:
    """The text of each body row's cells of the first table."""
    html = _renderer.render(markdown)
    rows: list[list[str]] = []

    class Cells(HTMLParser):
        in_body = False
        cell: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "tbody":
                self.in_body = True
            elif tag == "tr" and self.in_body:
                rows.append([])
            elif tag == "td":
                self.cell = []

        def handle_endtag(self, tag):
            if tag == "td" and self.cell is not None:
                rows[-1].append("".join(self.cell).replace(BREAK, "").strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    Cells(convert_charrefs=True).feed(html)
    return rows
