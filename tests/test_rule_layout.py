"""The catalog's layout: one rule per module, in the folder of its category, found without a list.

A rule's id prefix, its ``Category`` and its folder are one thing (``Category.id_prefixes``, ``Category.package``),
so the catalog reads off the tree: ``analyzers/rules/<category>/<slug>.py``.
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from analyzers.model import Category
from analyzers.rules import all_rules, rule_modules
from analyzers.rules.base import REGISTRY, Rule

RULES = Path(__file__).resolve().parents[1] / "analyzers" / "rules"


def _rules_defined_in(module) -> list[type[Rule]]:
    return [value for value in vars(module).values() if inspect.isclass(value) and issubclass(value, Rule)
            and value.__module__ == module.__name__ and getattr(value, "id", None) is not None]


@pytest.mark.parametrize("name", rule_modules())
def test_every_rule_module_registers_exactly_one_rule(name):
    defined = _rules_defined_in(importlib.import_module(name))
    assert len(defined) == 1, f"{name} defines {[r.__name__ for r in defined]}: one rule per module"
    assert REGISTRY[defined[0].id] is defined[0]


@pytest.mark.parametrize("path", sorted(RULES.glob("*/_*.py")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shared_modules_register_no_rule(path):
    if path.name == "__init__.py":
        return
    module = importlib.import_module(f"analyzers.rules.{path.parent.name}.{path.stem}")
    assert not _rules_defined_in(module), f"{path}: a rule goes in a module of its own, named after its slug"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
def test_every_rule_lives_in_its_category_folder_named_after_its_slug(rule):
    assert rule.id.startswith(rule.category.id_prefixes), \
        f"{rule.id}'s id prefix says another category than {rule.category.value}"
    expected = f"analyzers.rules.{rule.category.package}.{rule.slug.replace('-', '_')}"
    assert rule.__module__ == expected, f"{rule.id} is in {rule.__module__}, not {expected}"


def test_discovery_finds_every_rule_and_nothing_else():
    on_disk = sorted(f"analyzers.rules.{p.parent.name}.{p.stem}" for p in RULES.glob("*/[!_]*.py"))
    assert rule_modules() == on_disk
    assert len(rule_modules()) == len(all_rules()) == len(REGISTRY)
    assert [r.id for r in all_rules()] == sorted(REGISTRY)


def test_the_catalog_holds_only_category_folders():
    folders = {p.name for p in RULES.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {category.package for category in Category}
    assert {p.name for p in RULES.glob("*.py")} == {"__init__.py", "base.py"}, "a rule goes in its category folder"


def test_id_prefixes_of_categories_do_not_overlap():
    prefixes = [(prefix, category) for category in Category for prefix in category.id_prefixes]
    for prefix, category in prefixes:
        for other, other_category in prefixes:
            if other_category is not category:
                assert not other.startswith(prefix), f"{other} ({other_category.value}) is inside {prefix}"
