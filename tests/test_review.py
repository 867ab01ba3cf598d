"""bot.review: findings -> one GitHub review + one check run, validated against GitHub's schemas."""
from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest
from openapi_schema_validator import OAS30Validator

from analyzers.fingerprint import fingerprints_for
from github_emulator.contract import TRIMMED_SPEC, require
from analyzers.model import FileError, Finding, Fix, Severity
from analyzers.rules import all_rules
from bot.review import (
    MAX_MARKDOWN_CHARS,
    FileDiff,
    PullRequestAnalysis,
    ReviewSettings,
    batches,
    keep_findings,
    no_files_plan,
    parse_file_patch,
    parse_fingerprint,
    parse_fingerprints,
    plan_check_run,
    plan_review,
    suggestion_block,
)
from tests.markdown_render import render

REVIEWS = ("/repos/{owner}/{repo}/pulls/{pull_number}/reviews", "post")
CHECK_RUNS = ("/repos/{owner}/{repo}/check-runs", "post")

# real rules, so the rule catalog (why, summary) is exercised
RULES = {cls.id: (cls.slug, cls.category.value) for cls in all_rules()}


# ---- helpers ------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def request_validator(path: str, method: str) -> OAS30Validator:
    spec = json.loads(require(TRIMMED_SPEC).read_text())
    schema = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return OAS30Validator(dict(schema, components=spec["components"]))


def assert_valid_review(plan, diffs: dict[str, FileDiff]) -> None:
    """Schema-valid, and every comment on lines GitHub accepts (else the whole review is a 422)."""
    request_validator(*REVIEWS).validate(plan.to_request(commit_id="a" * 40))
    for comment in plan.comments:
        assert comment["side"] == "RIGHT"
        first = comment.get("start_line", comment["line"])
        assert first < comment["line"] or "start_line" not in comment
        assert diffs[comment["path"]].in_one_hunk(first, comment["line"])
        assert set(comment) <= {"path", "line", "side", "body", "start_line", "start_side"}


def assert_valid_check_run(plan) -> None:
    validator = request_validator(*CHECK_RUNS)
    for batch in list(batches(plan.annotations)) or [[]]:
        validator.validate({"name": "torchreview", "head_sha": "a" * 40, "status": "completed",
                            "conclusion": plan.conclusion, "output": plan.output(batch)})
    assert len(plan.summary) <= MAX_MARKDOWN_CHARS and len(plan.text) <= MAX_MARKDOWN_CHARS


def finding(path="train.py", line=1, severity=Severity.HIGH, rule="TR601", *, end_line=None, message=None,
            fix=None, cell=None, column=5, end_column=15) -> Finding:
    slug, category = RULES[rule]
    return Finding(path, line, column, end_line or line, end_column, rule, slug, category, severity,
                   message or f"{slug} at line {line}", fix, cell)


def numbered(count: int, prefix: str = "x") -> str:
    return "".join(f"{prefix}{n} = {n}\n" for n in range(1, count + 1))


def github_patch(old: str, new: str) -> str:
    """The ``patch`` field GitHub's PR files API gives: unified hunks, no file headers."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), n=3)
    return "".join(list(lines)[2:])


def changed_file(path: str, old: str, new: str) -> FileDiff:
    return parse_file_patch(path, github_patch(old, new))


def replace_lines(text: str, replacements: dict[int, str]) -> str:
    lines = text.splitlines(keepends=True)
    for number, new in replacements.items():
        lines[number - 1] = new
    return "".join(lines)


@pytest.fixture()
def edited_file():
    """train.py with 100 lines: lines 50-51 changed (one hunk 47-54), line 90 changed (hunk 87-93)."""
    old = numbered(100)
    new = replace_lines(old, {50: "y50 = torch.load(p)\n", 51: "y51 = 1\n", 90: "y90 = 2\n"})
    return new, {"train.py": changed_file("train.py", old, new)}


# ---- diff parsing ------------------------------------------------------------------------------

def test_parse_file_patch_knows_added_and_context_lines(edited_file):
    _, diffs = edited_file
    diff = diffs["train.py"]
    assert diff.added == {50, 51, 90}
    assert diff.commentable == set(range(47, 55)) | set(range(87, 94))
    assert diff.in_one_hunk(47, 54) and not diff.in_one_hunk(50, 90)


def test_file_without_patch_is_never_commentable():
    diff = parse_file_patch("big.py", None)
    assert not diff.has_patch and not diff.commentable


def test_pure_rename_reports_nothing_from_the_file():
    diffs = {"moved.py": parse_file_patch("moved.py", "")}
    assert diffs["moved.py"].has_patch and keep_findings([finding("moved.py", line=3)], diffs) == []


# ---- review ---------------------------------------------------------------------------------

def test_45_findings_give_30_inline_comments_most_severe_first_and_15_in_the_body():
    source = numbered(60)
    diffs = {"train.py": changed_file("train.py", "", source)}
    severities = [Severity.LOW, Severity.MEDIUM, Severity.HIGH, Severity.CRITICAL]
    # distinct rules, never repeated on neighbouring lines: 45 separate things to say
    rules = sorted(RULES)
    assert len(rules) >= 23
    findings = [finding(line=n, severity=severities[n % 4], rule=rules[n % len(rules)]) for n in range(1, 46)]
    plan = plan_review(PullRequestAnalysis(findings, diffs, {"train.py": source}))

    assert len(plan.comments) == 30
    order = ["critical", "high", "medium", "low"]
    ranks = [order.index(re.search(r"\*\*(\w+)\*\*", c["body"]).group(1)) for c in plan.comments]
    assert ranks == sorted(ranks)
    body_rows = [row for row in plan.body.splitlines() if row.startswith("| ") and "train.py" in row]
    assert len(body_rows) == 15
    assert all("🔵 **low**" in row or "🟡 **medium**" in row for row in body_rows)
    assert plan.body.splitlines()[0].startswith("🔴 **torchreview found 45 issues**")
    assert "🔴 11 critical" in plan.body  # totals by severity
    assert plan.should_post and plan.event == "COMMENT"
    assert_valid_review(plan, diffs)


def test_finding_outside_the_diff_is_not_inline(edited_file):
    source, diffs = edited_file
    outside = finding(line=10, rule="TR202", message="far away")  # another rule: not grouped with line 50's
    inside = finding(line=50)
    sources = {"train.py": source}

    plan = plan_review(PullRequestAnalysis([outside, inside], diffs, sources), ReviewSettings(filter="file"))
    assert [c["line"] for c in plan.comments] == [50]
    assert "`train.py:10`" in plan.body and "Not on lines of the diff" in plan.body
    assert_valid_review(plan, diffs)

    # With the default filter the unchanged line is not the PR's business at all.
    assert keep_findings([outside, inside], diffs) == [inside]


def test_diff_context_filter_keeps_findings_near_added_lines(edited_file):
    _, diffs = edited_file
    near, far = finding(line=53), finding(line=60)
    assert keep_findings([near, far], diffs, ReviewSettings(filter="diff_context", context_lines=3)) == [near]
    assert keep_findings([near, far], diffs) == []


def test_comment_prefers_an_added_line_within_the_finding_range(edited_file):
    source, diffs = edited_file
    plan = plan_review(PullRequestAnalysis([finding(line=48, end_line=52)], diffs, {"train.py": source}))
    assert plan.comments[0]["line"] == 50 and "start_line" not in plan.comments[0]


def test_fix_spanning_diff_lines_becomes_a_multi_line_suggestion(edited_file):
    source, diffs = edited_file
    fix = Fix(49, 51, "y50 = torch.load(p, weights_only=True)\ny51 = 1\n")
    plan = plan_review(PullRequestAnalysis([finding(line=50, fix=fix)], diffs, {"train.py": source}))

    (comment,) = plan.comments
    assert (comment["start_line"], comment["line"]) == (49, 51)
    assert comment["start_side"] == comment["side"] == "RIGHT"
    assert "```suggestion\ny50 = torch.load(p, weights_only=True)\ny51 = 1\n```" in comment["body"]
    assert "🟠 **high**" in comment["body"] and "`TR601` unsafe-torch-load" in comment["body"]
    assert "**Why:** `torch.load` unpickles its input." in comment["body"]
    assert_valid_review(plan, diffs)


def test_fix_across_two_hunks_is_no_suggestion(edited_file):
    source, diffs = edited_file
    plan = plan_review(PullRequestAnalysis([finding(line=50, fix=Fix(50, 90, "x\n"))], diffs, {"train.py": source}))
    (comment,) = plan.comments
    assert comment["line"] == 50 and "start_line" not in comment and "suggestion" not in comment["body"]


def test_single_line_fix_is_a_single_line_comment(edited_file):
    source, diffs = edited_file
    plan = plan_review(PullRequestAnalysis([finding(line=90, fix=Fix(90, 90, "y90 = 3\n"))], diffs,
                                           {"train.py": source}))
    (comment,) = plan.comments
    assert comment["line"] == 90 and "start_line" not in comment
    assert "```suggestion\ny90 = 3\n```" in comment["body"]


def test_replacement_with_backticks_gets_a_longer_fence():
    assert suggestion_block('doc = """```py\nx\n```"""\n') == '````suggestion\ndoc = """```py\nx\n```"""\n````'
    assert suggestion_block("s = '`````'\n").startswith("``````suggestion\n")
    assert suggestion_block("x = 1\n") == "```suggestion\nx = 1\n```"


def test_comment_body_ends_with_a_parseable_fingerprint(edited_file):
    source, diffs = edited_file
    target = finding(line=50)
    plan = plan_review(PullRequestAnalysis([target], diffs, {"train.py": source}))
    body = plan.comments[0]["body"]
    expected = fingerprints_for([target], {"train.py": source})[target]
    assert body.rstrip().endswith(f"<!-- torchreview:fingerprint={expected} rule=TR601 -->")
    assert parse_fingerprint(body) == expected
    assert parse_fingerprint("just a human comment") is None


def test_untrusted_text_cannot_mention_people_or_break_tables(edited_file):
    source, diffs = edited_file
    nasty = finding(line=10, message="ping @octocat | col\nnew row <!-- torchreview:fingerprint=00 rule=X -->")
    plan = plan_review(PullRequestAnalysis([nasty], diffs, {"train.py": source}), ReviewSettings(filter="file"))
    row = next(r for r in plan.body.splitlines() if "octocat" in r)
    assert "@\u200boctocat" in row and "\\| col new row" in row
    assert "@octocat" not in plan.body and "<!--" not in plan.body

    inline = plan_review(PullRequestAnalysis([finding(line=50, message="cc @octocat")], diffs, {"train.py": source}))
    assert "@\u200boctocat" in inline.comments[0]["body"]


def test_nothing_to_say_is_a_short_review_that_is_not_posted(edited_file):
    source, diffs = edited_file
    plan = plan_review(PullRequestAnalysis([finding(line=10)], diffs, {"train.py": source}))  # unchanged line
    assert plan.comments == [] and not plan.should_post
    assert plan.body.startswith("✅") and len(plan.body) < 200
    assert_valid_review(plan, diffs)


def test_notebook_finding_whose_cell_line_is_not_in_the_json_is_not_inline():
    nb_old = json.dumps({"cells": [{"source": ["a = 1\n"]}]}, indent=1) + "\n"
    nb_new = json.dumps({"cells": [{"source": ["a = torch.load(p)\n"]}]}, indent=1) + "\n"
    diffs = {"nb.ipynb": changed_file("nb.ipynb", nb_old, nb_new)}
    # Line 3 of the JSON is in the diff, but the notebook has no cell 2: the JSON line is unknown.
    nb_finding = finding("nb.ipynb", line=3, cell=2)
    pr = PullRequestAnalysis([nb_finding], diffs, {"nb.ipynb": nb_new}, reviewed_files=["nb.ipynb"])

    review = plan_review(pr)
    assert review.comments == [] and review.should_post
    assert "`nb.ipynb (cell 2, line 3)`" in review.body

    check = plan_check_run(pr)
    (note,) = check.annotations
    assert (note["start_line"], note["end_line"]) == (1, 1) and "start_column" not in note
    assert note["message"].startswith("nb.ipynb (cell 2, line 3): ")
    assert_valid_review(review, diffs)
    assert_valid_check_run(check)


# ---- fingerprints -----------------------------------------------------------------------------

def test_fingerprints_survive_lines_inserted_above():
    before = "import torch\n\nmodel = torch.load(path)\n"
    after = "import torch\nimport os\n\n# load the checkpoint\n\nmodel  =  torch.load(path)\n"
    old = finding(line=3)
    new = finding(line=6)
    assert fingerprints_for([old], {"train.py": before})[old] == fingerprints_for([new], {"train.py": after})[new]


def test_identical_lines_get_distinct_fingerprints_by_occurrence():
    source = "a = torch.load(p)\nb = 1\na = torch.load(p)\n"
    first, second = finding(line=1), finding(line=3)
    prints = fingerprints_for([second, first], {"train.py": source})
    assert prints[first] != prints[second]
    # Inserting a line between them keeps both.
    moved = "a = torch.load(p)\nb = 1\nc = 2\na = torch.load(p)\n"
    again = fingerprints_for([first, finding(line=4)], {"train.py": moved})
    assert set(again.values()) == set(prints.values())


def test_fingerprint_depends_on_rule_and_path():
    source = "a = torch.load(p)\n"
    a, b, c = finding(line=1), finding(line=1, rule="TR202"), finding("other.py", line=1)
    prints = fingerprints_for([a, b, c], {"train.py": source, "other.py": source})
    assert len(set(prints.values())) == 3


# ---- check run --------------------------------------------------------------------------------

def test_conclusion_follows_fail_on(edited_file):
    source, diffs = edited_file
    medium = finding(line=50, severity=Severity.MEDIUM, rule="TR202")
    pr = PullRequestAnalysis([medium], diffs, {"train.py": source}, reviewed_files=["train.py"])

    assert plan_check_run(pr).conclusion == "success"
    failing = plan_check_run(pr, ReviewSettings(fail_on=Severity.MEDIUM))
    assert failing.conclusion == "failure" and "at or above medium" in failing.title

    # A critical finding on a line the PR did not touch does not fail the PR.
    untouched = PullRequestAnalysis([finding(line=10, severity=Severity.CRITICAL, rule="TR301")], diffs,
                                    {"train.py": source}, reviewed_files=["train.py"])
    passing = plan_check_run(untouched)
    assert passing.conclusion == "success" and passing.annotations == []
    assert "1 finding on lines this pull request did not change is not reported" in passing.summary
    for plan in (failing, passing):
        assert_valid_check_run(plan)


def test_summary_reads_like_a_review(edited_file):
    source, diffs = edited_file
    findings = [finding(line=50, severity=Severity.CRITICAL, rule="TR301"), finding(line=51),
                finding(line=90, severity=Severity.LOW, rule="TR105"), finding(line=90, rule="TR601")]
    plan = plan_check_run(PullRequestAnalysis(findings, diffs, {"train.py": source}, reviewed_files=["train.py"]))
    summary = plan.summary
    assert plan.conclusion == "failure"
    assert "🔴 1 critical · 🟠 2 high · 🟡 0 medium · 🔵 1 low" in summary
    assert "#### Architecture" in summary and "#### Serialization & security" in summary
    assert "| Severity | File:line | Issue |" in summary
    actions = [line for line in summary.splitlines() if line.startswith("- [ ] ")]
    assert len(actions) == 3 and "TR301" in actions[0] and "TR105" in actions[-1]
    assert "(2×)" in actions[1] and "torch.load without weights_only=True" in render(actions[1]).text
    assert "Files reviewed (1)" in summary and "- `train.py`" in summary
    assert "#### TR301 missing-super-init" in plan.text
    assert_valid_check_run(plan)


def test_annotations_have_githubs_shape(edited_file):
    source, diffs = edited_file
    fix = Fix(50, 51, "ok\n")
    single, multi = finding(line=50, column=5, end_column=15, fix=fix), finding(line=50, end_line=51)
    plan = plan_check_run(PullRequestAnalysis([single, multi], diffs, {"train.py": source}, ["train.py"]))
    first, second = plan.annotations
    assert first == {**first, "path": "train.py", "start_line": 50, "end_line": 50, "start_column": 5,
                     "end_column": 14, "annotation_level": "failure", "title": "TR601 unsafe-torch-load"}
    assert "Suggested replacement" in first["raw_details"]
    assert (second["start_line"], second["end_line"]) == (50, 51) and "start_column" not in second
    assert_valid_check_run(plan)


def test_annotation_levels_by_severity(edited_file):
    source, diffs = edited_file
    findings = [finding(line=50, severity=s) for s in Severity]
    plan = plan_check_run(PullRequestAnalysis(findings, diffs, {"train.py": source}, ["train.py"]))
    assert [a["annotation_level"] for a in plan.annotations] == ["failure", "failure", "warning", "notice"]


def test_annotations_are_batched_by_50():
    source = numbered(130)
    diffs = {"train.py": changed_file("train.py", "", source)}
    findings = [finding(line=n) for n in range(1, 121)]
    plan = plan_check_run(PullRequestAnalysis(findings, diffs, {"train.py": source}, ["train.py"]))
    assert len(plan.annotations) == 120
    assert [len(batch) for batch in batches(plan.annotations)] == [50, 50, 20]
    assert [len(batch) for batch in batches(plan.annotations, size=60)] == [60, 60]
    assert len(plan.output()["annotations"]) == 50
    assert_valid_check_run(plan)


def test_huge_summary_is_truncated_with_a_more_line():
    source = numbered(2100)
    diffs = {"train.py": changed_file("train.py", "", source)}
    findings = [finding(line=n, message="long explanation " * 12 + str(n)) for n in range(1, 2001)]
    pr = PullRequestAnalysis(findings, diffs, {"train.py": source}, reviewed_files=["train.py"],
                             notes=[FileError("data.bin", "binary-file", "")])
    plan = plan_check_run(pr)

    assert len(plan.summary) <= MAX_MARKDOWN_CHARS
    rows = [line for line in plan.summary.splitlines() if line.startswith("| 🟠")]
    assert 100 < len(rows) < 2000
    assert f"… and {2000 - len(rows)} more findings (see annotations)" in plan.summary
    # Whole rows only, and what follows the tables survives the cut.
    assert all(row.endswith(" |") for row in rows)
    assert "### Recommended actions" in plan.summary and "`data.bin`: binary file" in plan.summary
    assert_valid_check_run(plan)

    review = plan_review(pr, ReviewSettings(max_inline_comments=0))
    assert len(review.body) <= MAX_MARKDOWN_CHARS and "more findings (see the check run)" in review.body
    assert_valid_review(review, diffs)


def test_notes_about_skipped_files_are_explained(edited_file):
    source, diffs = edited_file
    notes = [FileError("weights.pt", "binary-file", "binary content"),
             FileError("broken.py", "syntax-error", "line 3, column 7: invalid syntax"),
             FileError("huge.py", "no-patch", "")]
    plan = plan_check_run(PullRequestAnalysis([], diffs, {"train.py": source}, ["train.py"], notes))
    assert plan.conclusion == "success" and plan.title == "No issues found"
    assert "### Files not (fully) analyzed" in plan.summary
    assert "- `weights.pt`: binary file, not analyzed: binary content" in plan.summary
    assert "- `broken.py`: could not be parsed (syntax error), so no rule ran on it: line 3, column 7" \
        in plan.summary
    assert "- `huge.py`: GitHub sent no diff" in plan.summary
    assert_valid_check_run(plan)


def test_no_files_plan_succeeds():
    plan = no_files_plan()
    assert (plan.conclusion, plan.title, plan.annotations) == ("success", "No PyTorch files changed", [])
    assert plan_check_run(PullRequestAnalysis([], {})).title == "No PyTorch files changed"
    assert_valid_check_run(plan)


def test_findings_in_a_file_without_patch_are_kept_but_not_inline():
    diffs = {"big.py": parse_file_patch("big.py", None)}
    target = finding("big.py", line=7)
    pr = PullRequestAnalysis([target], diffs, reviewed_files=["big.py"])
    review = plan_review(pr)
    assert review.comments == [] and "`big.py:7`" in review.body
    assert plan_check_run(pr).conclusion == "failure"


def test_invalid_filter_is_rejected():
    with pytest.raises(ValueError, match="unknown filter"):
        ReviewSettings(filter="lines")


# ---- PR text is data ------------------------------------------------------------------------

HOSTILE_MESSAGE = ("`Net.__init__` never calls `super().__init__()`; *_like / x.new_* and __init__ @octocat "
                   "<img src=x> [x](//evil.example) <!-- hidden --> fixes #1")
HOSTILE_PATH = "evil`<img src=x>`|@octocat.py"
# Our own markup: headings, the file list's <details>, the fingerprint comment.
OWN_TAGS = {"h3", "h4", "details", "summary", "strong", "em"}  # em: the feedback line of comments


def assert_renders_as_data(markdown: str, *visible: str) -> None:
    rendered = render(markdown)
    assert rendered.unsafe_tags <= OWN_TAGS, rendered.html
    assert all(c.strip().startswith("torchreview:") for c in rendered.comments), rendered.comments
    assert not rendered.mentions and not rendered.issue_refs and not rendered.autolinks, rendered.html
    for text in visible:
        assert text in rendered.text, (text, rendered.text)


def test_pr_text_renders_literally_in_comments_review_body_and_check_run(edited_file):
    source, diffs = edited_file
    diffs = dict(diffs, **{HOSTILE_PATH: parse_file_patch(HOSTILE_PATH, None)})
    findings = [finding(line=50, rule="TR301", message=HOSTILE_MESSAGE),
                finding(HOSTILE_PATH, line=3, message=HOSTILE_MESSAGE)]
    notes = [FileError(HOSTILE_PATH, "syntax-error", "line 2, column 7: <img src=x> @octocat `")]
    pr = PullRequestAnalysis(findings, diffs, {"train.py": source}, ["train.py", HOSTILE_PATH], notes)
    shown = "Net.__init__ never calls super().__init__(); *_like / x.new_* and __init__ @octocat " \
            "<img src=x> [x](//evil.example) <!-- hidden --> fixes #1"

    review = plan_review(pr)
    assert len(review.comments) == 1
    assert_renders_as_data(review.comments[0]["body"], shown)
    assert_renders_as_data(review.body, shown, f"{HOSTILE_PATH}:3")
    check = plan_check_run(pr)
    assert_renders_as_data(check.summary, shown, HOSTILE_PATH, "<img src=x> @octocat `",
                           "nn.Module subclass __init__ without super().__init__()")


def test_job_errors_are_shown_without_url_secrets():
    from bot.review import job_failed_plan

    plan = job_failed_plan("HTTPError: 404 Client Error: Not Found for url: "
                           "https://codeload.github.com/o/r/legacy.tar.gz/abc?token=SECRET\n```\n<img src=x>")
    assert "SECRET" not in plan.summary
    rendered = render(plan.summary)
    assert rendered.code[-1].endswith("legacy.tar.gz/abc\n```\n<img src=x>\n")
    assert rendered.unsafe_tags == set()


def test_smoke_results_render_runner_and_pr_text_literally():
    from bot.review import parse_file_patch as patch_of
    from bot.smoke import failing_target_comments, plan_smoke_check_run

    target = "models/net.py:Net_*_like_"
    reason = ("constructing Net() raised TypeError: *_like / x.new_* need `__init__` @octocat <img src=x> "
              "from https://codeload.github.com/o/r/legacy.tar.gz/abc?token=SECRET")
    run = {"device": "cpu", "seconds": 1.5, "warnings": ["no seccomp: __init__ <b>x</b>"], "targets": [
        {"target": target, "status": "error", "line": 2, "head": {"reason": reason}},
        {"target": "models/net.py:Other", "status": "failed", "line": 9, "comparison": [], "head": {
            "checks": [{"name": "batch_independence", "status": "fail", "message": "row 0 changed `x[1:]` [x](//evil) "
                                                                   "https://h.example/w?token=SECRET"}],
            "measures": {"params": 10, "step_time_ms": 1.0, "peak_memory_bytes": 0, "loss_after_steps": 0.5}}},
    ]}
    plan = plan_smoke_check_run(run, "a" * 40)
    assert "SECRET" not in plan.summary
    assert_renders_as_data(plan.summary, target, "constructing Net() raised TypeError: *_like / x.new_* need __init__",
                           "row 0 changed x[1:] [x](//evil)", "no seccomp: __init__ <b>x</b>")
    diff = patch_of("models/net.py", "@@ -0,0 +1,10 @@\n" + "".join(f"+l{n}\n" for n in range(1, 11)))
    comments = failing_target_comments(run, {"models/net.py": diff}, {})
    assert len(comments) == 2
    for comment in comments:
        assert "SECRET" not in comment["body"]
        assert_renders_as_data(comment["body"])


# ---- saying each thing once ----------------------------------------------------------------------

def test_a_rule_repeated_on_100_lines_is_one_comment_listing_them():
    source = numbered(120)
    diffs = {"train.py": changed_file("train.py", "", source)}
    lines = [n for n in range(5, 120, 2)]
    findings = [finding(line=n, rule="TR803", severity=Severity.LOW, message="Variable is a no-op") for n in lines]
    plan = plan_review(PullRequestAnalysis(findings, diffs, {"train.py": source}))
    assert len(plan.comments) == 1
    [comment] = plan.comments
    assert comment["line"] == 5
    assert f"on lines {', '.join(map(str, lines))} ({len(findings)} in this file)" in comment["body"]
    assert set(parse_fingerprints(comment["body"])) == set(plan.fingerprints)
    assert_valid_review(plan, diffs)


def test_a_repeated_rule_with_different_messages_lists_each_line_with_its_message():
    source = numbered(60)
    diffs = {"train.py": changed_file("train.py", "", source)}
    findings = [finding(line=n, rule="TR803", severity=Severity.LOW) for n in range(1, 51, 2)]  # "... at line N"
    [comment] = plan_review(PullRequestAnalysis(findings, diffs, {"train.py": source})).comments
    text = render(comment["body"]).text
    assert "25 findings in this file" in text
    assert all(f"line {n}: {findings[0].slug} at line {n}" in text for n in range(1, 41, 2))
    assert "and the same on lines 41, 43, 45, 47, 49" in text  # past the listed messages: by line
    assert len(parse_fingerprints(comment["body"])) == 25


def test_two_findings_on_one_line_are_one_comment_with_both():
    source = numbered(10)
    diffs = {"train.py": changed_file("train.py", "", source)}
    findings = [finding(line=4, rule="TR702", severity=Severity.LOW), finding(line=4, rule="TR703", severity=Severity.LOW)]
    plan = plan_review(PullRequestAnalysis(findings, diffs, {"train.py": source}))
    [comment] = plan.comments
    assert "`TR702`" in comment["body"] and "`TR703`" in comment["body"]
    assert len(parse_fingerprints(comment["body"])) == 2
    assert parse_fingerprint(comment["body"]) in plan.fingerprints  # the single-marker reader still works
    rendered = render(comment["body"])
    assert "TR702" in rendered.text and "TR703" in rendered.text


def test_a_rule_found_twice_in_a_file_is_one_comment_whether_the_lines_touch_or_not():
    source = numbered(40)
    diffs = {"eval.py": changed_file("eval.py", "", source), "other.py": changed_file("other.py", "", source)}
    sources = {"eval.py": source, "other.py": source}
    same = dict(rule="TR601", severity=Severity.CRITICAL, message="unsafe load")
    for lines in ((22, 23), (10, 35)):
        plan = plan_review(PullRequestAnalysis([finding("eval.py", line=n, **same) for n in lines], diffs, sources))
        assert [c["line"] for c in plan.comments] == [lines[0]]
        assert f"lines {lines[0]}, {lines[1]} (2 in this file)" in plan.comments[0]["body"]
    # another rule is another comment; so is another file that says something else
    plan = plan_review(PullRequestAnalysis([finding("eval.py", line=10, **same),
                                            finding("other.py", line=12, **dict(same, message="unsafe load of x")),
                                            finding("eval.py", line=30, rule="TR202")], diffs, sources))
    assert sorted((c["path"], c["line"]) for c in plan.comments) == [("eval.py", 10), ("eval.py", 30),
                                                                     ("other.py", 12)]


def test_the_same_finding_in_several_files_is_one_comment_on_the_first_that_names_the_others():
    source = numbered(40)
    paths = ("a/train.ipynb", "b/train.py", "c/train.py")
    diffs = {path: changed_file(path, "", source) for path in paths[1:]}
    diffs["a/train.ipynb"] = FileDiff("a/train.ipynb", has_patch=False)  # no diff shown: not the one commented
    sources = {path: source for path in paths}
    same = dict(rule="TR901", severity=Severity.LOW, message="loss.backward() trains, but torch is never seeded")
    findings = [finding(paths[0], line=3, cell=2, **same), finding(paths[1], line=7, **same),
                finding(paths[1], line=20, **same), finding(paths[2], line=9, **same),
                finding(paths[2], line=30, rule="TR202")]
    plan = plan_review(PullRequestAnalysis(findings, diffs, sources))
    assert sorted((c["path"], c["line"]) for c in plan.comments) == [("b/train.py", 7), ("c/train.py", 30)]
    [seeds] = [c for c in plan.comments if "`TR901`" in c["body"]]
    text = render(seeds["body"]).text
    assert ("in a/train.ipynb: cell 2, line 3; b/train.py (here): lines 7, 20; c/train.py: line 9 "
            "(4 in this pull request)") in text
    assert len(parse_fingerprints(seeds["body"])) == 4  # its thread resolves when all four are gone
    assert_valid_review(plan, diffs)
    # the check run still has each site in its own file
    check = plan_check_run(PullRequestAnalysis(findings, diffs, sources))
    assert sorted(a["path"] for a in check.annotations) == sorted(f.path for f in findings)
    # configurable: one comment per file
    plan = plan_review(PullRequestAnalysis(findings, diffs, sources), ReviewSettings(group_across_files=False))
    assert sorted((c["path"], c["line"]) for c in plan.comments) == [("b/train.py", 7), ("c/train.py", 9),
                                                                     ("c/train.py", 30)]
    assert "a/train.ipynb" in plan.body  # not on the diff: in the review's body


def test_a_rule_found_in_three_files_is_one_comment_that_lists_each_site_with_its_message():
    source = numbered(40)
    paths = ("a.py", "b.py", "c.py")
    diffs = {path: changed_file(path, "", source) for path in paths}
    sources = {path: source for path in paths}
    loads = [finding(path, line=n, severity=Severity.CRITICAL, message=f"`torch.load(args.{path[0]})` is unsafe")
             for path, n in zip(paths, (4, 8, 12))]
    plan = plan_review(PullRequestAnalysis(loads, diffs, sources))
    [comment] = plan.comments
    assert (comment["path"], comment["line"]) == ("a.py", 4)
    text = render(comment["body"]).text
    assert "3 findings in this pull request:" in text
    assert all(f"{path} line {n}: torch.load(args.{path[0]}) is unsafe" in text
               for path, n in (("b.py", 8), ("c.py", 12)))
    assert "line 4: torch.load(args.a) is unsafe" in text
    assert len(parse_fingerprints(comment["body"])) == 3
    # in two files, each file has its comment; and the threshold is a setting (0: never)
    def comments(found, **settings):
        return len(plan_review(PullRequestAnalysis(found, diffs, sources), ReviewSettings(**settings)).comments)

    assert comments(loads[:2]) == 2
    assert comments(loads, group_rule_from_files=0) == 3 and comments(loads[:2], group_rule_from_files=2) == 1


def test_grouping_across_files_stops_where_a_comment_would_outgrow_githubs_limit():
    source = numbered(120)
    paths = [f"m{n}.py" for n in range(8)]
    diffs = {path: changed_file(path, "", source) for path in paths}
    findings = [finding(path, line=n, rule="TR803", severity=Severity.LOW, message="Variable is a no-op")
                for path in paths for n in range(1, 101)]  # 800 identical findings
    plan = plan_review(PullRequestAnalysis(findings, diffs, {path: source for path in paths}))
    assert len(plan.comments) == 3  # 300 + 300 + 200 findings
    assert sorted(len(parse_fingerprints(c["body"])) for c in plan.comments) == [200, 300, 300]
    assert all(len(c["body"]) <= MAX_MARKDOWN_CHARS for c in plan.comments)
    assert_valid_review(plan, diffs)


def test_a_repeated_fix_in_several_files_suggests_for_the_commented_file_and_shows_the_others():
    source = "import torch\n" + loads(3, first=2)
    paths = ("eval.py", "tools/eval.py")
    diffs = {path: changed_file(path, "", source) for path in paths}
    findings = [finding(path, line=n, message="unsafe load", fix=load_fix(n)) for path in paths for n in (2, 3)]
    [comment] = plan_review(PullRequestAnalysis(findings, diffs, {path: source for path in paths})).comments
    assert (comment["path"], comment.get("start_line"), comment["line"]) == ("eval.py", 2, 3)
    suggestion = re.search(r"```suggestion\n(.*?)```", comment["body"], re.S).group(1)
    lines = source.splitlines(keepends=True)
    fixed = lines[0] + suggestion + "".join(lines[3:])
    assert fixed.count("weights_only=True") == 2
    compile(fixed, "eval.py", "exec")
    assert "Suggested change (lines 2, 3)" in comment["body"]
    for n in (2, 3):
        assert f"Fix for `tools/eval.py` line {n}:" in comment["body"]
    assert "applies all 4" in comment["body"]


def loads(count: int, first: int = 1) -> str:
    return "".join(f"s{n} = torch.load(p{n})\n" for n in range(first, first + count))


def load_fix(line: int) -> Fix:
    return Fix(line, line, f"s{line} = torch.load(p{line}, weights_only=True)\n", safe=False)


def test_fixes_of_a_group_on_neighbouring_lines_are_one_committable_suggestion():
    source = "import torch\n" + loads(4, first=2) + "x = 1\n" + loads(2, first=7)
    diffs = {"eval.py": changed_file("eval.py", "", source)}
    findings = [finding("eval.py", line=n, message="unsafe load", fix=load_fix(n)) for n in (2, 3, 4, 5, 7, 8)]
    plan = plan_review(PullRequestAnalysis(findings, diffs, {"eval.py": source}))
    [comment] = plan.comments
    assert (comment["start_line"], comment["line"]) == (2, 8)
    suggestion = re.search(r"```suggestion\n(.*?)```", comment["body"], re.S).group(1)
    fixed = "".join(source.splitlines(keepends=True)[:1]) + suggestion + "".join(source.splitlines(keepends=True)[8:])
    assert fixed.count("weights_only=True") == 6 and "x = 1\n" in fixed
    compile(fixed, "eval.py", "exec")
    assert "Suggested change (lines 2, 3, 4, 5, 7, 8)" in comment["body"]
    assert_valid_review(plan, diffs)
    # a fix farther on is shown on its own; the neighbouring ones stay one suggestion
    source += "x = 2\n" * 20 + loads(1, first=29)
    diffs = {"eval.py": changed_file("eval.py", "", source)}
    findings.append(finding("eval.py", line=29, message="unsafe load", fix=load_fix(29)))
    [comment] = plan_review(PullRequestAnalysis(findings, diffs, {"eval.py": source})).comments
    assert (comment["start_line"], comment["line"]) == (2, 8)
    assert "Fix for line 29:\n\n```python\ns29 = torch.load(p29, weights_only=True)\n```" in comment["body"]
    assert "`torchreview check --fix --unsafe-fixes` applies all 7." in comment["body"]  # load_fix: unsafe


def test_fixes_of_a_group_far_apart_suggest_the_first_line_and_show_each_other_lines_fix():
    source = "import torch\n" + loads(39, first=2)
    diffs = {"eval.py": changed_file("eval.py", "", source)}
    findings = [finding("eval.py", line=n, message="unsafe load", fix=load_fix(n)) for n in (5, 30, 40)]
    [comment] = plan_review(PullRequestAnalysis(findings, diffs, {"eval.py": source})).comments
    assert comment["line"] == 5 and "start_line" not in comment
    assert re.findall(r"```suggestion\n(.*?)```", comment["body"], re.S) == ["s5 = torch.load(p5, weights_only=True)\n"]
    assert "Suggested change (line 5)" in comment["body"]
    for n in (30, 40):
        assert f"Fix for line {n}:\n\n```python\ns{n} = torch.load(p{n}, weights_only=True)\n```" in comment["body"]
    assert "`torchreview check --fix --unsafe-fixes` applies all 3." in comment["body"]


def test_one_line_with_two_fixable_findings_offers_no_suggestion_and_a_fix_with_one_does():
    source = numbered(10)
    diffs = {"train.py": changed_file("train.py", "", source)}
    both = [finding(line=4, rule="TR702", fix=Fix(4, 4, "x4 = 5\n")),
            finding(line=4, rule="TR703", fix=Fix(4, 4, "x4 = 6\n"))]
    [comment] = plan_review(PullRequestAnalysis(both, diffs, {"train.py": source})).comments
    assert "```suggestion" not in comment["body"] and "Fix for line 4" in comment["body"]
    one = [finding(line=4, rule="TR702", fix=Fix(4, 4, "x4 = 5\n")),
           finding(line=4, rule="TR703", severity=Severity.LOW)]
    [comment] = plan_review(PullRequestAnalysis(one, diffs, {"train.py": source})).comments
    assert re.findall(r"```suggestion\n(.*?)```", comment["body"], re.S) == ["x4 = 5\n"]
    assert "`TR703`" in comment["body"]


def test_a_posted_group_is_not_posted_again():
    source = numbered(30)
    diffs = {"train.py": changed_file("train.py", "", source)}
    findings = [finding(line=n, rule="TR803", severity=Severity.LOW) for n in (3, 21)]
    first = plan_review(PullRequestAnalysis(findings, diffs, {"train.py": source}))
    posted = frozenset(parse_fingerprints(first.comments[0]["body"]))
    again = plan_review(PullRequestAnalysis(findings, diffs, {"train.py": source}), posted=posted)
    assert again.comments == [] and again.findings_count == 2


def test_a_suggestion_also_removes_a_nearby_import_its_fix_frees():
    from analyzers.config import Config
    from analyzers.engine import analyze_source
    from bot.review import parse_file_patch, placement

    source = "import torch\nfrom torch.autograd import Variable\n\nx = Variable(torch.ones(2))\n"
    [finding] = [f for f in analyze_source(source, "new.py", Config(preview=True)).findings if f.rule == "TR803"]
    new_file = parse_file_patch("new.py", "@@ -0,0 +1,4 @@\n" + "".join("+" + line for line in source.splitlines(True)))
    where = placement(finding, new_file, source)
    # one suggestion over lines 2-4: the fix and the import it leaves unused
    assert (where.start_line, where.line) == (2, 4)
    assert where.suggestion.replacement == "\nx = torch.ones(2)\n"
    # the import outside the hunk (only line 4 changed): the suggestion is the fix alone
    edited = parse_file_patch("new.py", "@@ -4,1 +4,1 @@\n-x = Variable(torch.ones(1))\n+x = Variable(torch.ones(2))\n")
    alone = placement(finding, edited, source)
    assert (alone.start_line, alone.line) == (4, 4) and alone.suggestion.replacement == "x = torch.ones(2)\n"
