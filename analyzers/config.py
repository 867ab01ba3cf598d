"""Configuration: one validated schema for the CLI and the bot.

Read from ``[tool.torchreview]`` in ``pyproject.toml`` or from a ``.torchreview.toml`` (top-level
keys). Every key is checked; a typo is an error that names the key and the file, never
silently ignored::

    [tool.torchreview]
    select = ["TR1", "numerics"]        # rule ids, id prefixes, slugs or categories ("ALL" by default)
    ignore = ["TR105", "per-step-sync-for-logging"]
    severity = { TR702 = "medium" }    # per-rule severity override
    include = ["src/**", "train.py"]    # gitignore-style globs, relative to the repository root
    exclude = ["tests/**"]
    min_severity = "low"                # drop findings below this
    fail_on = "high"                    # exit 1 / failing check at or above this
    max_inline_comments = 30            # the App: inline comments per review (the rest go in its body)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import pathspec

from analyzers.model import Category, Severity

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_FILES = (".torchreview.toml", "pyproject.toml")


class ConfigError(ValueError):
    """A configuration problem, with the file (and key) it came from."""


@dataclass(frozen=True)
class Config:
    select: tuple[str, ...] = ("ALL",)
    ignore: tuple[str, ...] = ()
    severity: Mapping[str, Severity] = field(default_factory=dict)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    min_severity: Severity = Severity.LOW
    fail_on: Severity = Severity.HIGH
    max_inline_comments: int = 30
    source: str = "defaults"  # where it came from, for messages and `/review config`

    # ---- rule selection ----------------------------------------------------------------
    def enabled_rules(self, rules: Iterable[type]) -> list[type]:
        return [r for r in rules if _matches(r, self.select) and not _matches(r, self.ignore)]

    def severity_for(self, rule_id: str, default: Severity) -> Severity:
        return self.severity.get(rule_id, default)

    # ---- paths --------------------------------------------------------------------------
    def path_included(self, path: str) -> bool:
        if self.include and not _spec(self.include).match_file(path):
            return False
        return not self.path_excluded(path)

    def path_excluded(self, path: str) -> bool:
        return bool(self.exclude) and _spec(self.exclude).match_file(path)

    # ---- loading ------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<config>") -> "Config":
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: configuration must be a table, got {type(data).__name__}")
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise ConfigError(f"{source}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(_KEYS))})")
        values: dict[str, Any] = {"source": source}
        for key in ("select", "ignore", "include", "exclude"):
            if key in data:
                values[key] = tuple(_string_list(data[key], f"{source}: {key}"))
        for key in ("select", "ignore"):
            for selector in values.get(key, ()):
                if not _known_selector(selector):
                    raise ConfigError(f"{source}: {key}: {selector!r} matches no rule id, prefix, slug or category")
        for key in ("min_severity", "fail_on"):
            if key in data:
                values[key] = _severity(data[key], f"{source}: {key}")
        if "max_inline_comments" in data:
            value = data["max_inline_comments"]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
                raise ConfigError(f"{source}: max_inline_comments must be a whole number from 0 to 100, got {value!r}")
            values["max_inline_comments"] = value
        if "severity" in data:
            table = data["severity"]
            if not isinstance(table, Mapping):
                raise ConfigError(f"{source}: severity must be a table of rule id = severity")
            overrides = {}
            for rule_id, value in table.items():
                resolved = _resolve_rule_id(str(rule_id))
                if resolved is None:
                    raise ConfigError(f"{source}: severity: {rule_id!r} is not a rule id or slug")
                overrides[resolved] = _severity(value, f"{source}: severity.{rule_id}")
            values["severity"] = overrides
        return cls(**values)

    def merged_with_cli(self, *, select=None, ignore=None, min_severity=None, fail_on=None) -> "Config":
        changes: dict[str, Any] = {}
        if select:
            changes["select"] = tuple(select)
        if ignore:
            changes["ignore"] = tuple(self.ignore) + tuple(ignore)
        if min_severity:
            changes["min_severity"] = _severity(min_severity, "--min-severity")
        if fail_on:
            changes["fail_on"] = _severity(fail_on, "--fail-on")
        for key in ("select", "ignore"):
            for selector in changes.get(key, ()):
                if not _known_selector(selector):
                    raise ConfigError(f"--{key}: {selector!r} matches no rule id, prefix, slug or category")
        return replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        return {
            "select": list(self.select), "ignore": list(self.ignore),
            "severity": {k: v.label for k, v in self.severity.items()},
            "include": list(self.include), "exclude": list(self.exclude),
            "min_severity": self.min_severity.label, "fail_on": self.fail_on.label,
            "max_inline_comments": self.max_inline_comments,
        }


_KEYS = {"select", "ignore", "severity", "include", "exclude", "min_severity", "fail_on", "max_inline_comments"}


def parse_toml_config(text: str, filename: str) -> Optional[Config]:
    """Config from the text of a ``.torchreview.toml`` or ``pyproject.toml``; None if it has none."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{filename}: invalid TOML: {exc}") from None
    if Path(filename).name == "pyproject.toml":
        section = data.get("tool", {}).get("torchreview")
        if section is None:
            return None
        return Config.from_mapping(section, f"{filename} [tool.torchreview]")
    return Config.from_mapping(data, filename)


def load_config_file(path: Path) -> Config:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    config = parse_toml_config(text, str(path))
    if config is None:
        raise ConfigError(f"{path}: has no [tool.torchreview] section")
    return config


def find_config(start: Path) -> Config:
    """The nearest ``.torchreview.toml`` or ``pyproject.toml`` with a section, walking up."""
    start = start.resolve()
    for directory in [start, *start.parents]:
        for name in CONFIG_FILES:
            candidate = directory / name
            if candidate.is_file():
                config = parse_toml_config(candidate.read_text(encoding="utf-8"), str(candidate))
                if config is not None:
                    return config
        if (directory / ".git").exists():
            break
    return Config()


# ---------------------------------------------------------------------------------------------


def _string_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return [v.strip() for v in value]


def _severity(value: Any, where: str) -> Severity:
    try:
        return Severity.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _matches(rule: type, selectors: Iterable[str]) -> bool:
    for selector in selectors:
        s = selector.strip()
        upper = s.upper()
        if upper == "ALL" or (upper.startswith("TR") and rule.id.startswith(upper)):
            return True
        if s == rule.slug or s == rule.category.value:
            return True
    return False


def _known_selector(selector: str) -> bool:
    from analyzers.rules import all_rules

    return selector.upper() == "ALL" or any(_matches(r, [selector]) for r in all_rules()) or \
        selector in {c.value for c in Category}


def _resolve_rule_id(name: str) -> Optional[str]:
    from analyzers.rules import all_rules

    for rule in all_rules():
        if name.upper() == rule.id or name == rule.slug:
            return rule.id
    return None


_SPECS: dict[tuple[str, ...], pathspec.PathSpec] = {}


def _spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    spec = _SPECS.get(patterns)
    if spec is None:
        spec = _SPECS[patterns] = pathspec.PathSpec.from_lines("gitignore", patterns)
    return spec
