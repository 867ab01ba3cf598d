"""Materialise the evaluation corpus (``bench/corpus/repos.tsv``) in a cache outside this repository.

Each repository is extracted at its pinned commit into ``CACHE/owner+name/`` (the code is never committed:
it belongs to its authors), with ``CACHE/owner+name/.torchreview-corpus-commit`` recording the commit.
The sources of a repository, tried in order:

- ``--mirrors DIR``: a directory of git mirrors, one per repository, as ``DIR/owner+name/repo`` (bare, or a
  clone with its ``.git``), ``DIR/owner+name.git``, ``DIR/owner+name`` or ``DIR/owner/name``;
- ``--clone``: ``git clone --filter=blob:none https://github.com/owner/name`` (needs the network), kept in
  ``CACHE/.mirrors`` so a re-run does not clone again.

    python bench/corpus/fetch.py [--cache DIR] [--mirrors DIR] [--clone] [--only owner/name ...]

The cache defaults to ``$TORCHREVIEW_CORPUS`` or ``~/.cache/torchreview-corpus``. A repository already
extracted at its commit is kept. At the end it prints what is missing (no source had the commit) and
exits 1 if anything is: the figures of ``bench/corpus_precision.py`` then cover fewer repositories, and say so.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:
    sys.path.insert(0, str(HERE.parents[1]))

from bench.corpus.corpus import COMMIT_MARKER, CorpusRepo, default_cache, read_repos, slug  # noqa: E402


def mirror_candidates(mirrors: Path, repo: str) -> list[Path]:
    owner, name = repo.split("/", 1)
    base = mirrors / slug(repo)
    return [base / "repo" / ".git", base / "repo", mirrors / f"{slug(repo)}.git", base / ".git", base,
            mirrors / owner / name / ".git", mirrors / owner / name]


def has_commit(git_dir: Path, commit: str) -> bool:
    done = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True)
    return done.returncode == 0


def find_mirror(mirrors: Optional[Path], entry: CorpusRepo) -> Optional[Path]:
    if mirrors is None:
        return None
    for candidate in mirror_candidates(mirrors, entry.repo):
        if candidate.is_dir() and (candidate / "objects").is_dir() and has_commit(candidate, entry.commit):
            return candidate
    return None


def clone(cache: Path, entry: CorpusRepo) -> Optional[Path]:
    target = cache / ".mirrors" / f"{slug(entry.repo)}.git"
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["git", "clone", "--quiet", "--bare", "--filter=blob:none",
                               f"https://github.com/{entry.repo}.git", str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"  {entry.repo}: git clone failed: {done.stderr.strip()}", file=sys.stderr)
            shutil.rmtree(target, ignore_errors=True)
            return None
    if not has_commit(target, entry.commit):
        subprocess.run(["git", "--git-dir", str(target), "fetch", "--quiet", "origin", entry.commit],
                       capture_output=True)
    return target if has_commit(target, entry.commit) else None


def extracted_commit(dest: Path) -> Optional[str]:
    marker = dest / COMMIT_MARKER
    return marker.read_text().strip() if marker.is_file() else None


def extract(git_dir: Path, entry: CorpusRepo, dest: Path) -> int:
    """Write the commit's files into a fresh directory, then swap it in (a half-extracted tree never stays)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{slug(entry.repo)}.", dir=dest.parent))
    try:
        skipped = write_tree(git_dir, entry.commit, staging)
        (staging / COMMIT_MARKER).write_text(entry.commit + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
        return skipped
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_tree(git_dir: Path, commit: str, root: Path, keep: Callable[[str], bool] = lambda path: True) -> int:
    """Write the files of ``commit`` that ``keep`` accepts under ``root``; returns how many the mirror lacks.

    Not ``git archive``: a mirror may lack some blobs (snapshots without their largest files, a partial
    clone); those are skipped and counted, as they would be absent from any user's shallow checkout."""
    listing = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", "-z", commit],
                             capture_output=True, check=True).stdout
    blobs = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, raw_path = record.split(b"\t", 1)
        mode, kind, sha = meta.split()
        path = raw_path.decode("utf-8", "surrogateescape")
        if kind == b"blob" and mode in (b"100644", b"100755") and keep(path):
            blobs.append((sha.decode(), path))
    return _write_blobs(git_dir, blobs, root)


def _write_blobs(git_dir: Path, blobs: list[tuple[str, str]], root: Path) -> int:
    """``git cat-file --batch`` for every blob; returns how many the mirror lacks."""
    request = "".join(f"{sha}\n" for sha, _ in blobs).encode()
    with tempfile.TemporaryFile() as out:
        subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "--batch"], input=request, stdout=out,
                       stderr=subprocess.DEVNULL, check=True)
        out.seek(0)
        skipped = 0
        for sha, relative in blobs:
            header = out.readline().split()
            if len(header) == 2 and header[1] == b"missing":
                skipped += 1
                continue
            content = out.read(int(header[2]))
            out.read(1)  # the newline after each object
            target = (root / relative).resolve()
            if root.resolve() not in target.parents:
                continue  # a path that leaves the tree: never written
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    return skipped


def materialise(entries: Iterable[CorpusRepo], cache: Path, mirrors: Optional[Path], use_clone: bool) -> list[str]:
    """Extract every entry; returns the repositories no source could provide."""
    missing = []
    for entry in entries:
        dest = cache / slug(entry.repo)
        if extracted_commit(dest) == entry.commit:
            continue
        source = find_mirror(mirrors, entry) or (clone(cache, entry) if use_clone else None)
        if source is None:
            missing.append(entry.repo)
            continue
        try:
            skipped = extract(source, entry, dest)
        except (subprocess.CalledProcessError, OSError, ValueError) as exc:
            print(f"  {entry.repo}: extraction failed: {exc}", file=sys.stderr)
            missing.append(entry.repo)
            continue
        absent = f" ({skipped} files the mirror lacks, skipped)" if skipped else ""
        print(f"  {entry.repo} @ {entry.commit[:12]}{absent}")
    return missing


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", type=Path, default=HERE / "repos.tsv", help="the corpus list (repos.tsv)")
    parser.add_argument("--cache", type=Path, default=None, help="where to extract (default $TORCHREVIEW_CORPUS "
                        "or ~/.cache/torchreview-corpus)")
    parser.add_argument("--mirrors", type=Path, default=None, help="a directory of git mirrors (see above)")
    parser.add_argument("--clone", action="store_true", help="clone what no mirror has from GitHub")
    parser.add_argument("--only", nargs="*", default=None, help="only these owner/name")
    args = parser.parse_args(argv)
    if args.mirrors is None and not args.clone:
        parser.error("give --mirrors DIR, --clone, or both")
    if args.mirrors is not None and not args.mirrors.is_dir():
        parser.error(f"--mirrors {args.mirrors}: not a directory")
    entries = read_repos(args.list)
    if args.only:
        unknown = set(args.only) - {e.repo for e in entries}
        if unknown:
            parser.error(f"not in {args.list}: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e.repo in args.only]
    cache = args.cache or default_cache()
    missing = materialise(entries, cache, args.mirrors, args.clone)
    present = len(entries) - len(missing)
    print(f"{present}/{len(entries)} repositories at their pinned commit in {cache}")
    if missing:
        print(f"missing ({len(missing)}): " + " ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
