"""The rule catalog. Each module holds the rules of one category; importing it registers them."""
from __future__ import annotations

import importlib

from analyzers.rules.base import REGISTRY, Invalid, Rule, Valid

_MODULES = (
    "training",
    "inference",
    "architecture",
    "numerics",
    "autograd",
    "serialization",
    "device",
    "deprecation",
    "reproducibility",
    "leakage",
    "removed_api",
    "numerics_exact",
    "checkpoints",
    "data",
    "loop",
    "amp",
    "distributed",
    "finetuning",
    "checkpoint_files",
)
_loaded = False

# Rules folded into another (issue 26, "said once"): the old id and slug still select, ignore and suppress
# (``# noqa: TR721``) the rule that took its cases over.
RULE_ALIASES = {"TR721": "TR962", "shuffle-with-sampler": "TR962"}


def canonical_rule_id(identifier: str) -> str:
    """The id a rule id or slug now stands for: an alias's target, else the identifier itself."""
    return RULE_ALIASES.get(identifier.upper(), RULE_ALIASES.get(identifier, identifier))


def all_rules() -> list[type[Rule]]:
    global _loaded
    if not _loaded:
        for name in _MODULES:
            importlib.import_module(f"analyzers.rules.{name}")
        _loaded = True
    return [REGISTRY[k] for k in sorted(REGISTRY)]


def get_rule(identifier: str) -> type[Rule] | None:
    identifier = canonical_rule_id(identifier)
    for rule in all_rules():
        if identifier.upper() == rule.id or identifier == rule.slug:
            return rule
    return None


__all__ = ["Rule", "Valid", "Invalid", "all_rules", "get_rule", "canonical_rule_id", "RULE_ALIASES"]
