"""Every rule's own VALID/INVALID examples, run automatically (fixit style)."""
from __future__ import annotations

import re
import textwrap

import pytest

from analyzers.config import Config
from analyzers.engine import analyze_source
from analyzers.program.modules import index_for
from analyzers.rules import all_rules
from analyzers.rules.base import Invalid, Valid


DOUBLED_WORD = re.compile(r"\b(\w{3,})[\s`]+\1\b")


def _code_rules():
    # Checkpoint-file rules report on files, not code: tests/test_pickle_scan.py builds their examples.
    return [rule for rule in all_rules() if not getattr(rule, "scans_files", False)]


def _cases(kind):
    for rule in _code_rules():
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{rule.id}-{rule.slug}-{kind.lower()}-{index}")


def _code(example) -> str:
    code = example if isinstance(example, str) else example.code
    return textwrap.dedent(code)


def test_every_rule_has_examples():
    for rule in _code_rules():
        assert len(rule.VALID) >= 2, f"{rule.id} needs at least two VALID examples"
        assert len(rule.INVALID) >= 2, f"{rule.id} needs at least two INVALID examples"


def _analyze(code: str, rule, requirements, tmp_path, select=()):
    """The example alone, or as ``example.py`` of a repository pinning ``requirements``; under the example's
    selection (a TorchFix code widens some rules), else the defaults."""
    config = Config().merged_with_cli(select=list(select)) if select else Config()
    if requirements is None:
        return analyze_source(code, "example.py", config, rules=[rule])
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "requirements.txt").write_text(textwrap.dedent(requirements))
    script = tmp_path / "example.py"
    script.write_text(code)
    return analyze_source(code, str(script), config, rules=[rule], repository=index_for(script))


@pytest.mark.parametrize("rule,example", list(_cases("VALID")))
def test_valid_example_has_no_finding(rule, example, tmp_path):
    code = _code(example if not isinstance(example, Valid) else example.code)
    result = _analyze(code, rule, getattr(example, "requirements", None), tmp_path, getattr(example, "select", ()))
    assert not result.errors, result.errors
    assert [f for f in result.findings if f.rule == rule.id] == [], code


@pytest.mark.parametrize("rule,example", list(_cases("INVALID")))
def test_invalid_example_is_found(rule, example, tmp_path):
    example = example if isinstance(example, Invalid) else Invalid(example)
    code = _code(example.code)
    result = _analyze(code, rule, example.requirements, tmp_path, example.select)
    assert not result.errors, result.errors
    findings = [f for f in result.findings if f.rule == rule.id]
    assert len(findings) == example.count, f"expected {example.count} finding(s) of {rule.id} in:\n{code}\ngot {findings}"
    first = findings[0]
    assert first.severity is not None and first.slug == rule.slug and first.category == rule.category.value
    if example.line is not None:
        assert first.line == example.line, f"{rule.id} reported line {first.line}, expected {example.line}:\n{code}"
    if example.message is not None:
        assert example.message in first.message, f"{first.message!r} lacks {example.message!r}"
    for finding in findings:  # "optimizer `optimizer` is stepped": the name already says what it is
        doubled = DOUBLED_WORD.search(finding.message)
        assert doubled is None, f"{rule.id} says {doubled.group(0)!r}: {finding.message}"
    if example.fixed is not None:
        assert first.fix is not None, f"{rule.id} offered no fix"
        assert first.fix.apply(code) == textwrap.dedent(example.fixed)
    for finding in findings:  # a committable suggestion that breaks the build is worse than none
        if finding.fix is not None:
            fixed = finding.fix.apply(code)
            compile(fixed, "example.py", "exec")
            again = [f for f in _analyze(fixed, rule, example.requirements, tmp_path, example.select).findings
                     if f.rule == rule.id and f.line == finding.line and f.message == finding.message]
            assert not again, f"{rule.id}'s fix does not fix it:\n{fixed}"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
def test_rule_docs_are_complete(rule):
    docs = rule.docs()
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
        assert heading in docs
    assert rule.id[:2] == "TR" and len(rule.id) == 5 and rule.id[2:].isdigit()
    assert rule.slug == rule.slug.lower() and " " not in rule.slug
