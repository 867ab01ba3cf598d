"""``torchreview check --fix``: fixes applied in place, re-analyzed, unsafe ones held back, diffs, refusals."""
from __future__ import annotations

import json
import shutil
import subprocess

import libcst as cst
import pytest

from analyzers.config import Config
from analyzers.fixer import MAX_PASSES, fix_source
from analyzers.model import Category, Severity
from analyzers.rules import get_rule
from analyzers.rules.base import Rule
from tests.test_cli import run

# Every fix here is safe (renames and no-op wrappers); two Variable fixes share line 4, so they
# overlap and need a second pass.
FIXABLE = """\
import torch
from torch.autograd import Variable

x = Variable(torch.ones(2)) + Variable(torch.zeros(2))
with torch.cuda.amp.autocast():
    y = x * 2
p = torch.log(torch.softmax(y, dim=0))
"""
FIXED = """\
import torch

x = torch.ones(2) + torch.zeros(2)
with torch.amp.autocast("cuda"):
    y = x * 2
p = torch.log_softmax(y, dim=0)
"""
UNSAFE = "import torch\nstate = torch.load('ckpt.pt')\n"
# these tests are about fixes, of preview rules mostly: every `check` here runs with --preview


def _findings(path, cwd):
    proc = run("check", "--preview", path, "--format", "json", "--fail-on", "low", cwd=cwd)
    return json.loads(proc.stdout)["findings"]


def test_several_fixes_applied_and_the_file_reanalyzes_clean(tmp_path):
    (tmp_path / "train.py").write_text(FIXABLE)
    assert {f["rule"] for f in _findings("train.py", tmp_path)} == {"TR801", "TR803", "TR404"}
    proc = run("check", "--preview", "train.py", "--fix", "--fail-on", "low", cwd=tmp_path, check=0)
    assert (tmp_path / "train.py").read_text() == FIXED
    assert "Fixed 4 findings in 1 file; 0 remaining" in proc.stderr
    assert "fixed train.py:5:6: TR801 deprecated-cuda-amp" in proc.stderr
    assert _findings("train.py", tmp_path) == []
    # nothing left to do: a second --fix changes nothing
    proc = run("check", "--preview", "train.py", "--fix", cwd=tmp_path, check=0)
    assert "Fixed 0 findings in 0 files" in proc.stderr and (tmp_path / "train.py").read_text() == FIXED


def test_unsafe_fix_needs_the_flag(tmp_path):
    (tmp_path / "load.py").write_text(UNSAFE)
    (finding,) = _findings("load.py", tmp_path)
    assert finding["fix"]["safe"] is False  # TR601: weights_only=True refuses pickled objects
    # the finding remains (TR601 is a preview rule: reported, never failing the run)
    proc = run("check", "--preview", "load.py", "--fix", cwd=tmp_path, check=0)
    assert (tmp_path / "load.py").read_text() == UNSAFE
    assert "1 more fix available with --unsafe-fixes" in proc.stderr
    assert "TR601" in proc.stdout and "[unsafe fix available]" in proc.stdout
    run("check", "--preview", "load.py", "--fix", "--unsafe-fixes", cwd=tmp_path, check=0)
    assert (tmp_path / "load.py").read_text() == "import torch\nstate = torch.load('ckpt.pt', weights_only=True)\n"


def test_safe_fixes_are_marked_safe_in_json(tmp_path):
    (tmp_path / "train.py").write_text(FIXABLE)
    assert all(f["fix"]["safe"] is True for f in _findings("train.py", tmp_path))
    assert get_rule("TR601").fix_safety == "unsafe" and get_rule("TR803").fix_safety == "safe"


def test_diff_fixes_prints_a_diff_and_writes_nothing(tmp_path):
    if shutil.which("git") is None:
        pytest.fail("git is needed")
    (tmp_path / "train.py").write_text(FIXABLE)
    proc = run("check", "--preview", "train.py", "--diff-fixes", cwd=tmp_path, check=1)  # 1: there is something to fix
    assert (tmp_path / "train.py").read_text() == FIXABLE
    assert proc.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "\n-with torch.cuda.amp.autocast():\n" in proc.stdout and '\n+with torch.amp.autocast("cuda"):\n' in proc.stdout
    # the diff is the fix: git applies it and gets what --fix writes
    subprocess.run(["git", "apply", "-"], input=proc.stdout, text=True, cwd=tmp_path, check=True)
    assert (tmp_path / "train.py").read_text() == FIXED
    run("check", "--preview", "train.py", "--diff-fixes", cwd=tmp_path, check=0)  # nothing left: no diff, exit 0


def test_newlines_and_encoding_are_kept(tmp_path):
    source = "# -*- coding: latin-1 -*-\nimport torch\nname = 'caf\xe9'\nwith torch.cuda.amp.autocast():\n    pass\n"
    data = source.replace("\n", "\r\n").encode("latin-1")
    (tmp_path / "old.py").write_bytes(data)
    (tmp_path / "old.py").chmod(0o755)  # an executable script stays executable
    run("check", "--preview", "old.py", "--fix", cwd=tmp_path, check=0)
    assert (tmp_path / "old.py").stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["old.py"]  # no temporary file left behind
    assert (tmp_path / "old.py").read_bytes() == data.replace(b"torch.cuda.amp.autocast()", b'torch.amp.autocast("cuda")')


def _notebook(*sources):
    return {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# Título\n"]}]
            + [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
               for s in sources],
            "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}


def test_notebook_cells_are_fixed_in_the_json(tmp_path):
    nb = _notebook(["import torch\n", "%matplotlib inline\n", "from torch.autograd import Variable"],
                   ["x = Variable(torch.ones(2))\n", "with torch.cuda.amp.autocast():\n", "    y = x * 2"],
                   "z = Variable(x)")
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    proc = run("check", "--preview", "nb.ipynb", "--fix", "--fail-on", "low", cwd=tmp_path, check=0)
    assert "fixed nb.ipynb:cell 3, line 1: TR803" in proc.stderr
    nb["cells"][2]["source"] = ["x = torch.ones(2)\n", 'with torch.amp.autocast("cuda"):\n', "    y = x * 2"]
    nb["cells"][3]["source"] = "z = x"  # a string source stays a string, with no newline added
    # only the cell sources change: same layout, same non-ASCII text, magics kept
    assert path.read_text(encoding="utf-8") == json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


class _KeywordForPrint(Rule):
    """A rule whose fix is broken: it replaces ``print(...)`` with the keyword ``lambda``."""

    summary = what = why = example = fix_example = "test"

    def visit_Call(self, node, ctx):
        if isinstance(node.func, cst.Name) and node.func.value == "print":
            self.report(node, "print", replacement=cst.Name("lambda"))


# set after the class body so the rule is not registered for every other test
_KeywordForPrint.id, _KeywordForPrint.slug = "TR000", "keyword-for-print"
_KeywordForPrint.category, _KeywordForPrint.severity = Category.NUMERICS, Severity.LOW


def test_a_fix_that_does_not_parse_is_refused():
    source = "import torch\nfrom torch.autograd import Variable\nprint(1)\nx = Variable(torch.ones(2))\n"
    fixed = fix_source(source, "t.py", Config(), rules=[_KeywordForPrint, get_rule("TR803")])
    # the good fix on line 4 is applied; the broken one is refused, reported, and its finding remains
    # (and the import it freed is gone)
    assert fixed.text == source.replace("Variable(torch.ones(2))", "torch.ones(2)").replace(
        "from torch.autograd import Variable\n", "")
    ((refused, why),) = fixed.refused
    assert refused.rule == "TR000" and "line 3" in why
    assert [f.rule for f in fixed.result.findings] == ["TR000"]


def test_passes_are_capped():
    # each pass can apply one of these overlapping fixes (one line): more than MAX_PASSES of them
    # stop at the cap, with the rest still reported
    count = MAX_PASSES + 2
    source = "import torch\nfrom torch.autograd import Variable\nx = " + " + ".join(["Variable(a)"] * count) + "\n"
    fixed = fix_source(source, "t.py", Config(), rules=[get_rule("TR803")])
    assert len(fixed.applied) == MAX_PASSES
    assert fixed.text.count("Variable(a)") == count - MAX_PASSES == len(fixed.result.findings)


def test_fix_with_diff_fixes_changed_lines_only(tmp_path):
    from tests.test_precommit import _git

    old = "import torch\nfrom torch.autograd import Variable\nold = Variable(torch.ones(2))\n"
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "train.py").write_text(old)
    _git("add", "-A", cwd=tmp_path)
    _git("commit", "-q", "-m", "base", cwd=tmp_path)
    # two changes on one new line: the second fix runs on the text the first left, still a changed line
    (tmp_path / "train.py").write_text(old + "new = Variable(torch.ones(3)) + Variable(torch.ones(4))\n")
    run("check", "--preview", "train.py", "--fix", "--diff", "HEAD", "--fail-on", "low", cwd=tmp_path, check=0)
    assert (tmp_path / "train.py").read_text() == old + "new = torch.ones(3) + torch.ones(4)\n"
    # a bad ref is a usage error, and nothing is written
    proc = run("check", "--preview", "train.py", "--fix", "--diff", "no-such-ref", cwd=tmp_path, check=2)
    assert "no-such-ref" in proc.stderr
    assert (tmp_path / "train.py").read_text() == old + "new = torch.ones(3) + torch.ones(4)\n"
    run("check", "--preview", "train.py", "--fix", "--fail-on", "low", cwd=tmp_path, check=0)  # without --diff: the old line too
    # (the last Variable fixed: its import goes)
    assert (tmp_path / "train.py").read_text().startswith("import torch\nold = torch.ones(2)\n")


# ---------------------------------------------------------------------------------------------
# Imports a fix leaves unused go with it; every other import stays


def _fixed(source: str, *rules: str, path: str = "train.py") -> str:
    return fix_source(source, path, Config(), rules=[get_rule(r) for r in rules]).text


def test_the_import_a_fix_frees_is_removed_with_the_statement_when_it_empties():
    source = "import torch\nfrom torch.autograd import Variable\n\nx = Variable(torch.ones(2))\n"
    assert _fixed(source, "TR803") == "import torch\n\nx = torch.ones(2)\n"
    # an alias is the name the scope analysis follows
    aliased = "import torch\nfrom torch.autograd import Variable as V\nx = V(torch.ones(2))\n"
    assert _fixed(aliased, "TR803") == "import torch\nx = torch.ones(2)\n"


def test_another_rule_s_fix_frees_its_import_too():
    source = ("import torch\nfrom torch.cuda.amp import autocast, GradScaler\n"
              "scaler = GradScaler()\nwith autocast():\n    y = 1\n")
    assert _fixed(source, "TR801") == ('import torch\nscaler = torch.amp.GradScaler("cuda")\n'
                                       'with torch.amp.autocast("cuda"):\n    y = 1\n')


def test_only_the_freed_name_leaves_a_from_import():
    source = "import torch\nfrom torch.autograd import Variable, grad\nx = Variable(torch.ones(2))\ng = grad\n"
    assert _fixed(source, "TR803") == "import torch\nfrom torch.autograd import grad\nx = torch.ones(2)\ng = grad\n"
    # parenthesized over two lines, one name left: one plain line
    wrapped = "import torch\nfrom torch.autograd import (Variable,\n    grad)  # autograd\nx = Variable(torch.ones(2))\ng = grad\n"
    assert _fixed(wrapped, "TR803") == ("import torch\nfrom torch.autograd import grad  # autograd\n"
                                        "x = torch.ones(2)\ng = grad\n")


def test_imports_the_fix_did_not_free_stay():
    # still used elsewhere in the file
    used = "import torch\nfrom torch.autograd import Variable\nx = Variable(torch.ones(2))\nkind = Variable\n"
    assert _fixed(used, "TR803") == used.replace("Variable(torch.ones(2))", "torch.ones(2)")
    # already unused before the fix (someone's re-export, a side effect): not ours to remove
    unused = "import os\nimport torch\nfrom torch.autograd import Variable\nx = Variable(torch.ones(2))\n"
    assert _fixed(unused, "TR803") == "import os\nimport torch\nx = torch.ones(2)\n"
    # exported through __all__, or named in a string annotation: in use after the fix as before
    exported = "import torch\nfrom torch.autograd import Variable\n__all__ = ['Variable']\nx = Variable(torch.ones(2))\n"
    assert "from torch.autograd import Variable\n" in _fixed(exported, "TR803")
    annotated = ("import torch\nfrom torch.autograd import Variable\nx = Variable(torch.ones(2))\n"
                 "def f(v: 'Variable'): ...\n")
    assert "from torch.autograd import Variable\n" in _fixed(annotated, "TR803")
    # a package's __init__.py: its imports are its namespace
    source = "import torch\nfrom torch.autograd import Variable\nx = Variable(torch.ones(2))\n"
    assert "from torch.autograd import Variable\n" in _fixed(source, "TR803", path="pkg/__init__.py")
    # a star import binds nothing the scope analysis can follow; the only statement of a block stays
    starred = "import torch\nfrom torch.autograd import *\nx = Variable(torch.ones(2))\n"
    assert "from torch.autograd import *\n" in _fixed(starred, "TR803")
    guarded = ("import torch\ntry:\n    from torch.autograd import Variable\nexcept ImportError:\n    Variable = None\n"
               "x = Variable(torch.ones(2))\n")
    assert "    from torch.autograd import Variable\n" in _fixed(guarded, "TR803")


def test_the_editor_s_edits_are_of_the_text_before_the_fix():
    from analyzers.freed_imports import with_freed_imports
    from analyzers.model import Fix

    # an import below the fix, which adds a line: the removal is placed on the line the import has now
    source = "def f():\n    return helper(1)\n\nfrom tools import helper, other\nprint(other)\n"
    fix = Fix(2, 2, "    value = 1\n    return value\n")
    edits = with_freed_imports(source, fix, "t.py")
    assert [(e.start_line, e.end_line, e.replacement) for e in edits] == [
        (2, 2, fix.replacement), (4, 4, "from tools import other\n")]
    text = source
    for edit in reversed(edits):
        text = edit.apply(text)
    assert text == "def f():\n    value = 1\n    return value\n\nfrom tools import other\nprint(other)\n"
