"""The engine's contract: name resolution, ML gating, suppressions, bad input, notebooks, fixes."""
from __future__ import annotations

import json
import re
import textwrap

import libcst as cst
import pytest

from analyzers.config import Config
from analyzers.context import FileContext
from analyzers.engine import analyze_file, analyze_paths, analyze_source, analyze_text, MAX_FILE_BYTES
from analyzers.rules import get_rule
from analyzers.rules.base import Rule

# the whole catalog at each rule's own severity: these tests are about the engine, and use preview rules as subjects
EVERY_RULE = Config(preview=True, measured_severities=False)

UNSAFE = get_rule("TR601")


def findings(code: str, **kwargs):
    kwargs.setdefault("config", EVERY_RULE)
    return analyze_source(textwrap.dedent(code), "t.py", **kwargs).findings


@pytest.mark.parametrize("imports,call", [
    ("import torch", "torch.nn.functional.softmax"),
    ("import torch as th", "th.nn.functional.softmax"),
    ("from torch import nn", "nn.functional.softmax"),
    ("import torch.nn.functional as F", "F.softmax"),
    ("from torch.nn import functional as F", "F.softmax"),
    ("from torch.nn.functional import softmax", "softmax"),
    ("from torch.nn.functional import softmax as sm", "sm"),
    ("import torch.nn.functional", "torch.nn.functional.softmax"),
    ("import torch\nF = torch.nn.functional", "F.softmax"),
    ("try:\n    import torch.nn.functional as F\nexcept ImportError:\n    F = None", "F.softmax"),
])
def test_qualified_names_through_every_import_form(imports, call):
    module = cst.parse_module(f"{imports}\n{call}(x)\n")
    seen = []

    class Probe(Rule):
        def visit_Call(self, node, ctx):
            seen.append(ctx.call_name(node))

    ctx_holder = []
    from analyzers.engine import _Walker

    ctx = FileContext("t.py", "", module)
    walker = _Walker(ctx, [Probe(ctx)], lambda r, e: (_ for _ in ()).throw(e))
    walker.walk(module)
    assert "torch.nn.functional.softmax" in seen
    del ctx_holder


def test_dataloader_alias_resolves():
    module = cst.parse_module("from torch.utils.data import DataLoader as DL\n")
    ctx = FileContext("t.py", "", module)
    assert ctx.imports.resolve("DL") == "torch.utils.data.DataLoader"


def test_file_without_torch_gets_no_torch_findings():
    assert findings("import pickle\nstate = load('x')\n") == []
    # mentions torch only in a comment/string: parsed, but no torch import -> no torch rules
    assert findings("# torch.load('x')\ndef load(p):\n    return p\nx = torch.load('m.pt')\n") == []


def test_suppression_forms():
    code = "import torch\n"
    assert len(findings(code + "a = torch.load('a')\n")) == 1
    assert findings(code + "a = torch.load('a')  # torchreview: ignore[TR601]\n") == []
    assert findings(code + "a = torch.load('a')  # torchreview: ignore\n") == []
    assert findings(code + "a = torch.load('a')  # noqa: TR601\n") == []
    assert findings(code + "a = torch.load('a')  # noqa: TR601, TR101\n") == []
    # suppressing another rule, or another linter's code, does not hide this one
    assert len(findings(code + "a = torch.load('a')  # torchreview: ignore[TR101]\n")) == 1
    assert len(findings(code + "a = torch.load('a')  # noqa: E501\n")) == 1
    assert findings("# torchreview: skip-file\n" + code + "a = torch.load('a')\n") == []


def test_multiline_call_suppressed_on_last_line():
    code = "import torch\na = torch.load(\n    'a',\n)  # torchreview: ignore[TR601]\n"
    assert findings(code) == []


def test_finding_has_position_and_fix():
    (f,) = findings("import torch\n\nstate = torch.load(path)\n")
    assert (f.line, f.column, f.end_line) == (3, 9, 3)
    assert f.fix is not None and f.fix.replacement == "state = torch.load(path, weights_only=True)\n"
    assert f.to_dict()["severity"] in {"high", "critical"}


def test_syntax_error_is_reported_not_raised():
    result = analyze_source("import torch\ndef broken(:\n    pass\n", "bad.py")
    assert result.findings == []
    assert [e.kind for e in result.errors] == ["syntax-error"]
    # where Python says it is (libcst would say line 3, where the parser noticed)
    assert result.errors[0].message == "line 2, column 12: invalid syntax"


def test_syntax_error_in_a_notebook_cell_is_on_its_line():
    nb = _notebook(("code", "import torch"), ("code", "x = 1\ndef f(:\n    pass"))
    [error] = analyze_text(nb, "nb.ipynb", EVERY_RULE).errors
    assert error.kind == "syntax-error" and error.message == "cell 2, line 2, column 7: invalid syntax"


def test_coding_cookie_is_honoured(tmp_path):
    source = "# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nm = torch.load('m.pt')\n"
    (tmp_path / "latin.py").write_bytes(source.encode("latin-1"))
    (tmp_path / "unknown.py").write_bytes(b"# coding: no-such-codec\nimport torch\n")
    (tmp_path / "lying.py").write_bytes("# coding: ascii\nimport torch\n# caf\xe9\n".encode("utf-8"))
    run = analyze_paths([str(tmp_path)], EVERY_RULE, jobs=1)
    assert [(f.path.rsplit("/", 1)[-1], f.rule, f.line) for f in run.findings] == [("latin.py", "TR601", 4)]
    errors = {e.path.rsplit("/", 1)[-1]: (e.kind, e.message) for e in run.errors}
    # a codec we lack (one a package registers at import time): read as UTF-8, with a note (tests/test_review_noise.py)
    assert errors["unknown.py"][0] == "unknown-codec" and "no-such-codec" in errors["unknown.py"][1]
    assert errors["lying.py"] == ("decode-error", "not valid ascii at byte 34: ordinal not in range(128)")


def test_binary_non_utf8_and_huge_files(tmp_path):
    (tmp_path / "bin.py").write_bytes(b"import torch\x00\x01\x02")
    (tmp_path / "latin.py").write_bytes("import torch\n# caf\xe9\n".encode("latin-1"))
    (tmp_path / "huge.py").write_text("import torch\n" + "x = 1\n" * (MAX_FILE_BYTES // 6 + 10))
    (tmp_path / "good.py").write_text("import torch\nm = torch.load('m.pt')\n")
    run = analyze_paths([str(tmp_path)], EVERY_RULE, jobs=1)
    kinds = {e.path.rsplit("/", 1)[-1]: e.kind for e in run.errors}
    assert kinds == {"bin.py": "binary-file", "latin.py": "decode-error", "huge.py": "too-large"}
    assert [f.rule for f in run.findings] == ["TR601"]
    assert run.files == 4


def test_rule_crash_becomes_error_and_other_rules_continue(monkeypatch):
    class Exploding(Rule):
        def visit_Call(self, node, ctx):
            raise ValueError("boom")

    Exploding.id, Exploding.slug = "TR000", "exploding"
    result = analyze_source("import torch\nx = torch.load('a')\n", "t.py", rules=[Exploding, UNSAFE])
    assert [f.rule for f in result.findings] == ["TR601"]
    assert result.errors[0].kind == "rule-error" and "boom" in result.errors[0].message


def test_parallel_run_matches_serial(tmp_path):
    for i in range(12):
        (tmp_path / f"m{i}.py").write_text(f"import torch\nx{i} = torch.load('a{i}')\n")
    serial = analyze_paths([str(tmp_path)], EVERY_RULE, jobs=1)
    parallel = analyze_paths([str(tmp_path)], EVERY_RULE, jobs=2)
    assert [f.to_dict() for f in serial.findings] == [f.to_dict() for f in parallel.findings]
    assert len(serial.findings) == 12


def _notebook(*cells):
    return json.dumps({"cells": [{"cell_type": kind, "source": src, "metadata": {}, "outputs": []}
                                 for kind, src in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_notebook_cells_and_lines():
    nb = _notebook(
        ("markdown", "# Title"),
        ("code", "import torch\n%matplotlib inline\n!pip install x"),
        ("code", ["x = 1\n", "state = torch.load('m.pt')\n"]),
    )
    result = analyze_text(nb, "nb.ipynb", EVERY_RULE)
    (f,) = result.findings
    assert (f.cell, f.line) == (3, 2)
    assert f.to_dict()["cell"] == 3
    assert f.fix is not None and f.fix.start_line == 2


def test_notebook_with_broken_cell_still_analyzes_others():
    nb = _notebook(("code", "import torch\nstate = torch.load('m.pt')"), ("code", "def broken(:"))
    result = analyze_text(nb, "nb.ipynb", EVERY_RULE)
    assert [(f.cell, f.line) for f in result.findings] == [(1, 2)]
    assert any(e.kind == "syntax-error" and "cell 2" in e.message for e in result.errors)


def test_notebook_not_json():
    result = analyze_text("{not json", "nb.ipynb", EVERY_RULE)
    assert result.errors[0].kind == "notebook-error"


def test_min_severity_and_severity_override():
    code = "import torch\nx = torch.load('a')\n"
    assert findings(code, config=Config(preview=True, measured_severities=False,
                                         min_severity=__import__("analyzers.model").model.Severity.CRITICAL)) == []
    cfg = Config.from_mapping({"severity": {"TR601": "low"}, "preview": True})
    (f,) = findings(code, config=cfg)
    assert f.severity.label == "low"


def test_analyze_file_missing(tmp_path):
    result = analyze_file(tmp_path / "missing.py")
    assert result.errors[0].kind == "read-error"


_POSITION_CASES = {
    "class with methods": "import torch\n\n\nclass A:\n    x = 1; y = 2\n\n    # a comment\n    @staticmethod\n"
                          "    def f(a,\n          b):\n        return torch.zeros(a,\n   b)\n\n    async def g(self):\n"
                          "        if x:\n            pass\n",
    "decorators and comments": "# header\n\n@deco(1,\n      2)\n# between\n@other\ndef f():\n    '''doc\n  x'''\n"
                               "    return 1\n\n\na = 1; b = f(\n    a)\n",
    "crlf and form feed": "import torch\r\n\x0c\r\nclass A:\r\n    def f(self):\r\n        return torch.ones(1)\r\n",
    "tabs and one-line bodies": "class A:\n\tdef f(self): return 1\n\tdef g(self):\n\t\treturn [1,\n  2]\nif True: x = 1\n",
    "continuation": "import os\ndef f(x):\n    y = x + \\\n        1\n    return (y,\n y)\n",
    "blocks in blocks": "import torch\nfor epoch in range(3):\n    # a comment\n    with torch.no_grad():\n"
                        "        while x:\n            if y: z = 1\n            elif w:\n                z = (2 +\n  3)\n"
                        "            else:\n\n                z = 3\n        try:\n            a = f(b)\n"
                        "        except ValueError:\n            a = 0\n        else:\n            a += 1\n"
                        "        finally:\n            pass\n    for i in x: s = i\nelse:\n    done = 1\n"
                        "async def g():\n    async for a in b:\n        async with c as d:\n"
                        "            await d.run(a)\n",
}


@pytest.mark.parametrize("source", list(_POSITION_CASES.values()), ids=list(_POSITION_CASES))
def test_positions_of_some_statements_agree_with_a_full_pass(source):
    """Positions come from generating only the statements that hold the wanted nodes; every node of
    every shape of file must land where one pass over the whole module puts it."""
    from analyzers.context import _positions_by_statement, compute_positions
    from analyzers.engine import _Walker

    module = cst.parse_module(source)
    ctx = FileContext("x.py", source, module)
    _Walker(ctx, [], lambda *a: None).walk(module)
    nodes, todo = [], [module]
    while todo:  # every node the walk saw (the parent map is keyed by id)
        node = todo.pop()
        nodes += [node] if id(node) in ctx.parents else []
        todo.extend(node.children)
    full = compute_positions(module, set(nodes))
    for node in nodes:  # one at a time: each picks its own innermost statement, with no fallback to a full pass
        assert _positions_by_statement(module, {node}, ctx.parents, source) == {node: full[node]}, type(node).__name__


def test_parsing_skips_node_validation_only_while_it_parses():
    import libcst as cst
    import pytest
    from libcst._nodes.base import CSTNode

    from analyzers.engine import parse_module

    validate = CSTNode.__post_init__
    module = parse_module("import torch\nx = torch.ones(2)\n")
    assert module.code == "import torch\nx = torch.ones(2)\n"
    with pytest.raises(cst.ParserSyntaxError):
        parse_module("def broken(:\n")
    assert CSTNode.__post_init__ is validate  # restored, after a success and after a syntax error
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")  # nodes built afterwards (rules' fixes) are validated again


def test_overlapping_parses_in_threads_restore_validation_once():
    import threading

    from libcst._nodes.base import CSTNode

    from analyzers.engine import parse_module

    validate = CSTNode.__post_init__
    source = "import torch\n" + "".join(f"y{i} = torch.zeros({i})\n" for i in range(400))
    errors: list[BaseException] = []

    def parse_many() -> None:
        try:
            for _ in range(5):
                assert parse_module(source).code == source
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=parse_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert CSTNode.__post_init__ is validate


# Every kind of statement and expression, including the rarer syntax (match, type parameters, except*,
# walrus, decorators, f-strings, star targets): what ``all_children`` must answer like libcst for.
_EVERY_SHAPE = '''\
# a header comment
from __future__ import annotations
import os.path as osp, sys
from . import sibling
from ..pkg import (a as b, c,)
from x import *

type Alias[T: int, *Ts, **P] = list[T]


@decorator(1, key=2)
class C[T](Base, metaclass=Meta):
    x: int = 1

    async def f[U](self, a, /, b=2, *args, c: int = 3, **kwargs) -> U:
        global g
        async with ctx() as (p, q), other():
            async for i in aiter():
                await something(i)
        y = [v for v in range(3) if v if not v]
        z = {k: v for k, v in d.items()}
        s = {v for v in w}
        gen = (v async for v in w)
        lam = lambda p, *q, r=1, **s: p
        t = a if b else c
        u = -a + ~b - (not c) * d @ e // f % g ** h << i >> j & k | l ^ m
        v = a < b <= c > d >= e == f != g in h not in i is j is not k
        w = a and b or c
        x += 1; x -= 1; x *= 2; x /= 2; x //= 2; x %= 2; x **= 2; x <<= 1; x >>= 1; x &= 1; x |= 1; x ^= 1; x @= m
        del x[0], y.z
        print(f"{a!r:>{width}} {b=}", rb"raw" b"concat", 1j, 1.5, ..., *args, **kwargs)
        if (n := len(y)) > 1:
            pass
        elif n:
            return
        else:
            raise ValueError("x") from None
        while True:
            break
        else:
            continue
        try:
            pass
        except* (TypeError, ValueError) as e:
            pass
        try:
            yield from y
        except Exception:
            yield
        else:
            assert x, "message"
        finally:
            nonlocal_thing = 1
        match command:
            case [1, 2, *rest]:
                pass
            case {"k": v, **others}:
                pass
            case Point(x=0, y=yy) | None as p if p:
                pass
            case (1 | 2, "s", True):
                pass
            case _:
                pass
        return a[1:2:3, ::, b]


if __name__ == "__main__": main()
'''


def test_all_children_are_libcsts_children():
    """``all_children`` reads the fields libcst's ``children`` visits, without its visitor: the same nodes, the
    same order, for every node of every shape of code (whitespace and punctuation included)."""
    from analyzers.context import all_children

    todo = [cst.parse_module(_EVERY_SHAPE)]
    shapes = set()
    while todo:
        node = todo.pop()
        shapes.add(type(node))
        expected = list(node.children)
        got = all_children(node)
        assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected)), type(node).__name__
        todo.extend(expected)
    assert {cst.Match, cst.TypeAlias, cst.TryStar, cst.MatchOr, cst.ParamSlash} <= shapes  # the rare ones came up


def test_rule_source_hints_are_searched_once_per_file(monkeypatch):
    """Rules share hint patterns: each distinct one is searched once per file, and a rule runs exactly when its
    own ``may_report_on`` says it may report."""
    from analyzers.hints import SourceHints
    from analyzers.rules import all_rules

    source = "import torch\nloss.backward()\nopt.step()\nloader = DataLoader(ds)\n"
    hints = SourceHints(source)
    for rule in all_rules():
        assert hints.admit(rule) == rule.may_report_on(source), rule.id
    patterns = set()
    for rule in all_rules():
        hint = rule.source_hint
        patterns |= set(hint if isinstance(hint, tuple) else (hint,)) - {None}
    assert set(hints.found) <= patterns and len(hints.found) < sum(
        len(r.source_hint) if isinstance(r.source_hint, tuple) else r.source_hint is not None for r in all_rules())


def test_enabled_rules_follow_the_configuration():
    from analyzers.engine import _enabled_rules
    from analyzers.rules import all_rules

    for config in (Config(), Config(preview=True), Config(select=("TR1",)), Config(preview=True, ignore=("TR101",)),
                   Config()):
        assert _enabled_rules(config) == config.enabled_rules(all_rules())


@pytest.mark.parametrize("pattern,literals", [
    (r"\.step\s*\(", (".step",)),
    (r"synchronize\s*\(|all_reduce|\breduce\s*\(", ("synchronize", "all_reduce", "reduce")),
    (r"DistributedDataParallel|DDP", ("DistributedDataParallel", "DDP")),  # re factors out the "D"; read back whole
    (r"D(?:istributed|DP)\s", ("Distributed", "DDP")),  # every match starts with one
    (r"\.eval\s*\(|\.train\s*\(", (".eval", ".train")),
    (r"\bload\b", ("load",)),
    (r"(?i)resume|restore", None),  # case-insensitive: no literal is necessary
    (r"x(?i:abc)", ("x",)),
    (r"[*/]", ("*", "/")),
    (r"\blog\b|\bexp\b|[0-9]+", None),  # one branch without a literal: nothing is necessary
    (r"a+bc?d", ("b",)),
])
def test_necessary_literals_of_a_hint(pattern, literals):
    from analyzers.hints import necessary_literals

    assert necessary_literals(re.compile(pattern)) == literals


def test_hint_literals_never_refuse_a_text_the_regex_matches():
    """The literal test may only skip searches that cannot match: for every rule's hint and every text that
    matches it, one of its literals is in the text."""
    from analyzers.hints import SourceHints, necessary_literals
    from analyzers.rules import all_rules

    texts = [code for rule in all_rules() for example in (*rule.VALID, *rule.INVALID)
             for code in [getattr(example, "code", example)] if isinstance(code, str)]
    assert len(texts) > 100
    for rule in all_rules():
        hint = rule.source_hint
        for pattern in (hint if isinstance(hint, tuple) else (hint,)) if hint is not None else ():
            literals = necessary_literals(pattern)
            for text in texts:
                if pattern.search(text):
                    assert literals is None or any(literal in text for literal in literals), (pattern, text)
        for text in texts:
            assert SourceHints(text).admit(rule) == rule.may_report_on(text), rule.id


@pytest.mark.parametrize("pattern", [r"\bload\b", r"\blog\b|\bexp\b", r"load\s*\(", r"^import", r"(?m)^import",
                                     r"synchronize\s*\(|all_reduce|\breduce\s*\(", r"ross_?[Ee]ntropy|nll_loss",
                                     r"aim\b|wandb", r"\.(?:to|cuda)\s*\(", r"[\"']cpu[\"']", r"\.\w+\.parameters\(\)"])
def test_hint_search_answers_like_the_regex(pattern):
    """Whichever way a pattern is searched (words, prefixes tried in place, a literal first), the answer is the
    regex's: on texts where it matches at the start, the end, after a near miss, and nowhere."""
    from analyzers.hints import search

    compiled = re.compile(pattern)
    texts = ["", "load", "xload(", "a.load (x)", "logging.exp(1)\nexpand log", "upload\nloaded\nload",
             "import x", "x\nimport y", "all_reduce", "dist.reduce (t)", "foreduce(", "CrossEntropy", "cross_entropy",
             "maim aim", "aimless", "x.to(d)", "x.total(", "x.cuda  (", "'cpu'", '"cpu\'', "cpu", "m.fc.parameters()",
             "m.parameters()", "nll_los", "nll_loss"]
    for text in texts + [a + " " + b for a in texts for b in texts[:6]]:
        assert search(compiled, text) == (compiled.search(text) is not None), (pattern, text)


@pytest.mark.parametrize("pattern,words", [
    (r"backward", ("backward",)),
    (r"DistributedDataParallel|DDP", ("DistributedDataParallel", "DDP")),
    (r"numpy|np\.", ("numpy", "np.")),
    (r"a(?:b|c)d", ("abd", "acd")),
    (r"\bload\b", None),  # a word boundary: not a plain substring
    (r"load\s*\(", None),
    (r"(?i)resume", None),
    (r"x(?i:abc)", None),
])
def test_exact_literals_of_a_hint(pattern, words):
    from analyzers.hints import exact_literals

    assert exact_literals(re.compile(pattern)) == words


def test_an_analyzed_files_tree_is_freed_without_the_garbage_collector(monkeypatch):
    """Once a file is analyzed its context's facts and its rules' state are dropped, so the syntax tree is freed by
    reference counting as the analysis returns (no cycle through it waits for a collection)."""
    import gc
    import sys

    from analyzers import engine

    trees = []
    parse = engine.parse_module
    monkeypatch.setattr(engine, "parse_module", lambda source: trees.append(parse(source)) or trees[-1])
    code = textwrap.dedent("""
        import torch
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            opt.step()
        torch.save(model, "m.pt")
        model.load_state_dict(torch.load("m.pt"))
    """)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = analyze_source(code, "train.py", config=EVERY_RULE)
        assert result.findings
        holders = sys.getrefcount(trees[0])  # outside the assert: pytest's rewriting keeps a reference of its own
        assert holders == 2  # this list's reference and the argument's: nothing else holds the tree
    finally:
        if was_enabled:
            gc.enable()


def test_every_rule_hint_is_read_when_the_rules_load_not_by_the_first_file_that_asks():
    from analyzers import hints
    from analyzers.rules import all_rules

    patterns = [p for rule in all_rules() for p in (rule.source_hint if isinstance(rule.source_hint, tuple)
                                                    else (rule.source_hint,)) if p is not None]
    assert patterns and all(p in hints._LITERALS for p in patterns)
