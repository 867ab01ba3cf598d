"""The evaluation corpus: its list (``repos.tsv``), its tune/holdout split (``split.tsv``), and where its code lives.

``repos.tsv``: ``repo  commit  tags`` (tab-separated, a header line, ``#`` comments); ``tags`` a comma list of
styles (tutorial, notebook, ddp, amp, lightning, rl, ...). ``split.tsv``: ``repo  split  note``; ``split`` is
``tune`` or ``holdout``; ``note`` is ``hash`` for the side :func:`split_by_hash` gives, or says why the
repository moved (a fix motivated by a holdout repository moves it to tune: see docs/evaluation.md).
"""
from __future__ import annotations

import csv
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
SPLITS = ("tune", "holdout")
COMMIT_MARKER = ".torchreview-corpus-commit"
REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


class CorpusError(ValueError):
    pass


@dataclass(frozen=True)
class CorpusRepo:
    repo: str
    commit: str
    tags: tuple[str, ...] = ()


def slug(repo: str) -> str:
    """``owner/name`` as one directory name."""
    return repo.replace("/", "+")


def default_cache() -> Path:
    configured = os.environ.get("TORCHREVIEW_CORPUS")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "torchreview-corpus"


def split_by_hash(repo: str) -> str:
    """The side a repository falls on before anyone judges anything: the parity of sha256("owner/name")."""
    return SPLITS[int(hashlib.sha256(repo.lower().encode("utf-8")).hexdigest(), 16) % 2]


def side_of(repo: str, split: dict[str, str]) -> str:
    """A repository's side: its row in ``split.tsv`` when the corpus lists it, else the side its name hashes to."""
    return split.get(repo) or split_by_hash(repo)


def _rows(path: Path, columns: int) -> list[tuple[int, list[str]]]:
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), 1):
            if not row or not row[0].strip() or row[0].startswith("#"):
                continue
            if number == 1 and row[0] == "repo":
                continue  # the header
            if len(row) < columns:
                raise CorpusError(f"{path}:{number}: expected {columns} tab-separated columns, got {len(row)}")
            rows.append((number, [cell.strip() for cell in row]))
    return rows


def read_repos(path: Path = CORPUS_DIR / "repos.tsv") -> list[CorpusRepo]:
    entries: list[CorpusRepo] = []
    seen: set[str] = set()
    for number, row in _rows(path, 2):
        repo, commit = row[0], row[1].lower()
        if not REPO_NAME.match(repo):
            raise CorpusError(f"{path}:{number}: {repo!r} is not owner/name")
        if not COMMIT_SHA.match(commit):
            raise CorpusError(f"{path}:{number}: {commit!r} is not a 40-digit commit")
        if repo.lower() in seen:
            raise CorpusError(f"{path}:{number}: {repo} is listed twice")
        seen.add(repo.lower())
        tags = tuple(t for t in (row[2].split(",") if len(row) > 2 else []) if t)
        entries.append(CorpusRepo(repo, commit, tags))
    return entries


def read_split(path: Path = CORPUS_DIR / "split.tsv") -> dict[str, str]:
    split: dict[str, str] = {}
    for number, row in _rows(path, 3):
        repo, side, note = row[0], row[1], row[2]
        if side not in SPLITS:
            raise CorpusError(f"{path}:{number}: split {side!r} is not one of {', '.join(SPLITS)}")
        if note == "hash" and side != split_by_hash(repo):
            raise CorpusError(f"{path}:{number}: {repo} says 'hash' but its hash puts it on {split_by_hash(repo)}")
        if not note:
            raise CorpusError(f"{path}:{number}: a note is needed ('hash', or why {repo} moved)")
        if repo in split:
            raise CorpusError(f"{path}:{number}: {repo} is listed twice")
        split[repo] = side
    return split


def split_of(entries: list[CorpusRepo], split: dict[str, str]) -> dict[str, str]:
    """Each listed repository's side; every repository must have one (the split is fixed before judging)."""
    unsplit = [e.repo for e in entries if e.repo not in split]
    if unsplit:
        raise CorpusError(f"not in split.tsv: {', '.join(unsplit)}")
    return {e.repo: split[e.repo] for e in entries}
