"""``torchreview migrate-torchfix``: a repository's TorchFix configuration rewritten into ours.

Where TorchFix is configured: flake8's ``[flake8]`` section (``.flake8``, ``setup.cfg``, ``tox.ini``) with TOR
codes in ``select``/``extend-select``/``ignore``/``extend-ignore``; a CI step that runs ``torchfix`` (or
``flake8 --select ...TOR...``) or installs it, in ``.github/workflows/*.yml``; a pre-commit hook from
TorchFix's repository, or ``torchfix`` among a flake8 hook's ``additional_dependencies``. The TorchFix codes
that configuration enabled are written to a new ``.torchreview.toml`` as its ``select`` (through
:mod:`analyzers.torchfix_map` they run our rules with TorchFix's scope); TOR codes leave the flake8 lists; the CI step runs ``torchreview check`` instead.
Edits are line by line, so the rest of each file (comments, order, other tools) is left as it was.
"""
from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from analyzers.config import CONFIG_FILES_IN_ORDER
from analyzers.torchfix_map import TORCHFIX_CODES, TORCHFIX_OFF_BY_DEFAULT

FLAKE8_FILES = (".flake8", "setup.cfg", "tox.ini")
FLAKE8_LISTS = ("select", "extend-select", "ignore", "extend-ignore")
_TOR = re.compile(r"TOR\d{0,3}", re.I)
_SECTION = re.compile(r"^\s*\[([^\]]+)\]")
_OPTION = re.compile(r"^([A-Za-z][\w-]*)(\s*[=:]\s*)(.*?)(\s*)$")
_PIP_TORCHFIX = re.compile(r"(?<![\w./-])torchfix(?:\[[^\]]*\])?(?:[<>=!~]=?[\w.*]+)?(?=[\s'\",\]]|$)", re.I)
_TORCHFIX_COMMAND = re.compile(r"(?:python3?\s+-m\s+)?(?<![\w./-])torchfix\b((?:\s+[^\s;&|]+)*)")
_FLAKE8_COMMAND = re.compile(r"(?:python3?\s+-m\s+)?\bflake8\b((?:\s+[^\s;&|]+)*)")
_YAML_KEY = re.compile(r"^\s*(?:-\s+)?([\w-]+)\s*:(?:\s|$)")
_TORCHFIX_REPOS = re.compile(r"github\.com/(?:pytorch-labs|meta-pytorch|pytorch)/torchfix", re.I)
OUR_HOOK = ("- repo: https://github.com/torchreview/torchreview\n"
            "  rev: COMMIT  # run `pre-commit autoupdate --freeze` to pin it\n"
            "  hooks:\n"
            "    - id: torchreview\n")


class MigrationError(ValueError):
    """Nothing to migrate, or a configuration this command cannot rewrite safely."""


@dataclass
class Migration:
    root: Path
    files: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (before, after)
    enabled: set[str] = field(default_factory=set)  # TorchFix codes the configuration turned on
    found_in: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def edit(self, path: str, after: str) -> None:
        before = self.files[path][0] if path in self.files else _read(self.root / path)
        if after != before:
            self.files[path] = (before, after)

    def current(self, path: str) -> str:
        return self.files[path][1] if path in self.files else _read(self.root / path)

    def diff(self) -> str:
        return "".join(_unified_diff(path, before, after) for path, (before, after) in sorted(self.files.items()))

    def write(self) -> None:
        for path, (_before, after) in self.files.items():
            (self.root / path).parent.mkdir(parents=True, exist_ok=True)
            (self.root / path).write_text(after, encoding="utf-8")


def _unified_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 f"a/{path}" if before else "/dev/null", f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def _tokens(value: str) -> list[str]:
    return [t for t in re.split(r"[,\s]+", value.split("#", 1)[0]) if t]


def _expand(selector: str, *, explicit: bool) -> set[str]:
    """TorchFix codes a flake8/TorchFix selector turns on. The off-by-default families (TOR3/4/9) come on only
    from a selector at least as specific as the family, as flake8 prefers the longer of select/ignore."""
    upper = selector.upper()
    if upper == "ALL":
        return {e.code for e in TORCHFIX_CODES}
    out = set()
    for entry in TORCHFIX_CODES:
        if not entry.code.startswith(upper):
            continue
        family_off = any(entry.code.startswith(f) for f in TORCHFIX_OFF_BY_DEFAULT)
        if not family_off or (explicit and len(upper) >= 4):
            out.add(entry.code)
    return out


def _enabled(select: list[str], extend_select: list[str], ignore: list[str]) -> set[str]:
    """What flake8 (or ``torchfix --select``) reports: ``select`` replaces TorchFix's default set."""
    if select:
        codes = set().union(*(_expand(s, explicit=True) for s in select))
    else:
        codes = {e.code for e in TORCHFIX_CODES if not e.code.startswith(TORCHFIX_OFF_BY_DEFAULT)}
    codes |= set().union(*(_expand(s, explicit=True) for s in extend_select))
    return {c for c in codes if not any(c.startswith(i.upper()) for i in ignore)}


# ---- flake8 configuration --------------------------------------------------------------------

def _migrate_flake8(migration: Migration, path: str) -> None:
    text = migration.current(path)
    if "TOR" not in text.upper():
        return
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    section = None
    key: Optional[str] = None  # the flake8 list option whose continuation lines these are
    lists: dict[str, list[str]] = {k: [] for k in FLAKE8_LISTS}
    emptied: set[int] = set()  # options left with no value once their TOR codes went
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, key = header.group(1).strip().lower(), None
            out.append(line)
            continue
        if section != "flake8":
            out.append(line)
            continue
        option = _OPTION.match(line.rstrip("\r\n")) if line[:1].strip() else None
        if option:
            name = option.group(1).lower().replace("_", "-")
            key = name if name in FLAKE8_LISTS else None
            if name == "per-file-ignores" and _TOR.search(option.group(3)):
                migration.notes.append(f"{path}: per-file-ignores lists TOR codes; torchreview has no per-file "
                                       "ignores: use `# noqa: TORxxx` (it works) or paths.exclude")
            if key is None:
                out.append(line)
                continue
            if not _TOR.search(option.group(3)):
                _record(lists[key], option.group(3))
                out.append(line)
                continue
            kept = _record(lists[key], option.group(3))
            if not kept:
                emptied.add(len(out))  # removed below unless continuation lines follow
            out.append(f"{option.group(1)}{option.group(2)}{kept}{_newline(line)}")
            continue
        if key is not None and line.strip() and line[:1].isspace() and not line.lstrip().startswith(("#", ";")):
            indent = line[:len(line) - len(line.lstrip())]
            if not _TOR.search(line):
                _record(lists[key], line.strip())
                out.append(line)
                continue
            kept = _record(lists[key], line.strip())
            if kept:
                out.append(f"{indent}{kept}{_newline(line)}")
            continue
        key = None if line.strip() and not line[:1].isspace() else key
        out.append(line)
    tor = {k: [t for t in v if _TOR.fullmatch(t)] for k, v in lists.items()}
    if not any(tor.values()):
        return
    migration.found_in.append(f"{path} [flake8]")
    migration.enabled |= _enabled(tor["select"], tor["extend-select"], tor["ignore"] + tor["extend-ignore"])
    migration.edit(path, "".join(line for i, line in enumerate(out) if not (
        i in emptied and not (i + 1 < len(out) and out[i + 1].strip() and out[i + 1][:1].isspace()))))


def _record(into: list[str], value: str) -> str:
    """Remember the value's tokens; what is left of it once the TOR codes are gone."""
    tokens = _tokens(value)
    into.extend(tokens)
    kept = [t for t in tokens if not _TOR.fullmatch(t)]
    written = value.split("#", 1)[0].rstrip()
    separator = ", " if ", " in written else "," if "," in written else " "
    return separator.join(kept) + ("," if written.endswith(",") and kept else "")


def _newline(line: str) -> str:
    return "\r\n" if line.endswith("\r\n") else "\n" if line.endswith("\n") else ""


# ---- CI workflows ----------------------------------------------------------------------------

def _migrate_workflow(migration: Migration, path: str) -> None:
    text = migration.current(path)
    if not re.search(r"torchfix|TOR\d", text, re.I):
        return
    out = []
    changed = False
    for line in text.splitlines(keepends=True):
        new = line
        key = _YAML_KEY.match(line)
        if line.lstrip().startswith("#") or (key and key.group(1) != "run"):
            out.append(line)  # a step's name, a comment, `uses:`...: not a shell command
            continue
        if re.search(r"\bpip3?\s+install\b|\buv\s+(?:pip\s+install|add)\b", line):
            new = _PIP_TORCHFIX.sub("torchreview", line)
        else:
            new = _TORCHFIX_COMMAND.sub(lambda m: _torchfix_step(migration, path, m.group(1)), new)
            new = _FLAKE8_COMMAND.sub(lambda m: _flake8_step(migration, path, m.group(0), m.group(1)), new)
        changed |= new != line
        out.append(new)
    if changed:
        migration.found_in.append(path)
        migration.edit(path, "".join(out))


def _torchfix_step(migration: Migration, path: str, arguments: str) -> str:
    words = shlex.split(arguments)
    paths, select, fix = [], None, False
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--fix":
            fix = True
        elif word in ("--select", "-j", "--jobs"):
            select = words[i + 1] if word == "--select" and i + 1 < len(words) else select
            i += 1
        elif word.startswith("--select="):
            select = word.split("=", 1)[1]
        elif word.startswith("-"):
            pass  # --show-stderr, --jobs=N: nothing of ours to carry over
        else:
            paths.append(word)
        i += 1
    migration.enabled |= _enabled(_tokens(select) if select else [], [], [])
    return "torchreview check" + (" --fix" if fix else "") + "".join(f" {shlex.quote(p)}" for p in paths or ["."])


def _flake8_step(migration: Migration, path: str, command: str, arguments: str) -> str:
    match = re.search(r"--(?:extend-)?select[= ](\S+)", arguments)
    if not match or not _TOR.search(match.group(1)):
        return command
    tokens = _tokens(match.group(1))
    tor = [t for t in tokens if _TOR.fullmatch(t)]
    kept = [t for t in tokens if not _TOR.fullmatch(t)]
    is_extend = match.group(0).startswith("--extend")
    migration.enabled |= _enabled([] if is_extend else tor, tor if is_extend else [], [])
    paths = [w for w in shlex.split(arguments.replace(match.group(0), "")) if not w.startswith("-")]
    ours = "torchreview check" + "".join(f" {shlex.quote(p)}" for p in paths or ["."])
    if not kept:
        return ours
    return command.replace(match.group(1), ",".join(kept)) + " && " + ours


# ---- pre-commit ------------------------------------------------------------------------------

def _migrate_precommit(migration: Migration, path: str) -> None:
    text = migration.current(path)
    if "torchfix" not in text.lower():
        return
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    replaced = False
    while i < len(lines):
        line = lines[i]
        entry = re.match(r"^(\s*)-\s+repo:\s*(\S+)", line)
        if entry and _TORCHFIX_REPOS.search(entry.group(2)):
            indent = entry.group(1)
            start = i = i + 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
                i += 1  # the rest of TorchFix's entry
            # the hook runs the torchfix CLI: its defaults, or what its args select
            select = re.search(r"--select\W+([\w,]+)", "".join(lines[start:i]))
            migration.enabled |= _enabled(_tokens(select.group(1)) if select else [], [], [])
            out.extend(indent + hook_line + "\n" for hook_line in OUR_HOOK.splitlines())
            replaced = True
            continue
        dependency = re.match(r"^(\s*)-\s*['\"]?torchfix(?:[<>=!~]=?[\w.*]+)?['\"]?\s*$", line)
        if dependency:
            i += 1  # torchfix listed as a flake8 hook's dependency, one per line
            item = re.compile(re.escape(dependency.group(1)) + r"-\s")
            if out and re.match(r"^\s*additional_dependencies:\s*$", out[-1]) and \
                    not (i < len(lines) and item.match(lines[i])):
                out.pop()  # it was the only one: the key goes too (an empty value is not a list)
            replaced = replaced or None
            continue
        inline = re.sub(r"(additional_dependencies:\s*\[[^\]]*?)\s*['\"]?torchfix(?:[<>=!~]=?[\w.*]+)?['\"]?\s*,?",
                        r"\1", line)
        if inline != line:
            inline = re.sub(r",\s*\]", "]", inline)
            replaced = replaced or None
        out.append(inline)
        i += 1
    if replaced is None:  # torchfix was only a flake8 hook's dependency: our hook joins the repos list
        if not any(source.endswith("[flake8]") for source in migration.found_in):
            migration.enabled |= _enabled([], [], [])  # the plugin's defaults, with no flake8 settings saying more
        repos = next((k for k, l in enumerate(out) if re.match(r"^repos:\s*$", l)), None)
        if repos is None:
            raise MigrationError(f"{path}: torchfix is a hook dependency, but there is no top-level `repos:` "
                                 "list to add torchreview's hook to")
        item = next((l for l in out[repos + 1:] if re.match(r"^\s*-\s+repo:", l)), "  - repo:")
        indent = item[:len(item) - len(item.lstrip())]
        out[repos + 1:repos + 1] = [indent + hook_line + "\n" for hook_line in OUR_HOOK.splitlines()]
    migration.found_in.append(path)
    migration.notes.append(f"{path}: run `pre-commit autoupdate --freeze` to pin torchreview's hook to a commit")
    migration.edit(path, "".join(out))


# ---- the whole repository --------------------------------------------------------------------

def migrate(root: Path) -> Migration:
    if not root.is_dir():
        raise MigrationError(f"{root}: not a directory")
    migration = Migration(root)
    for name in FLAKE8_FILES:
        if (root / name).is_file():
            _migrate_flake8(migration, name)
    workflows = root / ".github" / "workflows"
    if workflows.is_dir():
        for workflow in sorted([*workflows.glob("*.yml"), *workflows.glob("*.yaml")]):
            _migrate_workflow(migration, workflow.relative_to(root).as_posix())
    if (root / ".pre-commit-config.yaml").is_file():
        _migrate_precommit(migration, ".pre-commit-config.yaml")
    if not migration.found_in:
        raise MigrationError(f"{root}: no TorchFix configuration found (looked for TOR codes in the [flake8] "
                             f"section of {', '.join(FLAKE8_FILES)}, torchfix in .github/workflows/*.yml and "
                             ".pre-commit-config.yaml)")
    _write_our_config(migration)
    return migration


def _write_our_config(migration: Migration) -> None:
    """``select`` = the TorchFix codes that were on, so that they run with TorchFix's scope (a rule widened by
    its code, the rules that run only when their code is selected: analyzers.torchfix_map)."""
    covered = [e for e in TORCHFIX_CODES if e.code in migration.enabled and e.rules]
    uncovered = [e for e in TORCHFIX_CODES if e.code in migration.enabled and not e.rules]
    codes = [e.code for e in covered]
    rules = list(dict.fromkeys(rule for e in covered for rule in e.rules))
    for entry in uncovered:
        migration.notes.append(f"{entry.code} ({entry.checks}): {entry.note}")
    existing = _existing_config(migration.root)
    if existing:
        migration.notes.append(f"{existing} already configures torchreview: add `select = {_toml_list(codes)}` "
                               f"there for the TorchFix checks you had on (our {', '.join(rules)}, with TorchFix's "
                               "scope)")
        return
    if not codes:
        raise MigrationError("the TorchFix configuration enables no code that torchreview covers: "
                             + "; ".join(f"{e.code}: {e.note}" for e in uncovered))
    text = ("# Migrated from TorchFix by `torchreview migrate-torchfix`, from "
            f"{', '.join(migration.found_in)}.\n"
            f"# The TorchFix codes that were on: they run our {', '.join(rules)} with TorchFix's scope\n"
            "# (docs/torchfix.md). Select our rules instead (or remove `select`) for torchreview's own scope;\n"
            "# `# noqa: TORxxx` comments keep working.\n"
            f"select = {_toml_list(codes)}\n")
    migration.edit(".torchreview.toml", text)


def _existing_config(root: Path) -> Optional[str]:
    for name in CONFIG_FILES_IN_ORDER:
        path = root / name
        if not path.is_file():
            continue
        if name != "pyproject.toml" or re.search(r"^\[tool\.torchreview", _read(path), re.M):
            return name
    return None


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"

