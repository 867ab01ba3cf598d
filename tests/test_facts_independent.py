"""Facts do not depend on which rules are enabled: a rule finds the same things alone as beside every other rule.

Shared facts (``ctx.facts(...)``, the accumulation steps, the training-loop answers) are filled lazily by whichever
rule asks first; this runs each rule's own examples, and the dev-set-shaped programs of every other rule, both
ways and compares that rule's findings.
"""
from __future__ import annotations

import textwrap

from analyzers.engine import analyze_source
from analyzers.rules import all_rules


def _code_rules():
    return [rule for rule in all_rules() if not getattr(rule, "scans_files", False)]


def _examples():
    for rule in _code_rules():
        for example in [*rule.VALID, *rule.INVALID]:
            if getattr(example, "requirements", None) is not None:
                continue  # needs a repository around it; covered by tests/test_rule_examples.py
            code = example if isinstance(example, str) else example.code
            yield textwrap.dedent(code)


def _found(result, rule_id):
    return sorted((f.line, f.column, f.message) for f in result.findings if f.rule == rule_id)


def test_each_rule_finds_the_same_alone_and_beside_every_other_rule():
    rules = _code_rules()
    differences = []
    for code in _examples():
        together = analyze_source(code, "example.py", rules=rules)
        reported = {f.rule for f in together.findings}
        # every rule that reported here, and a sample of those that did not (alone they might report more)
        for rule in rules:
            if rule.id not in reported and not rule.may_report_on(code):
                continue
            alone = analyze_source(code, "example.py", rules=[rule])
            if _found(alone, rule.id) != _found(together, rule.id):
                differences.append((rule.id, code.splitlines()[:3], _found(alone, rule.id),
                                    _found(together, rule.id)))
    assert not differences, differences[:5]
