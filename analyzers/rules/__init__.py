"""The rule catalog: one rule per module, under ``analyzers/rules/<category>/`` (the category's ``package``).

Rules are discovered, not listed: :func:`all_rules` imports every module of every category folder, and each
module's one :class:`Rule` subclass registers itself (``Rule.__init_subclass__``). A module whose name starts
with ``_`` holds what several rules of its folder share and defines no rule. ``tests/test_rule_layout.py`` checks
that every rule module registers exactly one rule, in the folder of its category, named after its slug.
"""
from __future__ import annotations

import importlib
import pkgutil

from analyzers import hints
from analyzers.model import Category
from analyzers.rules.base import REGISTRY, Invalid, Rule, Valid

_loaded = False

# Rules folded into another (issue 26, "said once"), and slugs renamed: the old id or slug still selects,
# ignores and suppresses (``# noqa: TR721``) the rule that now carries it.
RULE_ALIASES = {"TR721": "TR962", "shuffle-with-sampler": "TR962",
                # TR105 and TR115 were per-step-sync-for-logging and per-step-synchronize-for-logging: one word apart
                "per-step-sync-for-logging": "TR105", "per-step-synchronize-for-logging": "TR115"}


def canonical_rule_id(identifier: str) -> str:
    """The id a rule id or slug now stands for: an alias's target, else the identifier itself."""
    return RULE_ALIASES.get(identifier.upper(), RULE_ALIASES.get(identifier, identifier))


def rule_modules() -> list[str]:
    """The dotted name of every rule module: each category folder's modules, less the shared ``_`` ones."""
    names = []
    for category in Category:
        package = importlib.import_module(f"{__name__}.{category.package}")
        names += [f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                  if not info.name.startswith("_") and not info.ispkg]
    return sorted(names)


def all_rules() -> list[type[Rule]]:
    global _loaded
    if not _loaded:
        for name in rule_modules():
            importlib.import_module(name)
        _loaded = True
        hints.prepare(pattern for rule in REGISTRY.values()
                      for pattern in (rule.source_hint if isinstance(rule.source_hint, tuple) else (rule.source_hint,))
                      if pattern is not None)
    return [REGISTRY[k] for k in sorted(REGISTRY)]


def get_rule(identifier: str) -> type[Rule] | None:
    identifier = canonical_rule_id(identifier)
    for rule in all_rules():
        if identifier.upper() == rule.id or identifier == rule.slug:
            return rule
    return None


__all__ = ["Rule", "Valid", "Invalid", "all_rules", "get_rule", "canonical_rule_id", "rule_modules", "RULE_ALIASES"]
