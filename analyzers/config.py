"""Configuration: one validated schema for the CLI and the bot.

Read from the first of :data:`CONFIG_FILES_IN_ORDER` that exists: ``.github/torchreview.yml`` (or
``.yaml``), ``.torchreview.toml`` (top-level keys) or ``[tool.torchreview]`` in ``pyproject.toml``.
Every key and value is checked; a typo is an error ``FILE:LINE: KEY: PROBLEM`` (the line when it can
be found), never silently ignored::

    rules:
      select: [TR1, numerics]          # rule ids, id prefixes, slugs, categories, TorchFix codes ("ALL" by default)
      ignore: [TR105, loss-item-every-step]
      severity: {TR702: medium}        # per-rule severity override
    preview: false                     # also run the preview rules (analyzers/levels.py); they never fail a check
    measured_severities: true          # cap at medium the rules whose high/critical were right < 95 % on holdout
    context_severity: true             # one level lower in test code, benchmarks, tiny synthetic data
    paths:
      include: ["src/**", train.py]    # gitignore-style globs, relative to the repository root
      exclude: ["tests/**"]
    min_severity: low                  # drop findings below this
    fail_on: high                      # exit 1 / failing check at or above this
    max_inline_comments: 30            # the App: inline comments per review (the rest go in its body)
    group_across_files: true           # the App: one comment for a finding repeated in several files
    group_rule_from_files: 3           # ... and for a rule found in this many files or more (0: never)
    review_event: comment              # or request_changes when something at or above fail_on is found
    filter: introduced                 # introduced | added | file | {diff_context: 3}
    skip: {drafts: true, labels: ["torchreview:skip"], bots: true,
           title_markers: ["[skip torchreview]", "[torchreview skip]"]}
    cleanup: resolve                   # or delete: what happens to the comment of a fixed finding
    fail_on_errors: true               # the CLI exits 1 when a file could not be analyzed
    file_timeout: 60                   # seconds one file's analysis may take; past it the file is a `timeout` error
    smoke: {enabled: false}            # the GPU smoke runner (see SMOKE_DEFAULTS)

``select``/``ignore``/``severity`` and ``include``/``exclude`` may also be written at the top level
(the original flat form); giving one both ways is an error.
"""
from __future__ import annotations

import copy
import math
import re
import sys
from contextlib import contextmanager
from functools import cached_property
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import pathspec
import yaml

from analyzers import levels
from analyzers.model import Category, Severity
from analyzers.torchfix_map import is_torchfix_selector, rules_for_torchfix, torchfix_scopes, torchfix_selector_problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_FILES_IN_ORDER = (".github/torchreview.yml", ".github/torchreview.yaml", ".torchreview.toml", "pyproject.toml")

REVIEW_EVENTS = ("comment", "request_changes")
FILTERS = ("introduced", "added", "diff_context", "file")
CLEANUPS = ("resolve", "delete")
SMOKE_DEVICES = ("auto", "cpu", "cuda")
SMOKE_TRUST = ("collaborators", "everyone", "maintainers")
SMOKE_DEFAULTS: Mapping[str, Any] = {
    "enabled": False,
    "targets": (),
    "steps": (),  # training steps to run (train.py:train_one_epoch); detected ones run without being listed
    "timeout": 300,
    "max_targets": 16,  # per run: PR code decides how many classes it adds, and each one's report is kept a day
    "memory": "4GiB",
    "device": "auto",
    "trust": "collaborators",
    "regression": {"step_time": 0.25, "memory": 0.25},
}

KeyPath = tuple  # keys (str) and list indices (int)
KeyLine = Callable[[KeyPath], Optional[int]]


class ConfigError(ValueError):
    """Configuration problems, one per line, each with the file (and line and key) it came from."""

    def __init__(self, message: str, line: Optional[int] = None):
        super().__init__(message)
        self.line = line


def _default_smoke() -> dict[str, Any]:
    return copy.deepcopy(dict(SMOKE_DEFAULTS))


# One file's analysis, in seconds: a normal file takes well under one; past the limit the file is reported as a
# ``timeout`` error and the run goes on. The App never waits longer than its own default.
FILE_TIMEOUT_DEFAULT = 60
FILE_TIMEOUT_RANGE = (1, 600)


@dataclass(frozen=True)
class Config:
    select: tuple[str, ...] = ("ALL",)
    preview: bool = False  # run preview rules too; a preview rule selected by its exact id or slug runs anyway
    measured_severities: bool = True  # apply levels.json's severity caps; False: each rule's own severities
    context_severity: bool = True  # lower findings where harm is small (analyzers.levels.context_lowered)
    ignore: tuple[str, ...] = ()
    severity: Mapping[str, Severity] = field(default_factory=dict)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    min_severity: Severity = Severity.LOW
    fail_on: Severity = Severity.HIGH
    max_inline_comments: int = 30
    group_across_files: bool = True  # the App: the same finding in several files of a PR is one comment
    group_rule_from_files: int = 3  # ... and so is a rule found in this many files or more (0: never)
    review_event: str = "comment"
    filter: str = "introduced"
    diff_context_lines: int = 3
    skip_drafts: bool = True
    skip_labels: tuple[str, ...] = ("torchreview:skip",)
    skip_title_markers: tuple[str, ...] = ("[skip torchreview]", "[torchreview skip]")
    skip_bots: bool = True
    cleanup: str = "resolve"
    fail_on_errors: bool = True  # the CLI: exit 1 when a file could not be analyzed
    file_timeout: int = FILE_TIMEOUT_DEFAULT  # seconds per file, in every front end (analyzers.isolation)
    smoke: Mapping[str, Any] = field(default_factory=_default_smoke)
    source: str = "defaults"  # where it came from, for messages and `/review config`

    # ---- rule selection ----------------------------------------------------------------
    def enabled_rules(self, rules: Iterable[type]) -> list[type]:
        return [r for r in rules if _matches(r, self.select) and not _matches(r, self.ignore)
                and (self.preview or not levels.is_preview(r.id) or _names(r, self.select))
                and (not r.opt_in or _names(r, self.select))]

    def rule_options(self, rule_id: str) -> frozenset[str]:
        """The options (``Rule.OPTIONS``) this selection turns on for a rule: TorchFix's scope, for the TOR
        codes selected; none for a selection without TOR codes."""
        return self._rule_options.get(rule_id, frozenset())

    @cached_property
    def _rule_options(self) -> dict[str, frozenset[str]]:
        return torchfix_scopes(self.select, self.ignore)

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
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<config>", *,
                     filename: Optional[str] = None, key_line: Optional[KeyLine] = None) -> "Config":
        """Validate ``data`` (the parsed file). Errors start with ``source``, or ``filename:LINE``
        when ``key_line`` finds the line of the offending key."""
        check = _Checker(source, filename or source, key_line)
        table = check.table(data, (), _TOP_KEYS)
        values = _settings(table, check)
        check.raise_problems()
        return cls(source=source, **values)

    def merged_with_cli(self, *, select=None, ignore=None, min_severity=None, fail_on=None,
                        file_timeout=None, preview=False) -> "Config":
        changes: dict[str, Any] = {"preview": True} if preview else {}
        if file_timeout is not None:
            if not FILE_TIMEOUT_RANGE[0] <= file_timeout <= FILE_TIMEOUT_RANGE[1]:
                raise ConfigError(f"--file-timeout: must be from {FILE_TIMEOUT_RANGE[0]} to {FILE_TIMEOUT_RANGE[1]} "
                                  f"seconds, got {file_timeout}")
            changes["file_timeout"] = file_timeout
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
                problem = selector_problem(selector, selecting=key == "select")
                if problem:
                    raise ConfigError(f"--{key}: {problem}")
        return replace(self, **changes) if changes else self

    # ---- reporting ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The full effective configuration in the documented (nested) form; plain JSON/YAML types."""
        smoke = copy.deepcopy(dict(self.smoke))
        smoke["targets"] = list(smoke["targets"])
        smoke["steps"] = list(smoke["steps"])
        return {
            "rules": {
                "select": list(self.select), "ignore": list(self.ignore),
                "severity": {k: v.label for k, v in self.severity.items()},
            },
            "preview": self.preview,
            "measured_severities": self.measured_severities,
            "context_severity": self.context_severity,
            "paths": {"include": list(self.include), "exclude": list(self.exclude)},
            "min_severity": self.min_severity.label,
            "fail_on": self.fail_on.label,
            "max_inline_comments": self.max_inline_comments,
            "group_across_files": self.group_across_files,
            "group_rule_from_files": self.group_rule_from_files,
            "review_event": self.review_event,
            "filter": self.filter,
            "diff_context_lines": self.diff_context_lines,
            "skip": {
                "drafts": self.skip_drafts, "labels": list(self.skip_labels),
                "title_markers": list(self.skip_title_markers), "bots": self.skip_bots,
            },
            "cleanup": self.cleanup,
            "fail_on_errors": self.fail_on_errors,
            "file_timeout": self.file_timeout,
            "smoke": smoke,
        }

    def describe_source(self) -> str:
        if self.source == "defaults":
            return "defaults (no configuration file found)"
        return self.source


# ---- the schema ------------------------------------------------------------------------------

_RULE_KEYS = ("select", "ignore", "severity")
_PATH_KEYS = ("include", "exclude")
_NESTED_FORMS = {"rules": _RULE_KEYS, "paths": _PATH_KEYS}
_TOP_KEYS = (*_RULE_KEYS, *_PATH_KEYS, *_NESTED_FORMS, "preview", "measured_severities", "context_severity",
             "min_severity", "fail_on", "max_inline_comments",
             "group_across_files", "group_rule_from_files", "review_event", "filter", "diff_context_lines", "skip",
             "cleanup", "fail_on_errors", "file_timeout", "smoke")
_SKIP_KEYS = ("drafts", "labels", "title_markers", "bots")
_REGRESSION_KEYS = ("step_time", "memory")
_MEMORY = re.compile(r"\d+(\.\d+)?\s*([KMGT]i?B?|B)?", re.IGNORECASE)


def _settings(data: Mapping[str, Any], check: "_Checker") -> dict[str, Any]:
    """Config field values from the top-level table; each setting is checked on its own, so that
    every problem of the file is reported at once."""
    written = _unfold_nested_forms(data, check)
    steps: list[Callable[[], dict[str, Any]]] = []
    for key in ("select", "ignore"):
        if key in written:
            steps.append(lambda key=key: {key: check.selectors(*written[key])})
    for key in _PATH_KEYS:
        if key in written:
            steps.append(lambda key=key: {key: check.strings(*written[key])})
    if "severity" in written:
        steps.append(lambda: {"severity": check.severity_overrides(*written["severity"])})
    for key in ("min_severity", "fail_on"):
        if key in data:
            steps.append(lambda key=key: {key: check.severity(data[key], (key,))})
    if "max_inline_comments" in data:
        steps.append(lambda: {"max_inline_comments": check.whole_number(data["max_inline_comments"],
                                                                        ("max_inline_comments",), 0, 100)})
    if "file_timeout" in data:
        steps.append(lambda: {"file_timeout": check.whole_number(data["file_timeout"], ("file_timeout",),
                                                                 *FILE_TIMEOUT_RANGE)})
    if "group_rule_from_files" in data:
        steps.append(lambda: {"group_rule_from_files": check.whole_number(data["group_rule_from_files"],
                                                                          ("group_rule_from_files",), 0, 1000)})
    if "review_event" in data:
        steps.append(lambda: {"review_event": check.choice(data["review_event"], ("review_event",), REVIEW_EVENTS)})
    if "cleanup" in data:
        steps.append(lambda: {"cleanup": check.choice(data["cleanup"], ("cleanup",), CLEANUPS)})
    for key in ("fail_on_errors", "group_across_files", "preview", "measured_severities", "context_severity"):
        if key in data:
            steps.append(lambda key=key: {key: check.boolean(data[key], (key,))})
    steps.append(lambda: _filter_settings(data, check))
    if "skip" in data:
        steps.append(lambda: _skip_settings(data["skip"], check))
    if "smoke" in data:
        steps.append(lambda: {"smoke": _smoke_settings(data["smoke"], check)})
    values: dict[str, Any] = {}
    for step in steps:
        with check.collecting():
            values.update(step())
    return values


def _unfold_nested_forms(data: Mapping[str, Any], check: "_Checker") -> dict[str, tuple[Any, KeyPath]]:
    """``rules.select`` → ``select`` etc.: each setting's value and the key path it was written at."""
    written = {key: (value, (key,)) for key, value in data.items() if key not in _NESTED_FORMS}
    for section, keys in _NESTED_FORMS.items():
        if section not in data:
            continue
        with check.collecting():
            for key, value in check.table(data[section], (section,), keys).items():
                if key in data:
                    raise check.error((section, key), f"{section}.{key}: also given as the top-level {key!r}; use one form")
                written[key] = (value, (section, key))
    return written


def _filter_settings(data: Mapping[str, Any], check: "_Checker") -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "filter" in data:
        value = data["filter"]
        if isinstance(value, Mapping):
            table = check.table(value, ("filter",), ("diff_context",))
            if not table:
                raise check.error(("filter",), "filter: a table must be {diff_context: N}")
            values["filter"] = "diff_context"
            values["diff_context_lines"] = check.whole_number(table["diff_context"], ("filter", "diff_context"), 0, 50)
        else:
            values["filter"] = check.choice(value, ("filter",), FILTERS)
    if "diff_context_lines" in data:
        if "diff_context_lines" in values:
            raise check.error(("diff_context_lines",),
                              "diff_context_lines: also given as filter.diff_context; use one form")
        values["diff_context_lines"] = check.whole_number(data["diff_context_lines"], ("diff_context_lines",), 0, 50)
    return values


def _skip_settings(value: Any, check: "_Checker") -> dict[str, Any]:
    table = check.table(value, ("skip",), _SKIP_KEYS)
    values: dict[str, Any] = {}
    for key in ("drafts", "bots"):
        if key in table:
            with check.collecting():
                values[f"skip_{key}"] = check.boolean(table[key], ("skip", key))
    for key in ("labels", "title_markers"):
        if key in table:
            with check.collecting():
                values[f"skip_{key}"] = check.strings(table[key], ("skip", key))
    return values


def _smoke_settings(value: Any, check: "_Checker") -> dict[str, Any]:
    table = check.table(value, ("smoke",), tuple(SMOKE_DEFAULTS))
    smoke = _default_smoke()
    checks: dict[str, Callable[[Any], Any]] = {
        "enabled": lambda v: check.boolean(v, ("smoke", "enabled")),
        "targets": lambda v: _smoke_targets(v, check),
        "steps": lambda v: _smoke_steps(v, check),
        "timeout": lambda v: check.whole_number(v, ("smoke", "timeout"), 1, 3600),
        "max_targets": lambda v: check.whole_number(v, ("smoke", "max_targets"), 1, 100),
        "memory": lambda v: check.memory(v, ("smoke", "memory")),
        "device": lambda v: check.choice(v, ("smoke", "device"), SMOKE_DEVICES),
        "trust": lambda v: check.choice(v, ("smoke", "trust"), SMOKE_TRUST),
    }
    for key, convert in checks.items():
        if key in table:
            with check.collecting():
                smoke[key] = convert(table[key])
    if "regression" in table:
        with check.collecting():
            regression = check.table(table["regression"], ("smoke", "regression"), _REGRESSION_KEYS)
            for key, fraction in regression.items():
                with check.collecting():
                    smoke["regression"][key] = check.fraction(fraction, ("smoke", "regression", key))
    return smoke


_TASKS = ("classification", "language_model", "regression", "custom")
# The table form of a smoke target (docs/runner.md, "Configuring smoke targets"): how to build, feed and train it. The
# loss's target tensor is ``loss_target``: ``target`` names the model to build.
_TARGET_KEYS = ("target", "factory", "input", "output", "task", "loss", "loss_target", "num_classes")
# A step table may say ``function`` for ``step``; ``args`` gives values of the step's parameters by name.
_STEP_KEYS = ("step", "function", "model", "args", "factory", "input", "output", "task", "loss", "loss_target",
              "num_classes")
_INPUT_KEYS = ("shape", "dtype", "low", "high", "fill", "batch_axis", "name", "tuple")
_OUTPUT_KEYS = ("batch_axis", "select")
_INPUT_DTYPES = ("float", "float32", "float16", "half", "bfloat16", "float64", "double", "long", "int64", "int",
                 "int32", "bool")
_REFERENCE = re.compile(r"[\w./-]+(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")


def _smoke_targets(value: Any, check: "_Checker") -> tuple:
    """Each target: "models/net.py:build_model", or a table that also says how to build, feed and train it:
    {target = "models/net.py:Net", factory = "models/net.py:build", input = {shape = [3, 32, 32]},
    output = {batch_axis = 0}, task = "classification", loss = "torch.nn.functional:cross_entropy",
    loss_target = {shape = [], dtype = "long", high = 10}, num_classes = 10}."""
    return _smoke_entries(value, ("smoke", "targets"), check, "target", _TARGET_KEYS)


def _smoke_steps(value: Any, check: "_Checker") -> tuple:
    """Each training step to run: "train.py:train_one_epoch", or a table naming the model it trains and how to
    build it (the keys of a target table, with ``step`` (or ``function``) and ``model`` for ``target``), and
    ``args``: values of the step's parameters by name (``{cuda = false, log_interval = 10}``; a table for a
    config parameter gives its attributes: ``{args = {log_interval = 10}}``)."""
    return _smoke_entries(value, ("smoke", "steps"), check, "step", _STEP_KEYS)


def _smoke_entries(value: Any, path: KeyPath, check: "_Checker", name_key: str, known: tuple) -> tuple:
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise check.error(path, f"{_dotted(path)}: must be a list of {name_key} strings or tables")
    entries = []
    for index, item in enumerate(value):
        where = (*path, index)
        with check.collecting():
            if isinstance(item, str):
                entries.append(_reference(item, where, check, "path/to/file.py[:Name]"))
                continue
            entry = check.table(item, where, known)
            if "function" in entry:
                if name_key in entry:
                    raise check.error((*where, "function"), f"{_dotted((*where, 'function'))}: give the step once, "
                                                            f"as {name_key} or as function, not both")
                entry[name_key] = entry.pop("function")
            if name_key not in entry and not (name_key == "target" and "factory" in entry):
                raise check.error(where, f"{_dotted(where)}: needs {name_key} = \"path/to/file.py:Name\"")
            for key, convert in _ENTRY_CHECKS.items():
                if key in entry:
                    with check.collecting():
                        entry[key] = convert(entry[key], (*where, key), check)
            entries.append(dict(entry))
    return tuple(entries)


def _reference(value: Any, path: KeyPath, check: "_Checker", form: str = "path/to/file.py:name") -> str:
    """A file, optionally with ``:name`` in it; a form that names something (``:factory``) must have the name."""
    if not isinstance(value, str) or not _REFERENCE.fullmatch(value.strip()) or \
            ":" not in value and form.endswith((":factory", ":callable")):
        raise check.error(path, f"{_dotted(path)}: must be \"{form}\", got {value!r}")
    return value.strip()


def _axis(value: Any, path: KeyPath, check: "_Checker", *, allow_none: bool) -> Optional[int]:
    if allow_none and (value is False or value is None or value == "none"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 8:
        extra = ", or \"none\" when the output has no batch axis" if allow_none else ""
        raise check.error(path, f"{_dotted(path)}: must be a whole number from 0 to 8{extra}, got {value!r}")
    return value


def _tensor_spec(value: Any, path: KeyPath, check: "_Checker", *, inputs: bool = True) -> dict:
    """One input (or loss-target) tensor, described without its batch axis; an input may instead be a
    ``tuple`` of tensors (an RNN's hidden state (h, c))."""
    known = _INPUT_KEYS if inputs else tuple(k for k in _INPUT_KEYS if k not in ("name", "tuple"))
    spec = check.table(value, path, known)
    if "tuple" in spec:
        items = spec["tuple"]
        if not isinstance(items, list) or not items:
            raise check.error((*path, "tuple"), f"{_dotted((*path, 'tuple'))}: must be a non-empty list of tensor "
                                                "tables {shape, dtype, batch_axis}")
        extra = sorted(set(spec) - {"tuple", "name"})
        if extra:
            raise check.error((*path, extra[0]), f"{_dotted((*path, extra[0]))}: a tuple input takes only tuple "
                                                 "and name; give each tensor of the tuple its own shape and dtype")
        spec["tuple"] = [_tensor_spec(item, (*path, "tuple", i), check, inputs=False) for i, item in enumerate(items)]
    else:
        shape = spec.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                                  for d in shape):
            raise check.error((*path, "shape") if "shape" in spec else path,
                              f"{_dotted((*path, 'shape'))}: must be a list of sizes (whole numbers >= 1) without "
                              f"the batch axis, got {shape!r}")
        if "batch_axis" in spec:
            spec["batch_axis"] = _axis(spec["batch_axis"], (*path, "batch_axis"), check, allow_none=False)
            if spec["batch_axis"] > len(shape):
                raise check.error((*path, "batch_axis"), f"{_dotted((*path, 'batch_axis'))}: {spec['batch_axis']} "
                                                         f"is past the end of a {len(shape) + 1}-d tensor")
    if "dtype" in spec:
        spec["dtype"] = check.choice(str(spec["dtype"]).replace("torch.", ""), (*path, "dtype"), _INPUT_DTYPES)
    for key in ("low", "high"):
        if key in spec and (isinstance(spec[key], bool) or not isinstance(spec[key], int)):
            raise check.error((*path, key), f"{_dotted((*path, key))}: must be a whole number, got {spec[key]!r}")
    if "low" in spec and "high" in spec and spec["high"] <= spec["low"]:
        raise check.error((*path, "high"), f"{_dotted((*path, 'high'))}: must be above low ({spec['low']}), "
                                           f"got {spec['high']!r}")
    if "fill" in spec and (isinstance(spec["fill"], bool) or not isinstance(spec["fill"], (int, float))):
        raise check.error((*path, "fill"), f"{_dotted((*path, 'fill'))}: must be a number, got {spec['fill']!r}")
    if "name" in spec and not (isinstance(spec["name"], str) and spec["name"].isidentifier()):
        raise check.error((*path, "name"), f"{_dotted((*path, 'name'))}: must be the forward's parameter name, "
                                           f"got {spec['name']!r}")
    return spec


def _inputs(value: Any, path: KeyPath, check: "_Checker") -> Any:
    if isinstance(value, Mapping):
        return _tensor_spec(value, path, check)
    if isinstance(value, list) and value:
        return [_tensor_spec(item, (*path, i), check) for i, item in enumerate(value)]
    raise check.error(path, f"{_dotted(path)}: must be a table {{shape, dtype, low, high, batch_axis}} or a list of "
                            "them, one per forward argument")


def _output(value: Any, path: KeyPath, check: "_Checker") -> dict:
    output = check.table(value, path, _OUTPUT_KEYS)
    if "batch_axis" in output:
        output["batch_axis"] = _axis(output["batch_axis"], (*path, "batch_axis"), check, allow_none=True)
    select = output.get("select")
    if "select" in output and (isinstance(select, bool) or not isinstance(select, (int, str))):
        raise check.error((*path, "select"), f"{_dotted((*path, 'select'))}: must be the index (tuple output) or key "
                                             f"(dict output) of the tensor to train on, got {select!r}")
    return output


_STEP_ARGUMENT_VALUES = (bool, int, float, str, type(None))


def _step_arguments(value: Any, path: KeyPath, check: "_Checker") -> dict:
    """Values of a step's parameters by name: numbers, strings, booleans, lists of them, or a table (a config
    parameter's attributes)."""
    if not isinstance(value, Mapping) or not value:
        raise check.error(path, f"{_dotted(path)}: must be a table of the step's parameter names and their values, "
                                f"e.g. {{cuda = false, log_interval = 10}}, got {value!r}")

    def plain(item: Any, where: KeyPath, nested: bool) -> Any:
        if isinstance(item, _STEP_ARGUMENT_VALUES):
            return item
        if isinstance(item, (list, tuple)):
            return [plain(element, (*where, i), True) for i, element in enumerate(item)]
        if isinstance(item, Mapping) and not nested:
            return {str(k): plain(v, (*where, str(k)), True) for k, v in item.items()}
        raise check.error(where, f"{_dotted(where)}: must be a number, string, boolean, list, or (for a config "
                                 f"parameter) a table of attributes, got {_kind(item)}")

    arguments = {}
    for key, item in value.items():
        if not (isinstance(key, str) and key.isidentifier()):
            raise check.error((*path, str(key)), f"{_dotted((*path, str(key)))}: {key!r} is not a parameter name")
        arguments[key] = plain(item, (*path, key), False)
    return arguments


def _num_classes_value(value: Any, path: KeyPath, check: "_Checker") -> int:
    return check.whole_number(value, path, 1, 10_000_000)


_ENTRY_CHECKS: dict[str, Callable[[Any, KeyPath, "_Checker"], Any]] = {
    "target": lambda v, p, c: _reference(v, p, c, "path/to/file.py[:NameOrFactory]"),
    "step": lambda v, p, c: _reference(v, p, c, "path/to/file.py[:function]"),
    "model": lambda v, p, c: _reference(v, p, c, "path/to/file.py[:NameOrFactory]"),
    "factory": lambda v, p, c: _reference(v, p, c, "path/to/file.py:factory"),
    "loss": lambda v, p, c: _reference(v, p, c, "module.path:callable"),
    "task": lambda v, p, c: c.choice(v, p, _TASKS),
    "input": _inputs,
    "output": _output,
    "loss_target": lambda v, p, c: _tensor_spec(v, p, c, inputs=False),
    "num_classes": _num_classes_value,
    "args": _step_arguments,
}


class _Checker:
    """Type checks that raise a ConfigError naming the file, the line (when found) and the key."""

    def __init__(self, source: str, filename: str, key_line: Optional[KeyLine]):
        self.source, self.filename, self.key_line = source, filename, key_line
        self.problems: list[ConfigError] = []

    def error(self, path: KeyPath, message: str) -> ConfigError:
        line = self.key_line(path) if self.key_line and path else None
        return ConfigError(f"{self.filename}:{line}: {message}" if line else f"{self.source}: {message}", line)

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Record a problem of one setting and go on with the next."""
        try:
            yield
        except ConfigError as problem:
            self.problems.append(problem)

    def raise_problems(self) -> None:
        """One ConfigError listing every problem, one per line, in file order."""
        if self.problems:
            ordered = sorted(self.problems, key=lambda p: p.line if p.line is not None else math.inf)
            raise ConfigError("\n".join(str(p) for p in ordered), ordered[0].line)

    def table(self, value: Any, path: KeyPath, known: Iterable[str]) -> dict[str, Any]:
        """The known keys of a table; each unknown key is a problem (recorded, not raised)."""
        name = _dotted(path) or "configuration"
        if not isinstance(value, Mapping):
            raise self.error(path, f"{name}: must be a table (mapping), got {_kind(value)}")
        known = tuple(known)
        for key in value:
            if str(key) not in known:
                self.problems.append(self.error((*path, str(key)), f"{_dotted((*path, str(key)))}: unknown key "
                                                                   f"{str(key)!r} (known keys: {', '.join(sorted(known))})"))
        return {str(k): v for k, v in value.items() if str(k) in known}

    def strings(self, value: Any, path: KeyPath) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self.error(path, f"{_dotted(path)}: must be a list of strings")
        return tuple(v.strip() for v in value)

    def selectors(self, value: Any, path: KeyPath) -> tuple[str, ...]:
        selectors = self.strings(value, path)
        for selector in selectors:
            problem = selector_problem(selector, selecting=path[-1] == "select")
            if problem:
                raise self.error(path, f"{_dotted(path)}: {problem}")
        return selectors

    def severity(self, value: Any, path: KeyPath) -> Severity:
        try:
            return Severity.parse(value)
        except ValueError as exc:
            raise self.error(path, f"{_dotted(path)}: {exc}") from None

    def severity_overrides(self, value: Any, path: KeyPath) -> dict[str, Severity]:
        if not isinstance(value, Mapping):
            raise self.error(path, f"{_dotted(path)}: must be a table of rule id = severity")
        overrides = {}
        for rule_id, severity in value.items():
            resolved = _resolve_rule_id(str(rule_id))
            if resolved is None:
                raise self.error((*path, str(rule_id)), f"{_dotted(path)}: {str(rule_id)!r} is not a rule id or slug")
            overrides[resolved] = self.severity(severity, (*path, str(rule_id)))
        return overrides

    def boolean(self, value: Any, path: KeyPath) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, f"{_dotted(path)}: must be true or false, got {value!r}")
        return value

    def whole_number(self, value: Any, path: KeyPath, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(path, f"{_dotted(path)}: must be a whole number from {low} to {high}, got {value!r}")
        return value

    def fraction(self, value: Any, path: KeyPath) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise self.error(path, f"{_dotted(path)}: must be a non-negative fraction such as 0.25, got {value!r}")
        return float(value)

    def choice(self, value: Any, path: KeyPath, choices: Iterable[str]) -> str:
        choices = tuple(choices)
        normalized = value.strip().lower() if isinstance(value, str) else value
        if normalized not in choices:
            raise self.error(path, f"{_dotted(path)}: must be one of {', '.join(sorted(choices))}, got {value!r}")
        return normalized

    def memory(self, value: Any, path: KeyPath) -> "int | str":
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str) and _MEMORY.fullmatch(value.strip()):
            return value.strip()
        raise self.error(path, f"{_dotted(path)}: must be a size such as \"4GiB\" or a number of MiB, got {value!r}")


def _dotted(path: KeyPath) -> str:
    """``smoke.targets[0].input``: list indices in brackets."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def _kind(value: Any) -> str:
    return {list: "a list", tuple: "a list", str: "a string", bool: "true/false", type(None): "nothing"}.get(
        type(value), type(value).__name__)


# ---- files -----------------------------------------------------------------------------------


def parse_config_text(text: str, filename: str) -> Optional[Config]:
    """Config from a file's text, by its name: ``*.yml``/``*.yaml`` (YAML), ``pyproject.toml`` (its
    ``[tool.torchreview]`` section; None when it has none) or ``*.toml`` (top-level keys)."""
    name = Path(filename).name
    if name.endswith((".yml", ".yaml")):
        return _parse_yaml(text, filename)
    if name.endswith(".toml"):
        return parse_toml_config(text, filename)
    raise ConfigError(f"{filename}: not a configuration file (use .yml, .yaml or .toml)")


def parse_toml_config(text: str, filename: str) -> Optional[Config]:
    """Config from the text of a ``.torchreview.toml`` or ``pyproject.toml``; None if it has none."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_syntax_error(exc, text, filename) from None
    if Path(filename).name == "pyproject.toml":
        section = data.get("tool", {}).get("torchreview")
        if section is None:
            return None
        return Config.from_mapping(section, f"{filename} [tool.torchreview]", filename=filename,
                                   key_line=lambda path: _toml_key_line(text, ("tool", "torchreview", *path)))
    return Config.from_mapping(data, filename, key_line=lambda path: _toml_key_line(text, path))


def _parse_yaml(text: str, filename: str) -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _yaml_syntax_error(exc, filename) from None
    if data is None:  # an empty file (or only comments): the defaults
        return Config(source=filename)
    return Config.from_mapping(data, filename, key_line=lambda path: _yaml_key_line(text, path))


def _toml_syntax_error(exc: Exception, text: str, filename: str) -> ConfigError:
    message = str(exc)
    located = re.fullmatch(r"(?s)(.*) \(at line (\d+), column (\d+)\)", message)
    if located:
        problem, line, column = located.groups()
        return ConfigError(f"{filename}:{line}: invalid TOML: {problem} (column {column})")
    at_end = re.fullmatch(r"(?s)(.*) \(at end of document\)", message)
    if at_end:
        last_line = text.count("\n") + (0 if text.endswith("\n") else 1)
        return ConfigError(f"{filename}:{max(last_line, 1)}: invalid TOML: {at_end.group(1)} (at end of file)")
    return ConfigError(f"{filename}: invalid TOML: {message}")


def _yaml_syntax_error(exc: yaml.YAMLError, filename: str) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return ConfigError(f"{filename}: invalid YAML: {problem}")
    return ConfigError(f"{filename}:{mark.line + 1}: invalid YAML: {problem} (column {mark.column + 1})")


def _yaml_key_line(text: str, path: KeyPath) -> Optional[int]:
    """1-based line of the deepest key of ``path`` found in the YAML document."""
    node, line = yaml.compose(text, Loader=yaml.SafeLoader), None
    for key in path:
        if isinstance(key, int):
            if not isinstance(node, yaml.SequenceNode) or key >= len(node.value):
                break
            node = node.value[key]
            line = node.start_mark.line + 1
            continue
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        if match is None:
            break
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def _toml_key_line(text: str, path: KeyPath) -> Optional[int]:
    """1-based line of the deepest key of ``path``: a line starting with the key (``key =``,
    ``key.sub =``) or a table header ending in it, searched in order. Good enough for messages."""
    lines, start, found = text.splitlines(), 0, None
    for key in path:
        if isinstance(key, int):  # the key-th item on a line of its own: a string, an inline table, a [[...]] header
            items = [i for i in range(start, len(lines)) if lines[i].strip().startswith(("{", "[[", '"', "'"))]
            if key >= len(items):
                break
            start = found = items[key]
            continue
        hit = next((i for i in range(start, len(lines)) if _toml_line_defines(lines[i], key)), None)
        if hit is None:
            break
        start = found = hit
    return None if found is None else found + 1


def _toml_line_defines(line: str, key: str) -> bool:
    stripped = line.strip()
    header = re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?", stripped)
    if header:
        return key in [part.strip().strip("\"'") for part in header.group(1).split(".")]
    return re.match(rf"[\"']?{re.escape(key)}[\"']?\s*[=.]", stripped) is not None


def load_config_file(path: Path) -> Config:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    config = parse_config_text(text, str(path))
    if config is None:
        raise ConfigError(f"{path}: has no [tool.torchreview] section")
    return config


def find_config(start: Path) -> Config:
    """The nearest configuration, walking up to the repository root: in each directory the first
    of :data:`CONFIG_FILES_IN_ORDER` that exists (a pyproject.toml only with a section) wins."""
    start = start.resolve()
    for directory in [start, *start.parents]:
        for name in CONFIG_FILES_IN_ORDER:
            candidate = directory / name
            if candidate.is_file():
                config = parse_config_text(candidate.read_text(encoding="utf-8"), _shown(candidate))
                if config is not None:
                    return config
        if (directory / ".git").exists():
            break
    return Config()


def _shown(path: Path) -> str:
    """A path as messages show it: relative to the working directory when it is below it."""
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------


def _severity(value: Any, where: str) -> Severity:
    try:
        return Severity.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _matches(rule: type, selectors: Iterable[str]) -> bool:
    from analyzers.rules import canonical_rule_id

    for selector in selectors:
        s = canonical_rule_id(selector.strip())
        upper = s.upper()
        if upper == "ALL" or (upper.startswith("TR") and rule.id.startswith(upper)):
            return True
        if is_torchfix_selector(s) and rule.id in rules_for_torchfix(s):
            return True
        if s == rule.slug or s == rule.category.value:
            return True
    return False


def _names(rule: type, selectors: Iterable[str]) -> bool:
    """Whether a selector names the rule itself (its id, slug or an alias, or a TorchFix code covered by it), not an
    id prefix or a category: a preview rule so named runs, and so does an opt-in rule."""
    from analyzers.rules import canonical_rule_id

    return any(canonical_rule_id(s.strip()) in (rule.id, rule.slug) or s.strip().upper() == rule.id
               # a TorchFix code or prefix names the rules covering its codes: TorchFix has no preview level, and
               # a user who selected TOR4 asked for every TOR4xx check, as flake8 reads it
               or is_torchfix_selector(s) and rule.id in rules_for_torchfix(s.strip())
               for s in selectors)


def selector_problem(selector: str, *, selecting: bool) -> Optional[str]:
    """Why a select/ignore entry is unusable, or None: ours (rule id, id prefix, slug, category, ALL) or a
    TorchFix code or prefix, through :mod:`analyzers.torchfix_map`."""
    from analyzers.rules import all_rules

    if is_torchfix_selector(selector):
        return torchfix_selector_problem(selector, selecting)
    if selector.upper() == "ALL" or any(_matches(r, [selector]) for r in all_rules()) or \
            selector in {c.value for c in Category}:
        return None
    return f"{selector!r} matches no rule id, prefix, slug, category or TorchFix code"


def _resolve_rule_id(name: str) -> Optional[str]:
    from analyzers.rules import all_rules, canonical_rule_id

    name = canonical_rule_id(name)
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
