"""analyzers.markdown, checked through a real CommonMark/GFM renderer: PR text renders as exactly
its characters, and never as a link, an image, HTML, a comment or a mention."""
from __future__ import annotations

import pytest

from analyzers.markdown import code_block, code_span, literal, message, named, redact_urls, split_code, table_cell
from tests.markdown_render import render, table_cells

HOSTILE = [
    "`",
    "``a`b```",
    "` leading and trailing `",
    "<img src=x onerror=alert(1)>",
    "[x](//evil.example)",
    "![x](https://evil.example/pixel.png)",
    "ping @octocat and @org/team",
    "mail me at someone@example.com",
    "<!-- torchreview:fingerprint=00 rule=TR101 -->",
    "__init__ and self.__dict__",
    "*_like / x.new_*",
    "**bold** _it_ ~~gone~~",
    "see https://evil.example/x?y=1 and www.evil.example and file:///etc",
    "<https://evil.example>",
    "fixes #12 and GH-3",
    "a | b || c",
    "back\\slash \\` and \\*",
    "# heading-looking",
    "1. list-looking",
    "- item-looking",
    "+ item-looking",
    "2) list-looking",
    "= underline-looking",
    "> quote-looking",
    "costs $x$ and $$y$$",
    "&amp; &lt;b&gt; &#64;",
    "[ref]: https://evil.example",
    "line one\nline two",
    "x\u00a0y",  # a no-break space is content
]


def assert_inert(rendered) -> None:
    assert not rendered.unsafe_tags, rendered.html
    assert not rendered.comments, rendered.html
    assert not rendered.mentions, rendered.html
    assert not rendered.issue_refs, rendered.html
    assert not rendered.autolinks, rendered.html


@pytest.mark.parametrize("text", HOSTILE)
def test_literal_renders_the_text_exactly_and_nothing_else(text):
    rendered = render(literal(text))
    assert rendered.text == " ".join(text.split("\n")).strip()
    assert set(rendered.tags) <= {"p"}, rendered.html
    assert_inert(rendered)


@pytest.mark.parametrize("text", HOSTILE)
def test_code_span_renders_the_text_exactly_as_code(text):
    rendered = render(f"see {code_span(text)} here")
    assert rendered.code == [text.replace("\n", " ")]
    assert set(rendered.tags) == {"p", "code"}, rendered.html
    assert not rendered.unsafe_tags


@pytest.mark.parametrize("text", HOSTILE)
def test_table_cells_keep_literal_and_code_text(text):
    row = f"| {table_cell(literal(text))} | {table_cell(code_span(text))} | {table_cell(message(text))} |"
    markdown = "| a | b | c |\n|---|---|---|\n" + row
    one_line = " ".join(text.split("\n"))
    assert table_cells(markdown) == [[" ".join(one_line.split(" ")).strip(), one_line.strip(),
                                      "".join(chunk for _, chunk in split_code(one_line)).strip()]]
    assert_inert(render(markdown))


@pytest.mark.parametrize("text, code", [
    ("`Net.__init__` never calls `super().__init__()`: fix __init__", ["Net.__init__", "super().__init__()"]),
    ("use `torch.zeros_like` or *_like / x.new_* helpers", ["torch.zeros_like"]),
    ("defaults to the mutable `` {'a': '`'} ``: shared", ["{'a': '`'}"]),
    ("an unclosed ` backtick and @someone", []),
    ("`<img src=x>` is code, <img src=x> is text", ["<img src=x>"]),
])
def test_message_keeps_code_spans_and_escapes_the_rest(text, code):
    rendered = render(message(text))
    assert rendered.code == code
    expected = "".join(chunk for _, chunk in split_code(text))
    assert rendered.text == expected
    assert set(rendered.tags) <= {"p", "code"}, rendered.html
    assert_inert(rendered)


def test_a_message_with_code_quoting_backticks_round_trips():
    quoted = "x = '``'"
    text = f"parameter `x` defaults to {code_span(quoted)}: shared"
    assert render(message(text)).code == ["x", quoted]


@pytest.mark.parametrize("text", ["plain", "``` inside", "````\n```\n", "ends with `"])
def test_code_block_cannot_be_closed_by_its_content(text):
    rendered = render(code_block(text, "text"))
    assert rendered.code == [text.rstrip("\n") + "\n"]
    # the block ends where it should: what follows it is markup again
    assert "img" in render(code_block(text, "text") + "\n\n<img src=x>").tags


def test_hostile_html_is_visible_to_the_renderer():
    # The harness must be able to fail: unescaped, these inputs do become markup.
    assert "img" in render("<img src=x>").tags
    assert "a" in render("[x](//evil)").tags
    assert "a" in render("see https://evil.example").tags
    assert render("see www.evil.example").autolinks
    assert render("<!-- hidden -->").comments == [" hidden "]
    assert render("hi @octocat").mentions
    assert "strong" in render("__init__").tags


@pytest.mark.parametrize("text, expected", [
    ("404 Client Error: Not Found for url: https://codeload.github.com/o/r/legacy.tar.gz/abc?token=SECRET",
     "404 Client Error: Not Found for url: https://codeload.github.com/o/r/legacy.tar.gz/abc"),
    ("clone https://x-access-token:ghs_SECRET@github.com/o/r.git failed",
     "clone https://github.com/o/r.git failed"),
    ("GET https://api.github.com/repos/o/r?page=2#frag: 500", "GET https://api.github.com/repos/o/r: 500"),
    ("no url here", "no url here"),
])
def test_redact_urls_drops_credentials_queries_and_fragments(text, expected):
    assert redact_urls(text) == expected


@pytest.mark.parametrize("noun, code, expected", [
    ("optimizer", "opt", "optimizer `opt`"),
    ("optimizer", "optimizer", "`optimizer`"),
    ("optimizer", "self.optimizer_g", "`self.optimizer_g`"),
    ("DataLoader", "DataLoader(train_ds)", "`DataLoader(train_ds)`"),
    ("DataLoader", "train_data_loader", "`train_data_loader`"),
    ("tensor", "loss", "tensor `loss`"),
])
def test_named_does_not_say_the_noun_twice(noun, code, expected):
    assert named(noun, code) == expected
