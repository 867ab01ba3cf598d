"""SARIF that GitHub code scanning ranks: a help page per rule, security-severity on the security rules only."""
from __future__ import annotations

from pathlib import Path

from analyzers.config import Config
from analyzers.engine import RunResult, analyze_text
from analyzers.model import Severity
from analyzers.output import PROJECT_URL, to_sarif
from analyzers.rules import all_rules

ROOT = Path(__file__).resolve().parents[1]

# GitHub's bands for properties.security-severity
BANDS = {Severity.CRITICAL: (9.0, 10.0), Severity.HIGH: (7.0, 8.9), Severity.MEDIUM: (4.0, 6.9),
         Severity.LOW: (0.1, 3.9)}


def _sarif(source: str = "import torch\nstate = torch.load(path)\n") -> dict:
    result = analyze_text(source, "train.py", Config(preview=True))  # TR601 is a preview rule
    return to_sarif(RunResult(findings=result.findings, errors=result.errors, files=1))


def test_every_rule_has_a_help_uri_to_its_generated_page():
    driver = _sarif()["runs"][0]["tool"]["driver"]
    assert driver["informationUri"] == PROJECT_URL
    assert len(driver["rules"]) == len(all_rules())
    for descriptor in driver["rules"]:
        prefix = f"{PROJECT_URL}/blob/main/"
        assert descriptor["helpUri"].startswith(prefix), descriptor["id"]
        page = ROOT / descriptor["helpUri"][len(prefix):]
        assert page == ROOT / "docs" / "rules" / f"{descriptor['id']}.md"
        assert page.is_file(), f"{page} is missing: python scripts/gen_docs.py"


def test_security_severity_only_on_security_rules_within_githubs_bands():
    driver = _sarif()["runs"][0]["tool"]["driver"]
    by_id = {rule.id: rule for rule in all_rules()}
    security = {d["id"] for d in driver["rules"] if "security-severity" in d["properties"]}
    assert "TR601" in security
    assert security == {rule.id for rule in all_rules() if rule.security}
    for descriptor in driver["rules"]:
        properties = descriptor["properties"]
        if descriptor["id"] not in security:
            assert "security" not in properties["tags"], descriptor["id"]
            continue
        assert "security" in properties["tags"]
        low, high = BANDS[by_id[descriptor["id"]].severity]
        value = properties["security-severity"]
        assert isinstance(value, str) and low <= float(value) <= high, (descriptor["id"], value)


def test_a_finding_points_at_the_descriptor_with_its_help():
    run = _sarif()["runs"][0]
    result = run["results"][0]
    assert result["ruleId"] == "TR601"
    descriptor = run["tool"]["driver"]["rules"][result["ruleIndex"]]
    assert descriptor["helpUri"].endswith("/docs/rules/TR601.md")
    assert descriptor["properties"]["security-severity"] == "7.5"  # TR601's default severity is high
