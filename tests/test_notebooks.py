"""Notebooks as IPython runs them: magics, shell escapes and indented cells are Python, every finding
and syntax error is on its own cell line, the size limit is on the code, and the App comments on the
line of the notebook's JSON that GitHub's diff shows."""
from __future__ import annotations

import base64
import json
import re

import pytest

from analyzers.config import Config
from analyzers.engine import MAX_FILE_BYTES, analyze_paths, analyze_text
from analyzers.model import Fix
from analyzers.notebook import cell_to_python, json_fix, json_source_lines

# the whole catalog at each rule's own severity: these tests are about the engine, and use preview rules as subjects
EVERY_RULE = Config(preview=True, measured_severities=False)
from bot.review import PullRequestAnalysis, plan_check_run, plan_review
from tests.test_review import assert_valid_check_run, assert_valid_review, changed_file


def notebook(*cells, outputs=()) -> str:
    """A notebook as nbformat writes it: one source line per JSON line, indent 1, sorted keys."""
    out = []
    for kind, source in cells:
        cell = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
        if kind == "code":
            cell.update(execution_count=None, outputs=list(outputs))
        out.append(cell)
    nb = {"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def where(text: str) -> list[tuple]:
    """(rule, cell, line, column) of each finding, and the syntax errors."""
    result = analyze_text(text, "nb.ipynb", EVERY_RULE)
    return [(f.rule, f.cell, f.line, f.column) for f in result.findings] + [e.message for e in result.errors]


# ---- IPython syntax ----------------------------------------------------------------------------

def test_cell_magics_that_are_not_python_are_skipped():
    nb = notebook(("code", "%%writefile requirements.txt\ntorch>=2.0\nnumpy==1.*\n"),
                  ("code", "%%bash\nfor f in *.pt; do echo $f; done\n"),
                  ("code", "%%html\n<b>hi</b>\n"),
                  ("code", "import torch\nm = torch.load(path)\n"))
    assert where(nb) == [("TR601", 4, 2, 5)]


@pytest.mark.parametrize("magic", ["%%time", "%%timeit", "%%capture out", "%%prun -s cumulative"])
def test_cell_magics_that_run_python_are_analyzed(magic):
    nb = notebook(("code", "import torch"), ("code", f"{magic}\nx = 1\nm = torch.load(path)\n"))
    assert where(nb) == [("TR601", 2, 3, 5)]


def test_line_magics_and_shell_escapes_anywhere():
    source = "\n".join([
        "import torch",                      # 1
        "gpus = !nvidia-smi -L",             # 2  a shell command's output
        "names = %who_ls",                   # 3  a magic's value
        "if len(gpus) > 1:",                 # 4  a block whose body is only magics
        "    %load_ext autoreload",          # 5
        "    %autoreload 2",                 # 6
        "for name in names:",                # 7
        "    !echo {name}",                  # 8  a shell escape inside a block
        "    print?",                        # 9  help
        "state = torch.load(path)",          # 10
    ])
    assert where(notebook(("code", source))) == [("TR601", 1, 10, 9)]


def test_continued_shell_command_keeps_the_lines_below_in_place():
    # IPython joins "!cmd \" and its continuation into one line; the lines after it stay where they are.
    source = "import torch\n!pip install \\\n    torchvision \\\n    timm\nm = torch.load(path)\n"
    assert where(notebook(("code", source))) == [("TR601", 1, 5, 5)]
    converted = cell_to_python(source)
    assert converted.source.count("\n") == source.count("\n")


def test_time_line_magic_runs_its_statement():
    nb = notebook(("code", "import torch\n%time state = torch.load(path)\nstate = %timeit torch.load(path)\n"))
    assert where(nb) == [("TR601", 1, 2, 15), ("TR601", 1, 3, 17)]
    # a fix would replace the whole cell line, magic included: none is offered
    assert [f.fix for f in analyze_text(nb, "nb.ipynb", EVERY_RULE).findings] == [None, None]


def test_a_cell_indented_by_one_space_is_dedented_and_columns_stay_the_cells():
    nb = notebook(("code", " import torch\n\n m = torch.load(path)\n"))
    assert where(nb) == [("TR601", 1, 3, 6)]
    (finding,) = analyze_text(nb, "nb.ipynb", EVERY_RULE).findings
    assert finding.fix is None  # whole-line fixes would lose the cell's indent


def test_magic_text_inside_a_string_is_left_alone():
    converted = cell_to_python('doc = """\n%matplotlib inline\n!rm -rf /\n"""\n%matplotlib inline\n')
    assert converted.source.split("\n")[1:3] == ["%matplotlib inline", "!rm -rf /"]
    assert converted.source.split("\n")[4] == "get_ipython().run_line_magic('matplotlib', 'inline')"


def test_pasted_prompts_are_stripped():
    nb = notebook(("code", ">>> import torch\n>>> m = torch.load(path)\n"))
    assert where(nb) == [("TR601", 1, 2, 9)]


def test_syntax_errors_are_on_the_cells_own_line_and_column():
    nb = notebook(("markdown", "# Train"),
                  ("code", "import torch\n!pip install \\\n  timm\ndef f(:\n    pass\n"),
                  ("code", " x = 1\n def g(:\n     pass\n"),
                  ("code", "%%writefile setup.py\ndef not_python(:\n"),
                  ("code", "import torch\nm = torch.load(path)\n"))
    assert where(nb) == [("TR601", 5, 2, 5),
                         "cell 2, line 4, column 7: invalid syntax",
                         "cell 3, line 2, column 8: invalid syntax"]


def test_without_ipython_plain_cells_are_analyzed_and_ipython_cells_name_the_extra(monkeypatch):
    """The base install has no IPython (the `notebooks` extra): what parses as Python is still analyzed;
    a cell in IPython syntax is reported as not analyzed, saying what to install."""
    from analyzers import notebook as notebook_module

    monkeypatch.setattr(notebook_module, "_ipython", lambda: None)
    nb = notebook(("code", "import torch\n"),
                  ("code", "%matplotlib inline\nx = torch.load(a)\n"),
                  ("code", ">>> y = torch.load(b)\n"),
                  ("code", "%%time\nz = torch.load(c)\n"),  # a Python cell magic: its body is Python
                  ("code", " w = torch.load(d)  # why?\n"))  # indented, and a "?" last: still plain Python
    hint = "(IPython syntax (%magic, !command, a pasted prompt) needs IPython: pip install 'torchreview[notebooks]')"
    found = where(nb)
    assert [f for f in found if isinstance(f, tuple)] == [("TR601", 4, 2, 5), ("TR601", 5, 1, 6)]
    assert [e for e in found if isinstance(e, str)] == [f"cell 2, line 1, column 1: invalid syntax {hint}",
                                                        f"cell 3, line 1, column 1: invalid syntax {hint}"]



TRAIN_FUNCTION = """\
import torch
from torchvision import datasets

loader = torch.utils.data.DataLoader(datasets.MNIST("data", train=True, download=True), batch_size=64)


def train(model, optimizer, epochs):
    for epoch in range(epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
"""


def test_an_exercise_notebook_trains_even_when_the_cell_that_calls_train_has_blanks():
    nb = notebook(("markdown", "# Train a classifier"), ("code", TRAIN_FUNCTION),
                  ("code", "## TODO: choose the number of epochs\nepochs = \n\ntrain(model, optimizer, epochs)\n"))
    assert where(nb) == [("TR901", 2, 12, 13), "cell 3, line 2, column 10: invalid syntax"]
    # the same function in a module that nothing runs is a library: seeding is its caller's business
    assert [f.rule for f in analyze_text(TRAIN_FUNCTION, "helpers.py", EVERY_RULE).findings] == []


# ---- size: the code, not the outputs -----------------------------------------------------------

def _image_output(size: int) -> dict:
    png = base64.b64encode(b"\x89PNG" + bytes(range(256)) * (size // 256 // 4 * 3)).decode()
    return {"data": {"image/png": png, "text/plain": ["<Figure>"]}, "metadata": {}, "output_type": "display_data"}


def test_a_notebook_of_megabytes_of_outputs_with_little_code_is_analyzed(tmp_path):
    nb = notebook(("code", "import torch\nm = torch.load(path)\n"), outputs=[_image_output(600_000)] * 3)
    assert len(nb) > 1_500_000
    (tmp_path / "big.ipynb").write_text(nb)
    run = analyze_paths([str(tmp_path)], EVERY_RULE, jobs=1)
    assert run.errors == []
    assert [(f.rule, f.cell, f.line) for f in run.findings] == [("TR601", 1, 2)]


def test_too_much_code_is_still_too_large(tmp_path):
    cells = [("code", "import torch\n")] + [("code", f"x{i} = {'1' * 90}\n") for i in range(MAX_FILE_BYTES // 90)]
    (tmp_path / "huge.ipynb").write_text(notebook(*cells))
    run = analyze_paths([str(tmp_path)], EVERY_RULE, jobs=1)
    (error,) = run.errors
    assert error.kind == "too-large" and "code cells" in error.message


# ---- the notebook's JSON lines -----------------------------------------------------------------

def test_json_source_lines_are_the_lines_github_shows():
    text = notebook(("markdown", "# Title\n"), ("code", "import torch\n\nm = torch.load(path)"))
    mapping = json_source_lines(text)
    lines = text.split("\n")
    assert [lines[n - 1].strip() for n in mapping[2]] == ['"import torch\\n",', '"\\n",', '"m = torch.load(path)"']
    assert [lines[n - 1].strip() for n in mapping[1]] == ['"# Title\\n"', '"# Title\\n"']


def test_json_source_lines_of_a_source_written_as_one_string():
    text = json.dumps({"cells": [{"cell_type": "code", "source": "a = 1\nb = 2"}]}, indent=2)
    (line,) = {n for n in json_source_lines(text)[1]}
    assert '"source": "a = 1\\nb = 2"' in text.split("\n")[line - 1]
    assert json_source_lines("{not json") == {} and json_source_lines("[1, 2]") == {}


# ---- the App: inline on the JSON line ----------------------------------------------------------

BASE_NB = notebook(("markdown", "# Training\n"), ("code", "import torch\n\nmodel = torch.nn.Linear(2, 2)\n"))
HEAD_NB = notebook(("markdown", "# Training\n"), ("code", "import torch\n\nmodel = torch.nn.Linear(2, 2)\n"),
                   ("code", "%%capture\n!pip install timm\nstate = torch.load(path)\n"))


def _analysis(base: str, head: str) -> PullRequestAnalysis:
    result = analyze_text(head, "nb.ipynb", EVERY_RULE)
    return PullRequestAnalysis(result.findings, {"nb.ipynb": changed_file("nb.ipynb", base, head)},
                               {"nb.ipynb": head}, reviewed_files=["nb.ipynb"])


def test_a_notebook_finding_is_an_inline_comment_on_its_json_line():
    pr = _analysis(BASE_NB, HEAD_NB)
    (finding,) = pr.findings
    assert (finding.cell, finding.line) == (3, 3)
    review = plan_review(pr)
    (comment,) = review.comments
    assert HEAD_NB.split("\n")[comment["line"] - 1].strip() == '"state = torch.load(path)\\n"'
    assert "TR601" in comment["body"]
    # the fix, as the JSON string it replaces: committing it gives a notebook without the finding
    suggestion = re.search(r"```suggestion\n(.*?)```", comment["body"], re.S).group(1)
    assert suggestion == '    "state = torch.load(path, weights_only=True)\\n"\n'
    fixed = Fix(comment["line"], comment["line"], suggestion).apply(HEAD_NB)
    assert json.loads(fixed)["cells"][2]["source"][-1] == "state = torch.load(path, weights_only=True)\n"
    assert analyze_text(fixed, "nb.ipynb", EVERY_RULE).findings == []
    (note,) = plan_check_run(pr).annotations
    assert note["start_line"] == comment["line"] and note["message"].startswith("nb.ipynb (cell 3, line 3): ")
    assert "Suggested replacement for cell 3, lines 3-3:" in note["raw_details"]
    assert_valid_review(review, pr.diffs)
    assert_valid_check_run(plan_check_run(pr))


def test_a_notebook_laid_out_beforehand_is_placed_as_one_laid_out_here():
    """The App works out where a notebook's cells are in an isolated child (bot.pipeline.notebook_layouts);
    the plan then reads no more of the notebook's text than those lines."""
    from analyzers.notebook import json_source_layout
    from bot.review import LaidOutNotebook

    plain, laid_out, unknown = (_analysis(BASE_NB, HEAD_NB) for _ in range(3))
    laid_out.sources = {"nb.ipynb": LaidOutNotebook(HEAD_NB, *json_source_layout(HEAD_NB))}
    assert plan_review(laid_out).comments == plan_review(plain).comments != []
    assert plan_check_run(laid_out).annotations == plan_check_run(plain).annotations
    unknown.sources = {"nb.ipynb": LaidOutNotebook(HEAD_NB, {}, {})}  # the child ran out of memory or time
    review = plan_review(unknown)
    assert review.comments == [] and review.findings_count == 1 and "TR601" in review.body


def test_a_notebook_finding_off_the_diff_stays_in_the_summary():
    # 40 unchanged cells between them keep the finding's line out of the hunk.
    filler = [("code", f"y{i} = {i}\n") for i in range(40)]
    base = notebook(("code", "import torch\nstate = torch.load(path)\n"), *filler, ("code", "x = 1\n"))
    head = notebook(("code", "import torch\nstate = torch.load(path)\n"), *filler, ("code", "x = 2\n"))
    pr = _analysis(base, head)
    review = plan_review(pr)
    assert review.comments == [] and review.findings_count == 1
    assert "`nb.ipynb (cell 1, line 2)`" in review.body


def test_app_comments_on_the_notebook_line_end_to_end(stack):
    """A PR adds a cell with a bug to a notebook and a notebook with megabytes of plots (GitHub sends no
    diff of it, and serves it through the blob API): the first gets an inline comment on the JSON line
    of the bug, the second is analyzed and its finding is listed in the summary."""
    from tests.conftest import completed_run, deliver, new_repo, pr_payload

    state = stack["state"]
    plots = notebook(("code", "import torch\nckpt = torch.load(ckpt_path)\n"), outputs=[_image_output(700_000)] * 2)
    assert len(plots) > 1_000_000  # over the emulator's (and GitHub's) patch size limit
    # TR601, the bug of both notebooks, is a preview rule: the repository opts in; it never fails the check
    repo, name = new_repo(state, {}, {"train.ipynb": BASE_NB, ".github/torchreview.yml": "preview: true\n"})
    pr = state.open_pull_request(repo, {"train.ipynb": HEAD_NB, "plots.ipynb": plots}, user="alice")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha, timeout=120)
    assert run.conclusion == "success"
    comments = state.review_comments_for(pr)
    bug_line = next(n for n, text in enumerate(HEAD_NB.split("\n"), 1) if text.strip() == '"state = torch.load(path)\\n"')
    assert [(c.path, c.line) for c in comments] == [("train.ipynb", bug_line)]
    assert "TR601" in comments[0].body and '"state = torch.load(path, weights_only=True)\\n"' in comments[0].body
    summary = next(c.body for c in state.issue_comments_for(pr) if "torchreview" in c.body)
    assert "plots.ipynb (cell 1, line 2)" in summary
    assert "plots.ipynb (cell 1, line 2)" in run.output_summary


# ---- reading: streamed, outputs never held -----------------------------------------------------

def test_reading_cells_holds_one_output_at_a_time_not_the_notebook(tmp_path):
    import tracemalloc

    from analyzers.notebook import read_cells

    path = tmp_path / "plots.ipynb"
    path.write_text(notebook(("markdown", "# Plots"), ("code", "import torch\nx = 1\n"),
                             outputs=[_image_output(1_000_000)] * 10))
    assert path.stat().st_size > 9_000_000
    tracemalloc.start()
    try:
        with path.open("rb") as stream:
            cells = read_cells(stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(c.number, c.cell_type, c.source) for c in cells] == [(1, "markdown", "# Plots"),
                                                                  (2, "code", "import torch\nx = 1\n")]
    assert peak < 3_000_000  # about one 1 MB image string, never the 9 MB of them


def test_odd_notebooks():
    from analyzers.notebook import NotebookError, read_cells

    bom = b"\xef\xbb\xbf" + notebook(("code", "import torch\nm = torch.load(path)\n")).encode()
    assert [f.rule for f in analyze_text(bom.decode("utf-8"), "nb.ipynb", EVERY_RULE).findings] == ["TR601"]
    assert [c.source for c in read_cells(bom)] == ["import torch\nm = torch.load(path)\n"]
    # items that are not cells still count, as Jupyter numbers cells by position
    odd = json.dumps({"cells": [3, {"cell_type": "code", "source": "a = 1"}, [1], {"source": ["b\n", 7, "c"]}]})
    assert [(c.number, c.cell_type, c.source) for c in read_cells(odd)] == [(2, "code", "a = 1"), (4, "", "b\nc")]
    for bad in ("{not json", "[1, 2]", '{"cells": 3}', '{"cells": [' + "[" * 200_000):
        with pytest.raises(NotebookError):
            read_cells(bad)
    deep = '{"cells": [{"cell_type": "code", "source": "x = 1", "metadata": ' + "[" * 50_000 + "]" * 50_000 + "}]}"
    assert [c.source for c in read_cells(deep)] == ["x = 1"]


# ---- the CLI's SARIF and GitHub annotations: on the .ipynb's JSON line -------------------------

def test_sarif_and_github_annotations_point_at_the_json_line(tmp_path):
    import io

    from analyzers.output import render_github, to_sarif

    path = tmp_path / "train.ipynb"
    path.write_text(HEAD_NB)
    run = analyze_paths([str(path)], EVERY_RULE, jobs=1)
    (finding,) = run.findings
    assert finding.fix is not None  # the engine has one, in cell lines
    json_line = next(n for n, text in enumerate(HEAD_NB.split("\n"), 1) if "state = torch.load" in text)
    (result,) = to_sarif(run)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": json_line}
    assert result["message"]["text"].startswith("cell 3, line 3: ") and "fixes" not in result
    out = io.StringIO()
    render_github(run, out)
    assert f",line={json_line},title=TR601" in out.getvalue() and "::cell 3, line 3: " in out.getvalue()


def test_json_fix_rewrites_the_json_strings_of_the_fixed_lines():
    text = notebook(("code", "import torch\nm = torch.load(path)\nx = 1"))
    lines = json_source_lines(text)[1]
    middle = json_fix(text, lines, Fix(2, 2, "m = torch.load(path, weights_only=True)\n"))
    last = json_fix(text, lines, Fix(3, 3, "x = 2\ny = 3\n"))
    fixed = last.apply(middle.apply(text))  # the first keeps the line count, so the second's lines hold
    assert json.loads(fixed)["cells"][0]["source"] == [
        "import torch\n", "m = torch.load(path, weights_only=True)\n", "x = 2\n", "y = 3"]
    # a source written as one string has no line of its own per cell line: no suggestion
    one_string = json.dumps({"cells": [{"cell_type": "code", "source": "a\nb = torch.load(p)\n"}]}, indent=1)
    assert json_fix(one_string, json_source_lines(one_string)[1], Fix(2, 2, "b = 1\n")) is None
    # the same fixes from the lines json_source_layout kept, without splitting the whole text
    from analyzers.notebook import json_source_layout

    cell_lines, json_lines = json_source_layout(text)
    assert set(json_lines) == set(cell_lines[1])
    assert json_fix(text, cell_lines[1], Fix(2, 2, "m = torch.load(path, weights_only=True)\n"),
                    lines=json_lines) == middle


def test_fix_applies_in_a_cell_full_of_ipython_syntax():
    from analyzers.fixer import fix_notebook

    source = ("import torch\ngpus = !nvidia-smi -L\nif gpus:\n    %load_ext autoreload\n"
              "x = %time torch.load(path)\nstate = torch.load(path)\n")
    fixed = fix_notebook(notebook(("code", source)), "nb.ipynb", EVERY_RULE, unsafe=True)  # weights_only is unsafe
    cell = json.loads(fixed.text)["cells"][0]["source"]
    # the plain line is fixed; the %time line keeps its magic (no fix offered there); the rest is untouched
    assert cell == ["import torch\n", "gpus = !nvidia-smi -L\n", "if gpus:\n", "    %load_ext autoreload\n",
                    "x = %time torch.load(path)\n", "state = torch.load(path, weights_only=True)\n"]
    assert [(f.rule, f.cell, f.line) for f in fixed.result.findings] == [("TR601", 1, 5)]


def test_a_findings_other_site_in_the_cell_is_on_its_json_line_too(tmp_path):
    from analyzers.output import to_sarif

    model = ("class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.fc = torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n"
             "        return torch.softmax(self.fc(x), dim=1)\n\n"
             "model = Net()\ncriterion = torch.nn.CrossEntropyLoss()\nfor x, y in loader:\n"
             "    loss = criterion(model(x), y)\n")
    path = tmp_path / "nb.ipynb"
    path.write_text(notebook(("code", "import torch\n"), ("code", model)))
    run = analyze_paths([str(path)], EVERY_RULE, jobs=1)
    (finding,) = [f for f in run.findings if f.related]
    (site,) = finding.related
    assert (finding.cell, finding.line, site.line) == (2, 12, 7)
    lines = path.read_text().split("\n")
    (result,) = [r for r in to_sarif(run)["runs"][0]["results"] if r["ruleId"] == finding.rule]
    (related,) = result["relatedLocations"]
    assert "torch.softmax" in lines[related["physicalLocation"]["region"]["startLine"] - 1]
    assert related["message"]["text"].startswith("cell 2, line 7: ")


def test_a_pr_that_changes_only_the_other_site_is_commented_there():
    model = ("class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.fc = torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n"
             "        return {}\n\n"
             "model = Net()\ncriterion = torch.nn.CrossEntropyLoss()\nfor x, y in loader:\n"
             "    loss = criterion(model(x), y)\n")
    base = notebook(("code", "import torch\n"), ("code", model.format("self.fc(x)")))
    head = notebook(("code", "import torch\n"), ("code", model.format("torch.softmax(self.fc(x), dim=1)")))
    pr = _analysis(base, head)
    (comment,) = plan_review(pr).comments
    assert "torch.softmax" in head.split("\n")[comment["line"] - 1]
    assert "the finding is at cell 2, line 12" in comment["body"]


def test_a_notebook_costs_the_review_budget_its_code_not_its_plots():
    from bot.pipeline import _parse_cost

    nb = notebook(("markdown", "# Plots"), ("code", "import torch\nx = 1\n"), outputs=[_image_output(500_000)])
    assert _parse_cost("plots.ipynb", nb.encode()) == len("import torch\nx = 1\n")
    assert _parse_cost("train.py", b"x = 1\n") == 6
    assert _parse_cost("broken.ipynb", b"{not json") == 9  # unreadable: its bytes, as any file
