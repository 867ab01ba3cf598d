"""Work the engine and the program model do once per file, whoever asks: the file's ``ast`` (its finding positions and
its repository summary both read it), the parent map of its code nodes (the engine's walk and ``ModuleNodes``)."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst

from analyzers import context
from analyzers.config import Config
from analyzers.context import FileContext, forget_ast, keep_ast, parse_ast
from analyzers.engine import _Walker, analyze_file, parse_module
from analyzers.program import modules
from analyzers.program.flow import ModuleNodes

SOURCE = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Dropout(0.5), nn.Linear(4, 2))

        def forward(self, x):
            return self.layers(x)


    def evaluate(loader):
        model = Head()
        with torch.no_grad():
            outputs = [model(x) for x, _ in loader]
        return outputs, torch.load("head.pt")
""")


def test_parse_ast_keeps_the_tree_of_the_analyzed_text_alone():
    forget_ast()
    assert parse_ast(SOURCE) is not parse_ast(SOURCE)  # nothing kept outside an analysis
    keep_ast(SOURCE)
    tree = parse_ast(SOURCE)
    assert parse_ast("x = 1\n") is not parse_ast("x = 1\n")  # another file's text, read in between: not kept
    assert parse_ast(SOURCE) is tree
    assert parse_ast("".join(SOURCE)) is tree  # equal text, another string: the same tree
    assert ast.dump(tree) == ast.dump(ast.parse(SOURCE))
    forget_ast()
    assert parse_ast(SOURCE) is not tree


def test_a_file_is_parsed_by_ast_once_for_its_summary_and_its_positions(tmp_path, monkeypatch):
    (tmp_path / "setup.py").write_text("")  # the repository root: the file's own summary is read through the index
    path = tmp_path / "evaluate.py"
    path.write_text(SOURCE)
    parsed: list[str] = []
    real = ast.parse

    def counting(source, *args, **kwargs):
        parsed.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting)
    modules._SUMMARIES.clear()
    result = analyze_file(path, str(path), Config(preview=True, measured_severities=False))
    assert result.findings, "the example must report something, so that positions are computed"
    assert any(summary.path == str(path) for summary in modules._SUMMARIES.values())  # its summary was read
    assert parsed.count(SOURCE) == 1
    assert context._KEPT_AST == (None, None)  # forgotten once the file is done: no tree outlives its analysis


def test_module_nodes_after_the_walk_share_the_walk_s_parent_map():
    module = parse_module(SOURCE)
    walked = FileContext("t.py", SOURCE, module)
    _Walker(walked, [], lambda rule, exc: None).walk(module)
    walked.walked = True
    fresh = FileContext("t.py", SOURCE, module)  # asked during a walk: the map is built, not borrowed
    shared, built = ModuleNodes(walked), ModuleNodes(fresh)
    assert shared.parents is walked.parents
    assert built.parents is not fresh.parents
    assert shared.nodes == built.nodes
    assert shared.parents == built.parents  # the same code nodes under the same parents
    assert all(isinstance(node, cst.CSTNode) for node in shared.nodes)
