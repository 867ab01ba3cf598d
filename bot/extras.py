"""Which of torchreview's optional parts (the extras of pyproject.toml) this install has.

The base install is the CLI, the pre-commit hook, the Action and the language server; the App's server
stack, the smoke runner and the demo are extras. A command
that needs one checks it first, so a light install answers "pip install 'torchreview[app]'" rather than
a traceback from an import. The extras are read back from the installed package's metadata, so
pyproject.toml stays the one place that lists them.
"""
from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution, requires

PACKAGE = "torchreview"
# What each command needs beyond the base install.
COMMAND_EXTRAS = {
    "serve": "app",
    "worker": "app",
    "feedback": "app",
    "recover": "app",
    "smoke": "runner",
    "demo": "demo",
}
WHAT = {
    "app": "the GitHub App's server stack",
    "runner": "the smoke runner (torch)",
    "demo": "the demo's GitHub emulator",
}

_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_ONLY_EXTRA = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")


class MissingExtra(RuntimeError):
    pass


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_requirements(extra: str, _seen: frozenset = frozenset()) -> list[str]:
    """The distributions ``torchreview[extra]`` brings, self-references (``torchreview[app]``) followed;
    empty when torchreview is not installed (a source tree on ``sys.path``), where nothing can be told."""
    try:
        declared = requires(PACKAGE) or []
    except PackageNotFoundError:
        return []
    names: list[str] = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        selected = _ONLY_EXTRA.match(marker)
        if not selected or _normalize(selected.group(1)) != _normalize(extra):
            continue  # another extra, or a base requirement (which pip installed with the package)
        match = _REQUIREMENT.match(requirement)
        if not match:
            continue
        name, nested = match.group(1), match.group(2)
        if _normalize(name) == PACKAGE:
            for inner in filter(None, (e.strip() for e in (nested or "").split(","))):
                if inner not in _seen:
                    names += extra_requirements(inner, _seen | {extra})
        else:
            names.append(name)
    return list(dict.fromkeys(names))


def missing(extra: str) -> list[str]:
    """The distributions of ``extra`` that are not installed."""
    absent = []
    for name in extra_requirements(extra):
        try:
            distribution(name)
        except PackageNotFoundError:
            absent.append(name)
    return absent


def require_for(command: str) -> None:
    """Raise MissingExtra, naming the extra to install, when ``command`` needs one this install lacks."""
    extra = COMMAND_EXTRAS.get(command)
    absent = missing(extra) if extra else []
    if absent:
        raise MissingExtra(
            f"`torchreview {command}` needs {WHAT[extra]}, which this install lacks ({', '.join(absent)}): "
            f"pip install '{PACKAGE}[{extra}]' (from a clone: pip install '.[{extra}]'; from git: "
            f"pip install '{PACKAGE}[{extra}] @ git+https://github.com/torchreview/torchreview@COMMIT')")
