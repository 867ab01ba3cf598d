"""Maturity levels and measured severities: which rules run by default, and how high they may report.

A rule is ``stable`` or ``preview`` (ruff's model). Stable rules run by default; preview rules run only when a
repository opts in (``preview: true``, ``--preview``, or selecting the rule by its exact id or slug), and their
findings never fail a check. The decision is data, ``analyzers/rules/levels.json``, written by
``python bench/corpus_precision.py levels`` from the holdout verdicts (docs/evaluation.md, "Levels"); a test
checks the committed file against the verdicts, so the two cannot drift apart.

The rules for the decision are here, in one place (:func:`decide_level`, :func:`decide_severity_cap`), and
used by the bench command that writes the file and by the test that checks it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional

from analyzers.model import Category, Severity
from analyzers.program.harm import TEST_CODE, TINY_DATA

LEVELS_FILE = Path(__file__).resolve().parent / "rules" / "levels.json"
STABLE, PREVIEW = "stable", "preview"

# A rule is stable when its strict holdout precision is at least this, the lower end of its 95 % Wilson
# interval at least that, over at least MIN_JUDGED judged findings, with no false positive at high or critical.
MIN_PRECISION = 0.90
MIN_PRECISION_LOW = 0.80
MIN_JUDGED = 15
# high and critical are kept only where the rule's findings at that severity were right this often on holdout
MIN_SEVERE_PRECISION = 0.95
SEVERE = (Severity.HIGH, Severity.CRITICAL)
Z95 = 1.959963984540054


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion; (0, 1) when nothing was observed."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Measure:
    """A rule's judged holdout findings: all of them, and those at each severity."""

    judged: int = 0
    tp: int = 0
    noise: int = 0
    fp: int = 0

    def add(self, verdict: str) -> None:
        self.judged += 1
        self.tp += verdict == "TP"
        self.noise += verdict == "NOISE"
        self.fp += verdict == "FP"

    @property
    def precision(self) -> Optional[float]:
        return self.tp / self.judged if self.judged else None

    def to_dict(self) -> dict[str, Any]:
        low, high = wilson(self.tp, self.judged)
        return {"judged": self.judged, "tp": self.tp, "noise": self.noise, "fp": self.fp,
                "precision": None if self.precision is None else round(self.precision, 4),
                "interval": [round(low, 4), round(high, 4)]}


def is_syntactic(rule: type) -> bool:
    """Purely syntactic (``Rule.syntactic``): with too few findings to measure, stable unless a judged finding
    was a false positive."""
    return rule.syntactic


def decide_level(rule: type, overall: Measure, by_severity: Mapping[str, Measure]) -> tuple[str, str]:
    """(level, why) from a rule's holdout measure."""
    severe_fp = sum(by_severity[s.label].fp for s in SEVERE if s.label in by_severity)
    if overall.judged >= MIN_JUDGED:
        low, _ = wilson(overall.tp, overall.judged)
        if overall.precision >= MIN_PRECISION and low >= MIN_PRECISION_LOW and not severe_fp:
            return STABLE, "measured"
        return PREVIEW, "measured below the bar"
    if is_syntactic(rule):
        if overall.fp:
            return PREVIEW, "syntactic, but a judged finding was a false positive"
        return STABLE, "syntactic (a removed or deprecated API, a checkpoint's opcodes); too few findings to measure"
    return PREVIEW, "too few judged findings to measure"


def decide_severity_cap(by_severity: Mapping[str, Measure]) -> Optional[str]:
    """``medium`` when the rule's judged high or critical findings were right less than 95 % of the time."""
    for severity in SEVERE:
        measure = by_severity.get(severity.label)
        if measure and measure.judged and measure.precision < MIN_SEVERE_PRECISION:
            return Severity.MEDIUM.label
    return None


def decide(rule: type, overall: Measure, by_severity: Mapping[str, Measure]) -> dict[str, Any]:
    """One rule's entry of levels.json."""
    level, why = decide_level(rule, overall, by_severity)
    return {"level": level, "why": why, "severity_cap": decide_severity_cap(by_severity),
            "holdout": overall.to_dict(),
            "holdout_by_severity": {s: m.to_dict() for s, m in sorted(by_severity.items())}}


@lru_cache(maxsize=1)
def _table() -> Mapping[str, Mapping[str, Any]]:
    return json.loads(LEVELS_FILE.read_text(encoding="utf-8"))["rules"]


def entry(rule_id: str) -> Mapping[str, Any]:
    """A rule's entry; a rule new since the last measurement is preview with no figures."""
    return _table().get(rule_id) or {"level": PREVIEW, "why": "not measured yet", "severity_cap": None,
                                     "holdout": None, "holdout_by_severity": {}}


def level_of(rule_id: str) -> str:
    return entry(rule_id)["level"]


def is_preview(rule_id: str) -> bool:
    return level_of(rule_id) == PREVIEW


def capped(rule_id: str, severity: Severity) -> Severity:
    """``severity`` lowered to the rule's measured cap, if it has one."""
    cap = entry(rule_id).get("severity_cap")
    return min(severity, Severity.parse(cap)) if cap else severity


def describe(rule_id: str) -> str:
    """``stable, holdout precision 100% [95%, 100%] over 79 judged`` and the like, for `torchreview rules`."""
    data = entry(rule_id)
    text = data["level"]
    measure = data.get("holdout")
    if measure and measure["judged"]:
        low, high = measure["interval"]
        text += (f", holdout precision {measure['precision']:.0%} [{low:.0%}, {high:.0%}] over "
                 f"{measure['judged']} judged")
    else:
        text += ", no judged holdout findings"
    if data.get("severity_cap"):
        text += f"; severity capped at {data['severity_cap']} (high/critical right < 95 % on holdout)"
    return text


# Rules whose harm is where a file comes from, not what the code around it is for: a test that loads a
# downloaded checkpoint is as exposed as a training script. Where the program wrote the file itself, the rules
# already say so from the program model (analyzers.program.roles.CheckpointWrites), so context never lowers them.
NOT_LOWERED_BY_CONTEXT = (Category.SECURITY.value,)


def context_lowered(severity: Severity, category: str, role: Optional[str]) -> tuple[Severity, Optional[str]]:
    """``severity`` one level lower (never below low) where the file's role makes the harm small (test code, a
    benchmark, tiny synthetic data: analyzers.program.harm), and why; unchanged for security rules."""
    if role is None or category in NOT_LOWERED_BY_CONTEXT or severity is Severity.LOW:
        return severity, None
    return Severity(severity - 1), f"lowered: {role}"


# Rules whose low findings a test keeps: security (as above) and APIs a library release removes
KEPT_IN_TESTS = (*NOT_LOWERED_BY_CONTEXT, Category.DEPRECATION.value)


def context_drops(severity: Severity, category: str, role: Optional[str]) -> bool:
    """A finding that is low in test code (low already, or medium lowered by :func:`context_lowered`) says
    nothing. A test exercises code on purpose (a pinned device, a toy loader, a fake model's state), and the
    hygiene advice a low finding gives is not worth a comment there; bugs of high severity and above stay (one
    level lower). Security rules are kept, as in :func:`context_lowered`, and so are deprecated and removed APIs:
    a test breaks on the release that removes one just as a training run does. ``severity`` is the one after
    lowering."""
    return role == TEST_CODE and severity is Severity.LOW and category not in KEPT_IN_TESTS


# Roles where code never runs long enough for speed to matter (``analyzers.program.harm``'s names; a benchmark
# is where speed is the point, so it is not one).
SPEED_IRRELEVANT_ROLES = (TEST_CODE, TINY_DATA)


def context_silences(speed_only: bool, role: Optional[str]) -> bool:
    """A finding whose only harm is speed says nothing where the file's role is test code or a program on tiny
    synthetic data: a tutorial's or a unit test's loop never runs long enough for the advice to pay."""
    return speed_only and role in SPEED_IRRELEVANT_ROLES
