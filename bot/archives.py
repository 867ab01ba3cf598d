"""A repository's code at one commit, as data: for the static review's repository context.

The zipball, not the tarball: the smoke job downloads tarballs to *run* code (only after authorization),
and keeping the two apart keeps that boundary visible in every request log. Extraction is safe and capped:
regular files only, no absolute or escaping paths, at most ``max_bytes`` unpacked in ``max_files`` files,
checked from the archive's directory before anything is written.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path, PurePosixPath

import requests

MAX_DOWNLOAD_BYTES = 200 << 20
MAX_CODE_BYTES = 256 << 20
MAX_CODE_FILES = 50_000


class ArchiveTooLarge(ValueError):
    """An archive over the download or extraction caps (an archive bomb, or a huge repository)."""


def download_archive(repo, kind: str, ref: str, max_download: int, too_large: type[Exception]) -> io.BytesIO:
    """GitHub's ``tarball`` or ``zipball`` of ``ref``, in memory, refused past ``max_download`` bytes."""
    url = repo.get_archive_link(kind, ref)
    response = requests.get(url, timeout=60, stream=True)
    response.raise_for_status()
    data = io.BytesIO()
    for chunk in response.iter_content(1 << 20):
        data.write(chunk)
        if data.tell() > max_download:
            raise too_large(f"the repository {kind} at {ref[:7]} is over {max_download >> 20} MiB")
    data.seek(0)
    return data


def download_code(repo, ref: str, into: Path, *, suffixes: tuple[str, ...] = (".py",),
                  max_download: int = MAX_DOWNLOAD_BYTES, max_bytes: int = MAX_CODE_BYTES,
                  max_files: int = MAX_CODE_FILES) -> Path:
    """The files of ``repo`` at ``ref`` whose names end with ``suffixes``, under ``into``."""
    data = download_archive(repo, "zipball", ref, max_download, ArchiveTooLarge)
    with zipfile.ZipFile(data) as archive:
        wanted = []
        for info in archive.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.is_dir() or len(parts) < 2 or not info.filename.endswith(suffixes):
                continue
            if info.filename.startswith("/") or ".." in parts or (info.external_attr >> 16) & 0o170000 == 0o120000:
                continue  # absolute, escaping, or a symbolic link: never written
            wanted.append((info, PurePosixPath(*parts[1:])))  # strip GitHub's "<owner>-<repo>-<sha>/" prefix
        if len(wanted) > max_files:
            raise ArchiveTooLarge(f"the repository at {ref[:7]} has over {max_files} matching files")
        if sum(info.file_size for info, _ in wanted) > max_bytes:
            raise ArchiveTooLarge(f"the repository's code at {ref[:7]} unpacks to over {max_bytes >> 20} MiB")
        for info, relative in wanted:
            target = into.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source:
                content = source.read(info.file_size + 1)
            if len(content) > info.file_size:  # the directory lied about the size
                raise ArchiveTooLarge(f"{relative} is larger than the archive says")
            target.write_bytes(content)
    return into
