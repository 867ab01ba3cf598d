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


def all_rules() -> list[type[Rule]]:
    global _loaded
    if not _loaded:
        for name in _MODULES:
            importlib.import_module(f"analyzers.rules.{name}")
        _loaded = True
    return [REGISTRY[k] for k in sorted(REGISTRY)]


def get_rule(identifier: str) -> type[Rule] | None:
    for rule in all_rules():
        if identifier.upper() == rule.id or identifier == rule.slug:
            return rule
    return None


__all__ = ["Rule", "Valid", "Invalid", "all_rules", "get_rule"]
