"""A results cache: one file's findings, reused while nothing they were computed from has changed.

An entry is found by a key made of the file's text (its hash), its display path, the engine (torchreview's
version, a hash of the analyzer's own source, Python and libcst versions), the analysis-relevant part of
the effective configuration and the repository root; it holds the result and the files the repository
index consulted to compute it (content hashes, which candidate module files existed, which sibling
scripts were listed). A hit re-checks those first, so a change in ``model.py`` invalidates the result of
``train.py`` that looked up its model class there.

Stores: a directory (``.torchreview_cache/`` at the repository root for the CLI, the data directory for
the App's embedded workers), written atomically so parallel ``--jobs`` and workers never read a torn
entry; or Redis (the App's workers with ``REDIS_URL``), with a time to live.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional, Protocol

from analyzers.config import Config
from analyzers.model import FileError, FileResult, Finding, Fix, Location, Severity
from analyzers.program.modules import Dependencies, RepositoryIndex, file_digest, recording

CACHE_DIRNAME = ".torchreview_cache"
FORMAT = 1  # bump when an entry's layout changes

# Config fields that only decide what happens with the findings (exit code, the App's posting), never
# which findings a file has: changing them must not throw the cache away. Any other field, including
# one added later, is part of the key.
_NOT_ANALYSIS = ("paths", "fail_on", "max_inline_comments", "group_across_files", "group_rule_from_files",
                 "review_event", "filter", "diff_context_lines", "skip", "cleanup", "fail_on_errors", "smoke")


class Store(Protocol):
    def get(self, key: str) -> Optional[bytes]:
        ...

    def put(self, key: str, value: bytes) -> None:
        ...


@dataclass
class DirectoryStore:
    """One file per entry under ``root``; a write is a rename of a complete file (atomic on POSIX)."""

    root: Path

    def _path(self, key: str) -> Path:
        return self.root / f"v{FORMAT}" / key[:2] / key

    def get(self, key: str) -> Optional[bytes]:
        try:
            return self._path(key).read_bytes()
        except OSError:
            return None

    def put(self, key: str, value: bytes) -> None:
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _mark_ignored(self.root)
            fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(value)
                os.replace(temp, target)
            except BaseException:
                os.unlink(temp)
                raise
        except OSError:
            pass  # a read-only or full disk: the run goes on uncached


def _mark_ignored(root: Path) -> None:
    """Like pytest's cache: git ignores the folder even in repositories that do not list it."""
    marker = root / ".gitignore"
    if not marker.exists():
        try:
            marker.write_text("# created by torchreview: its results cache, safe to delete\n*\n")
        except OSError:
            pass


class RedisResultStore:
    """Entries shared by every worker of the App; they expire (default a week) rather than pile up."""

    def __init__(self, client, ttl: int = 7 * 24 * 3600, prefix: str = "torchreview:results:") -> None:
        self.client, self.ttl, self.prefix = client, ttl, prefix

    def get(self, key: str) -> Optional[bytes]:
        try:
            return self.client.get(self.prefix + key)
        except Exception:  # noqa: BLE001 - the cache is an optimisation: Redis trouble means a miss
            return None

    def put(self, key: str, value: bytes) -> None:
        try:
            self.client.set(self.prefix + key, value, ex=self.ttl)
        except Exception:  # noqa: BLE001
            pass


@lru_cache(maxsize=1)
def engine_fingerprint() -> str:
    """Changes whenever the analysis could: a release, any edit of the analyzer's source, Python, libcst."""
    import libcst

    from analyzers.output import tool_version

    package = Path(__file__).resolve().parent
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{tool_version()}|{sys.version_info[:2]}|{getattr(libcst, '__version__', '?')}|".encode())
    digest.update(f"{_version('ipython')}|".encode())  # notebooks: IPython's transformer reads their cells
    # the rule levels and severity caps (levels.json) decide what runs and at which severity, like the source
    for source in sorted([*package.rglob("*.py"), *package.rglob("*.json")]):
        digest.update(source.relative_to(package).as_posix().encode() + b"\0")
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"


def config_digest(config: Config) -> str:
    settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_ANALYSIS}
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=16).hexdigest()


def text_digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass
class ResultCache:
    """Picklable (it travels to ``--jobs`` worker processes); hit and miss counts are per process."""

    store: Store
    fingerprint: str = field(default_factory=engine_fingerprint)
    hits: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        self._digests: dict[str, tuple[tuple, Optional[str]]] = {}

    def __getstate__(self) -> dict:
        return {"store": self.store, "fingerprint": self.fingerprint, "hits": 0, "misses": 0}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._digests = {}

    @classmethod
    def in_directory(cls, root: Path) -> "ResultCache":
        return cls(DirectoryStore(Path(root)))

    # ---- keys ------------------------------------------------------------------------------
    def key(self, display: str, config: Config, content: str, root=None) -> str:
        """``content``: a hash of the file (of its text, or the git blob SHA the App has)."""
        parts = [str(FORMAT), self.fingerprint, config_digest(config), display, content, str(root or "")]
        return hashlib.blake2b("\0".join(parts).encode(), digest_size=20).hexdigest()

    # ---- use -------------------------------------------------------------------------------
    def analyze(self, text: str, display: str, config: Config, repository: Optional[RepositoryIndex] = None,
                content: Optional[str] = None, root_id: Optional[str] = None) -> FileResult:
        """``analyze_text``, through the cache. ``root_id`` names the repository when its checkout moves
        between runs (the App extracts each head anew): dependencies are then kept relative to the root."""
        from analyzers.engine import analyze_text

        root = repository.root if repository is not None else None
        key = self.key(display, config, content or text_digest(text), root_id or root)
        cached = self.lookup(key, root, relative=root_id is not None)
        if cached is not None:
            return cached
        with recording() as deps:
            result = analyze_text(text, display, config, repository=repository)
        if root_id is not None and root is not None:
            deps = deps.relative_to(root)
        self.save(key, result, deps)
        return result

    def lookup(self, key: str, root: Optional[Path], relative: bool = False) -> Optional[FileResult]:
        raw = self.store.get(key)
        result = None
        if raw is not None:
            try:
                entry = json.loads(raw)
                deps = Dependencies.from_dict(entry["deps"])
                if relative and root is not None:
                    deps = deps.under(root)
                if root is None or deps.unchanged(root, self._digest):
                    result = _result_from_dict(entry["result"])
            except (ValueError, KeyError, TypeError):
                result = None  # an entry from another layout, or damaged: analyze again
        if result is None:
            self.misses += 1
            return None
        self.hits += 1
        result.cached = True
        return result

    def save(self, key: str, result: FileResult, deps: Dependencies) -> None:
        entry = {"deps": deps.to_dict(), "result": _result_to_dict(result)}
        self.store.put(key, json.dumps(entry, separators=(",", ":")).encode())

    def _digest(self, path: Path) -> Optional[str]:
        # one hash per file per process and file state: a warm run checks the same model.py for many scripts
        try:
            stat = path.stat()
            state = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except OSError:
            state = None
        known = self._digests.get(str(path))
        if known is not None and state is not None and known[0] == state:
            return known[1]
        digest = file_digest(path)
        if state is not None:
            self._digests[str(path)] = (state, digest)
        return digest


def cache_root(start: Path) -> Path:
    """``.torchreview_cache`` in the repository holding ``start`` (nearest ``.git``), else in ``start``."""
    start = start.resolve()
    for directory in [start, *start.parents]:
        if (directory / ".git").exists():
            return directory / CACHE_DIRNAME
    return start / CACHE_DIRNAME


# ---- (de)serialising a FileResult -------------------------------------------------------------


def _result_to_dict(result: FileResult) -> dict:
    return {"path": result.path, "findings": [f.to_dict() for f in result.findings],
            "errors": [e.to_dict() for e in result.errors], "suppressed": [f.to_dict() for f in result.suppressed],
            "skipped_by_comment": result.skipped_by_comment}


def _finding_from_dict(f: dict) -> Finding:
    fix = Fix(**f["fix"]) if f.get("fix") else None
    related = tuple(Location(**site) for site in f.get("related", ()))  # the PR filter keeps a finding by them
    return Finding(f["path"], f["line"], f["column"], f["end_line"], f["end_column"], f["rule"], f["slug"],
                   f["category"], Severity.parse(f["severity"]), f["message"], fix, f.get("cell"), related,
                   f.get("preview", False), f.get("context"))


def _result_from_dict(data: dict) -> FileResult:
    errors = [FileError(e["path"], e["kind"], e["message"]) for e in data["errors"]]
    return FileResult(data["path"], [_finding_from_dict(f) for f in data["findings"]], errors,
                      suppressed=[_finding_from_dict(f) for f in data.get("suppressed", ())],
                      skipped_by_comment=bool(data.get("skipped_by_comment")))
