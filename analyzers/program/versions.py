"""Which library versions a repository pins: read once per folder from its requirement files.

A rule that says "``torch.qr`` is deprecated since 1.9" asks :class:`VersionFacts` whether the repository
can run on 1.9 or later at all. The answer comes from the nearest folder, walking up from the file to the
repository root, whose ``requirements*.txt``, ``pyproject.toml``, ``setup.cfg``, ``setup.py`` or
``environment*.yml`` names the package. ``torch==1.7.1``, ``torch<1.9`` or the conda ``pytorch=1.7.0``
cap the version; ``torch``, ``torch>=1.7`` or no mention at all leave it open (the newest release).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

Version = tuple[int, ...]

# conda spells torch "pytorch"; requirement names compare case-insensitively with - and _ alike
_ALIASES = {"pytorch": "torch", "scikit_learn": "scikit-learn", "sklearn": "scikit-learn"}
_NAMES = r"torch|pytorch|torchvision|torchaudio|torchtext|scikit[-_]learn|numpy|scipy"
# a package name not glued to a longer one (pytorch-lightning, torch_geometric, torchvision vs torch),
# then its version clauses: ``>=1.7,<2``, ``==1.7.*``, conda's ``=1.7.0``
_REQUIREMENT = re.compile(
    rf"(?<![\w.\-/])({_NAMES})(?![\w.\-])(?:\[[^\]]*\])?\s*((?:(?:[<>=!~]=?|===?)\s*[\w.*+]+\s*,?\s*)*)",
    re.IGNORECASE,
)
_CLAUSE = re.compile(r"(===?|[<>!~]=?|=)\s*([\w.*+]+)")
_FILES = ("requirements*.txt", "requirements/*.txt", "pyproject.toml", "setup.cfg", "setup.py", "environment*.yml",
          "environment*.yaml")


def parse_version(text: str) -> Optional[Version]:
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group(0)))
        if digits.group(0) != piece:
            break
    return tuple(parts) if parts else None


@dataclass(frozen=True)
class Cap:
    """The highest version a pin admits: ``version`` itself when ``inclusive``, else anything below it."""

    version: Version
    inclusive: bool
    source: str  # the file that pins it, for messages

    def admits(self, version: Version) -> bool:
        """Can the pinned range hold ``version`` or something newer?"""
        width = max(len(self.version), len(version))
        cap = self.version + (0,) * (width - len(self.version))
        wanted = version + (0,) * (width - len(version))
        return wanted <= cap if self.inclusive else wanted < cap

    @property
    def text(self) -> str:
        return ("<=" if self.inclusive else "<") + ".".join(map(str, self.version))


@dataclass(frozen=True)
class Floor:
    """The lowest version every install the pins allow has: ``torch>=2.6`` guarantees 2.6 or newer."""

    version: Version
    source: str  # the file that pins it, for messages

    def guarantees(self, version: Version) -> bool:
        """Is every allowed install ``version`` or newer?"""
        width = max(len(self.version), len(version))
        return self.version + (0,) * (width - len(self.version)) >= version + (0,) * (width - len(version))

    @property
    def text(self) -> str:
        return ">=" + ".".join(map(str, self.version))


def _floor_of(clauses: str) -> Optional[Version]:
    """The highest lower bound of ``>=2.6,<3`` / ``==2.7.1`` / ``~=2.6`` / conda's ``=2.6``; None when open below."""
    best: Optional[Version] = None
    for op, value in _CLAUSE.findall(clauses):
        version = parse_version(value.rstrip(".*"))
        if version is None or op in ("<", "<=", "!="):
            continue
        if best is None or version > best:
            best = version  # >X admits only versions above X: X is a floor as well
    return best


def _cap_of(clauses: str) -> Optional[tuple[Version, bool]]:
    best: Optional[tuple[Version, bool]] = None
    for op, value in _CLAUSE.findall(clauses):
        version = parse_version(value.rstrip(".*"))
        if version is None:
            continue
        if op in ("==", "===", "=") and "*" in value or op == "~=":
            # ==1.7.* / conda =1.7 / ~=1.7.1: anything below the next release of the last given part
            base = version[:-1] if op == "~=" and len(version) > 1 else version
            cap: tuple[Version, bool] = (base[:-1] + (base[-1] + 1,), False)
        elif op in ("==", "===", "<="):
            cap = (version, True)
        elif op == "=":  # conda: pytorch=1.7.0 means 1.7.0*, pytorch=1.7 means 1.7.*
            cap = (version, True) if len(version) >= 3 else (version[:-1] + (version[-1] + 1,), False)
        elif op == "<":
            cap = (version, False)
        else:
            continue  # >=, >, !=: no ceiling
        if best is None or cap[0] < best[0]:
            best = cap
    return best


def _mentions(text: str) -> dict[str, list[tuple[Optional[tuple[Version, bool]], Optional[Version]]]]:
    """package -> (cap, floor) of each line that names it."""
    found: dict[str, list[tuple[Optional[tuple[Version, bool]], Optional[Version]]]] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        line = line.split(" #", 1)[0]
        for match in _REQUIREMENT.finditer(line):
            name = match.group(1).lower().replace("_", "-")
            name = _ALIASES.get(name.replace("-", "_"), name)
            found.setdefault(name, []).append((_cap_of(match.group(2) or ""), _floor_of(match.group(2) or "")))
    return found


def _pyproject_requirements(text: str) -> str:
    """The requirement strings of a ``pyproject.toml``, one a line: the project's dependencies (optional ones and
    dependency groups included), Poetry's, and the build requirements. Nothing else in the file is a pin: a
    tool's script that runs ``pip install torch==2.0.1`` says how one CI job installs, not what the project
    supports. An unreadable file pins nothing."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeError):
        return ""
    found: list[str] = []

    def strings(value) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            for item in value:
                strings(item)
        elif isinstance(value, dict):
            for item in value.values():
                strings(item)

    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    strings(project.get("dependencies", []))
    strings(project.get("optional-dependencies", {}))
    strings(data.get("dependency-groups", {}))
    strings((data.get("build-system") or {}).get("requires", []) if isinstance(data.get("build-system"), dict) else [])
    poetry = ((data.get("tool") or {}).get("poetry") or {}) if isinstance(data.get("tool"), dict) else {}
    groups = [poetry.get("dependencies"), poetry.get("dev-dependencies"),
              *((group or {}).get("dependencies") for group in (poetry.get("group") or {}).values()
                if isinstance(group, dict))]
    for table in groups:
        if not isinstance(table, dict):
            continue
        for name, spec in table.items():
            version = spec.get("version") if isinstance(spec, dict) else spec
            if isinstance(version, str):
                # Poetry's ^2.1 and ~2.1 allow that release and newer patches or minors (a floor); a bare
                # 2.1.0 is that release exactly
                if version[:1] in ("^", "~") and version[1:2] != "=":
                    version = ">=" + version[1:]
                elif version[:1].isdigit():
                    version = "==" + version
                found.append(f"{name} {version}")
    return "\n".join(found)


def conda_requirements(text: str) -> str:
    """The package specs of a conda ``environment.yml``, one a line: the items of its top-level ``dependencies:``
    list, those of its ``pip:`` sub-list included (``pytorch=1.12.1``, ``pytorch::pytorch>=2``, ``torch==2.1``).
    Nothing else in the file is a pin: ``channels: [pytorch]`` names where packages come from, ``name:`` the
    environment. Read line by line (no YAML library): a flow list ``dependencies: [a, b]`` is split on commas."""
    found: list[str] = []
    inside = False
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not raw[:1].isspace() and not stripped.startswith("-"):
            key, _, rest = stripped.partition(":")
            inside = key.strip() == "dependencies"
            if inside and rest.strip().startswith("["):
                found.extend(item.strip(" '\"").split("::", 1)[-1] for item in rest.strip().strip("[]").split(","))
                inside = False
            continue
        if inside and stripped.startswith("-"):
            item = stripped[1:].strip().strip("'\"")
            if item and not item.endswith(":"):  # ``- pip:`` opens the sub-list whose items follow
                found.append(item.split("::", 1)[-1])  # ``pytorch::pytorch=2.1``: the channel, then the spec
    return "\n".join(found)


_LEGACY_FOLDERS = {"legacy", "deprecated"}
_FOLDERS: dict[Path, tuple[tuple, dict[str, tuple[Optional[Cap], str, Optional[Floor]]]]] = {}


def is_pin_file(relative: str) -> bool:
    """Whether the file at ``relative`` (a repository path, ``/``-separated) is one pins are read from: what a
    copy of the repository must hold for the analysis to see the same versions."""
    path = PurePosixPath(relative)
    return any(path.match(pattern) for pattern in _FILES)


def _pin_files(folder: Path) -> list[Path]:
    stamp = _listing_stamp(folder)
    cached = _LISTINGS.get(folder)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    files: list[Path] = []
    for pattern in _FILES:
        try:
            files.extend(sorted(folder.glob(pattern)))
        except OSError:
            continue
    files = files[:20]
    if stamp is not None:
        if len(_LISTINGS) > 4096:
            _LISTINGS.clear()
        _LISTINGS[folder] = (stamp, files)
    return files


# folder -> (its listing's stamp, its pin files): every file of a folder, and of the folders below it, asks the
# same folders, and a stat is far cheaper than globbing each pattern again
_LISTINGS: dict[Path, tuple[tuple, list[Path]]] = {}
_SETTLED_NS = 2_000_000_000  # a folder changed this recently may change again within its clock's resolution


def _listing_stamp(folder: Path) -> Optional[tuple]:
    """The modification times of ``folder`` and its ``requirements/``: adding, removing or renaming a file in
    either changes them. None (do not keep the listing) while either changed too recently to be sure of that."""
    stamps = []
    now = time.time_ns()
    for path in (folder, folder / "requirements"):
        try:
            modified = os.stat(path).st_mtime_ns
        except OSError:
            stamps.append(None)
            continue
        if now - modified < _SETTLED_NS:
            return None
        stamps.append(modified)
    return tuple(stamps)


def pin_file_names(folder: Path) -> list[str]:
    """The requirement files pins are read from in ``folder`` (what the results cache checks again)."""
    return [path.name for path in _pin_files(folder)]


def _folder_pins(folder: Path) -> dict[str, tuple[Optional[Cap], str, Optional[Floor]]]:
    """package -> (its cap or None when open above, the file, its floor or None when open below) for the files
    directly in ``folder``; cached until one of those files changes. Several mentions: the strictest cap and
    the lowest floor (a floor holds only when every mention has one)."""
    from analyzers.program.modules import note_pin_folder

    files = _pin_files(folder)
    note_pin_folder(folder, files)  # read now or from the cache below: the results cache must know either way
    stamps = []
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps.append((path.name, stat.st_mtime_ns, stat.st_size))
    key = tuple(stamps)
    cached = _FOLDERS.get(folder)
    if cached is not None and cached[0] == key:
        return cached[1]
    pins: dict[str, tuple[Optional[Cap], str, Optional[Floor]]] = {}
    floors: dict[str, list[tuple[Optional[Version], str]]] = {}
    for path in files:
        try:
            if path.stat().st_size > 200_000:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if path.name == "pyproject.toml":
            text = _pyproject_requirements(text)
        elif path.suffix in (".yml", ".yaml"):
            text = conda_requirements(text)
        for name, mentions in _mentions(text).items():
            bounded = [c for c, _ in mentions if c is not None]
            cap = min(bounded) if bounded else None
            floors.setdefault(name, []).extend((floor, path.name) for _, floor in mentions)
            previous = pins.get(name)
            if previous is None or (cap is not None and (previous[0] is None or cap[0] < previous[0].version)):
                pins[name] = (Cap(cap[0], cap[1], path.name) if cap is not None else None, path.name, None)
    for name, found in floors.items():
        if all(floor is not None for floor, _ in found):
            lowest, source = min(found, key=lambda f: f[0])
            pins[name] = (*pins[name][:2], Floor(lowest, source))
    _FOLDERS[folder] = (key, pins)
    return pins


def _nearest_pins(path: Path, root: Optional[Path], package: str) -> Optional[tuple[Optional[Cap], str, Optional[Floor]]]:
    """The pins on ``package`` that apply to the file ``path``: from the nearest folder between the file and
    ``root`` that names the package; None when none does."""
    package = _ALIASES.get(package, package)
    folder = path.resolve().parent
    root = root.resolve() if root is not None else folder
    for current in [folder, *folder.parents]:
        pins = _folder_pins(current)
        if package in pins:
            return pins[package]
        if current == root:
            break
    return None


def pinned_cap(path: Path, root: Optional[Path], package: str) -> Optional[Cap]:
    """The cap on ``package`` that applies to the file ``path``; None when nothing caps it."""
    pins = _nearest_pins(path, root, package)
    return pins[0] if pins is not None else None


def pinned_floor(path: Path, root: Optional[Path], package: str) -> Optional[Floor]:
    """The lowest version of ``package`` the pins that apply to ``path`` allow; None when they allow any."""
    pins = _nearest_pins(path, root, package)
    return pins[2] if pins is not None else None


def checkout_root(root: Optional[Path]) -> Optional[Path]:
    """How far up pins are looked for: the repository index's ``root``, or the checkout that holds it. A vendored
    package inside a repository (``third_party/lib/`` with its own ``README.md`` or ``setup.py``) is the index's
    root for its files, yet runs on what the repository's ``environment.yml`` installs: the walk goes on to the
    folder with ``.git`` above it, else to the working folder when that holds it (a checkout without ``.git``)."""
    if root is None:
        return None
    root = root.resolve()
    for folder in root.parents:
        if (folder / ".git").exists():
            return folder
    cwd = Path.cwd().resolve()
    return cwd if cwd in root.parents else root


def _locate(shown: Path, root: Optional[Path]) -> Optional[Path]:
    """The file behind a displayed path: absolute, relative to the working folder, or to the repository root
    or a folder above it (a review shows paths relative to the checkout)."""
    if shown.is_absolute():
        return shown
    bases = ([root, *list(root.parents)[:4]] if root is not None else []) + [Path.cwd()]
    for base in bases:
        candidate = base / shown
        if candidate.exists():
            return candidate
    return None


class VersionFacts:
    """What the file's repository pins, asked as ``facts.admits("torch", (1, 9))``."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._pins: dict[str, Optional[tuple[Optional[Cap], str, Optional[Floor]]]] = {}

    def _pinned(self, package: str) -> Optional[tuple[Optional[Cap], str, Optional[Floor]]]:
        if package not in self._pins:
            index = self.ctx.repository
            if index is None:
                self._pins[package] = None  # a lone snippet: no pins known
            else:
                root = getattr(index, "root", None)
                path = _locate(Path(self.ctx.path), root)
                self._pins[package] = _nearest_pins(path, checkout_root(root), package) if path is not None else None
        return self._pins[package]

    def cap(self, package: str) -> Optional[Cap]:
        """The newest release the pins allow; None when open above (or no pins: assume the newest release)."""
        pinned = self._pinned(package)
        return pinned[0] if pinned is not None else None

    def floor(self, package: str) -> Optional[Floor]:
        """The oldest release the pins allow; None when open below, or no pins (then any release may run it)."""
        if self.legacy:
            return None
        pinned = self._pinned(package)
        return pinned[2] if pinned is not None else None

    def guarantees(self, package: str, version: Version) -> bool:
        """Do the pins rule out every release older than ``version``?"""
        floor = self.floor(package)
        return floor is not None and floor.guarantees(version)

    @property
    def legacy(self) -> bool:
        """Code kept in a ``legacy/`` (or ``deprecated/``) folder targets old releases on purpose."""
        return any(part.lower() in _LEGACY_FOLDERS for part in Path(self.ctx.path).parts[:-1])

    def admits(self, package: str, version: Version) -> bool:
        """May the code run on ``package`` ``version`` or newer (unpinned, open-ended, or capped above it)?
        Never for code in a legacy folder."""
        if self.legacy:
            return False
        cap = self.cap(package)
        return cap is None or cap.admits(version)

    def assumption(self, package: str) -> str:
        """The release of ``package`` a version-dependent message assumed, said in the message:
        ``torch>=2.4 per requirements.txt``, ``no torch pin found; assuming a current torch``."""
        if self.legacy:
            return f"code in a legacy folder; assuming an old {package}"
        pinned = self._pinned(package)
        if pinned is None:
            return f"no {package} pin found; assuming a current {package}"
        cap, source, floor = pinned
        if cap is not None and floor is not None and cap.inclusive and cap.version == floor.version:
            return f"{package}=={'.'.join(map(str, cap.version))} per {source}"
        bounds = ",".join(bound.text for bound in (floor, cap) if bound is not None)
        if not bounds:
            return f"{package} unbounded in {source}; assuming a current {package}"
        return f"{package}{bounds} per {source}"
