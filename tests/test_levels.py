"""Maturity levels and measured severity caps (analyzers/levels.py): the committed levels.json is what the
committed verdicts give, the decision follows the documented bar, and preview findings never fail a check."""
from __future__ import annotations

import json

import pytest

from analyzers import levels
from analyzers.config import Config
from analyzers.engine import analyze_source, fails, finding_fails
from analyzers.model import Severity
from analyzers.rules import all_rules, get_rule
from bench import corpus_precision as bench


def test_committed_levels_are_what_the_committed_verdicts_give():
    rows = bench.read_measured()
    verdicts = bench.read_verdicts(bench.CORPUS_DIR / "verdicts")
    assert rows and all(fid in verdicts for fid, _, _ in rows)
    committed = json.loads(levels.LEVELS_FILE.read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(bench.rule_levels(rows, verdicts))), \
        "levels.json drifted from the verdicts: run `python bench/corpus_precision.py levels`"


def test_every_rule_has_a_level():
    table = json.loads(levels.LEVELS_FILE.read_text(encoding="utf-8"))["rules"]
    assert set(table) == {r.id for r in all_rules()}
    assert {entry["level"] for entry in table.values()} <= {levels.STABLE, levels.PREVIEW}


def _measure(tp: int, noise: int = 0, fp: int = 0) -> levels.Measure:
    measure = levels.Measure()
    for verdict, count in (("TP", tp), ("NOISE", noise), ("FP", fp)):
        for _ in range(count):
            measure.add(verdict)
    return measure


SEMANTIC, SYNTACTIC = get_rule("TR601"), get_rule("TR810")


@pytest.mark.parametrize("rule, overall, severe, level", [
    (SEMANTIC, _measure(16), {}, levels.STABLE),  # 16 of 16: the interval's low end is 81 %
    (SEMANTIC, _measure(15), {}, levels.PREVIEW),  # 15 of 15: low end 79.6 %, under 80 %
    (SEMANTIC, _measure(14), {}, levels.PREVIEW),  # too few to tell
    (SEMANTIC, _measure(29, noise=1), {}, levels.STABLE),  # 97 %, low end 83 %
    (SEMANTIC, _measure(19, noise=1), {}, levels.PREVIEW),  # 95 % of 20, low end 76 %
    (SEMANTIC, _measure(27, noise=3), {}, levels.PREVIEW),  # 90 %, low end 74 %
    (SEMANTIC, _measure(39, fp=1), {"high": _measure(0, fp=1)}, levels.PREVIEW),  # an FP at high
    (SEMANTIC, _measure(39, fp=1), {"low": _measure(0, fp=1)}, levels.STABLE),  # 97.5 %, the FP at low
    (SYNTACTIC, _measure(3), {}, levels.STABLE),  # syntactic, too few to measure, no FP
    (SYNTACTIC, _measure(0), {}, levels.STABLE),
    (SYNTACTIC, _measure(2, fp=1), {}, levels.PREVIEW),
    (SYNTACTIC, _measure(10, noise=10), {}, levels.PREVIEW),  # enough to measure: 50 %
])
def test_the_level_follows_the_documented_bar(rule, overall, severe, level):
    assert levels.decide_level(rule, overall, severe)[0] == level


def test_a_rule_wrong_at_high_more_than_5_percent_of_the_time_is_capped_at_medium():
    assert levels.decide_severity_cap({"high": _measure(19, noise=1)}) is None  # 95 %
    assert levels.decide_severity_cap({"high": _measure(18, noise=2)}) == "medium"
    assert levels.decide_severity_cap({"critical": _measure(9, fp=1), "low": _measure(0, fp=5)}) == "medium"
    assert levels.decide_severity_cap({"low": _measure(0, fp=5)}) is None


def test_the_cap_applies_by_default_and_measured_severities_false_keeps_the_rules_own():
    code = "import argparse, torch\nargs = argparse.ArgumentParser().parse_args()\nstate = torch.load(args.resume)\n"
    assert levels.entry("TR601")["severity_cap"] == "medium"
    (capped,) = analyze_source(code, "t.py", Config(select=("TR601",))).findings
    (own,) = analyze_source(code, "t.py", Config(select=("TR601",), measured_severities=False)).findings
    assert capped.severity is Severity.MEDIUM and own.severity is Severity.CRITICAL
    # the user's own override still wins over the cap
    (overridden,) = analyze_source(code, "t.py", Config(select=("TR601",), severity={"TR601": Severity.HIGH})).findings
    assert overridden.severity is Severity.HIGH


def test_preview_findings_never_fail_and_stable_ones_do():
    code = "import torch\nstate = torch.load(args.resume)\nvalues = torch.symeig(a)\n"
    result = analyze_source(code, "t.py", Config(preview=True, measured_severities=False))
    by_rule = {f.rule: f for f in result.findings}
    assert by_rule["TR601"].preview and not by_rule["TR810"].preview
    assert not finding_fails(by_rule["TR601"], Severity.LOW) and finding_fails(by_rule["TR810"], Severity.HIGH)
    assert not fails([by_rule["TR601"]], Severity.LOW) and fails(result.findings, Severity.HIGH)
    assert by_rule["TR601"].to_dict()["preview"] is True and "preview" not in by_rule["TR810"].to_dict()


def test_the_default_set_runs_only_stable_rules():
    code = "import torch\nstate = torch.load(args.resume)\nvalues = torch.symeig(a)\n"
    assert [f.rule for f in analyze_source(code, "t.py", Config()).findings] == ["TR810"]


def test_old_id_of_a_merged_rule_still_suppresses_it():
    code = ("from torch.utils.data import DataLoader\n"
            "a = DataLoader(ds, shuffle=True, sampler=s)  # noqa: TR721\n"
            "b = DataLoader(ds, shuffle=True, sampler=s)\n")
    found = analyze_source(code, "t.py", Config(select=("TR721",))).findings
    assert [(f.rule, f.line) for f in found] == [("TR962", 3)]
    assert get_rule("TR721") is get_rule("TR962") and get_rule("shuffle-with-sampler") is get_rule("TR962")


def test_rule_docs_show_the_level_and_the_measure():
    assert "Level: stable, holdout precision 100%" in get_rule("TR816").docs()
    assert "default severity: medium" in get_rule("TR601").docs() and "severity capped at medium" in \
        get_rule("TR601").docs()


def test_the_app_never_fails_on_preview_findings_and_says_why():
    from bot.review import ReviewSettings, comment_body, summary_verdict

    code = "import argparse, torch\nargs = argparse.ArgumentParser().parse_args()\nstate = torch.load(args.resume)\n"
    (preview,) = analyze_source(code, "t.py", Config(select=("TR601",), measured_severities=False)).findings
    assert preview.preview and preview.severity is Severity.CRITICAL
    verdict = summary_verdict([preview], ReviewSettings(fail_on=Severity.HIGH))
    assert verdict.startswith("### ⚠️") and "preview rules (they never fail it); the check passes" in verdict
    assert "preview rule (never fails the check)" in comment_body(preview, "0" * 16)
    (stable,) = analyze_source("import torch\nvalues = torch.symeig(a)\n", "t.py", Config()).findings
    assert summary_verdict([preview, stable], ReviewSettings(fail_on=Severity.HIGH)).startswith("### ❌ 1 issue")
