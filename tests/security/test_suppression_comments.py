"""Issue 23 item 15: only real comments (Python's tokenizer) silence findings, never text in strings or docstrings
that looks like one, and what comments silence is listed in the check run (a count and a bounded list)."""
from __future__ import annotations

from analyzers.engine import analyze_source
from bot.review import MAX_LISTED_SUPPRESSED, suppressed_section
from tests.conftest import completed_run, deliver, new_repo, pr_payload
from tests.markdown_render import render

IN_STRINGS = '''import torch

"""Loading helpers.
# torchreview: skip-file
"""
NOTE = "# noqa"


def resume(path):
    return torch.symeig(path), "# noqa: TR810"
'''
# TR810 (removed API): a stable rule, so its high finding fails the check (preview rules never do)
REAL_NOQA = "import torch\n\n\ndef resume(path):\n    return torch.symeig(path)  # noqa: TR810\n"
SKIPPED = "# torchreview: skip-file\nimport torch\n\nstate = torch.symeig(a)\n"


def test_comment_lookalikes_in_strings_suppress_nothing():
    result = analyze_source(IN_STRINGS, "io.py")
    assert [(f.rule, f.line) for f in result.findings] == [("TR810", 10)]
    assert not result.suppressed and not result.skipped_by_comment
    real = analyze_source(REAL_NOQA, "real.py")
    assert not real.findings and [(f.rule, f.line) for f in real.suppressed] == [("TR810", 5)]
    skipped = analyze_source(SKIPPED, "gen.py")
    assert not skipped.findings and skipped.skipped_by_comment


def test_the_check_run_lists_what_comments_silenced(stack):
    state = stack["state"]
    repo, name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"io.py": IN_STRINGS, "real.py": REAL_NOQA, "gen.py": SKIPPED}, user="mallory")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha, timeout=120)
    assert run.conclusion == "failure"  # io.py's torch.symeig: the look-alikes in its strings hid nothing
    assert "Silenced by comments in the code (2)" in run.output_summary
    assert "`real.py:5`: `TR810`" in run.output_summary
    assert "`gen.py`: not analyzed (`# torchreview: skip-file`)" in run.output_summary
    assert "io.py" not in run.output_summary.split("Silenced by comments")[1]


def test_the_list_is_bounded():
    findings = analyze_source(REAL_NOQA, "real.py").suppressed * (MAX_LISTED_SUPPRESSED + 7)
    lines = suppressed_section(findings, ["gen.py"])
    assert f"({MAX_LISTED_SUPPRESSED + 8})" in lines[0]
    assert sum(1 for line in lines if line.startswith("- `")) == MAX_LISTED_SUPPRESSED
    assert lines[-3] == "- … and 8 more"
    shown = render("\n".join(lines))
    assert not shown.unsafe_tags - {"details", "summary"} and not shown.mentions
