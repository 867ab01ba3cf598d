"""A repository's code at one commit, as data: for the static review's repository context.

The zipball, not the tarball: the smoke job downloads tarballs to *run* code (only after authorization),
and keeping the two apart keeps that boundary visible in every request log. Extraction is safe and capped:
regular files only, no absolute or escaping paths, at most ``max_bytes`` unpacked in ``max_files`` files,
checked from the archive's directory before anything is written, and the directory itself at most
``max_entries`` entries, counted before zipfile builds its list of them.
"""
from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

import requests

MAX_DOWNLOAD_BYTES = 200 << 20
MAX_CODE_BYTES = 256 << 20
MAX_CODE_FILES = 50_000
# Entries of any kind: zipfile holds one ZipInfo (~0.8 KiB) per entry, so 1M empty entries (a 100 MiB zipball)
# cost 764 MiB and 12 s before any other cap was looked at. Twice the .py cap: data files, docs, assets.
MAX_ARCHIVE_ENTRIES = 2 * MAX_CODE_FILES

_END = struct.Struct("<4s4H2LH")  # end of central directory: signature, disks, entries, size, offset, comment
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # signature, disk, offset of the zip64 end record, disks
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")  # signature, record size, versions, disks, entries, size, offset
_ENTRY_BYTES = 46  # a central directory entry's fixed part; its name, extra field and comment follow


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
                  also: Optional[Callable[[str], bool]] = None,
                  max_download: int = MAX_DOWNLOAD_BYTES, max_bytes: int = MAX_CODE_BYTES,
                  max_files: int = MAX_CODE_FILES) -> Path:
    """The files of ``repo`` at ``ref`` whose names end with ``suffixes`` (or whose repository path ``also``
    accepts), under ``into``."""
    data = download_archive(repo, "zipball", ref, max_download, ArchiveTooLarge)
    return unpack_code(data, ref, into, suffixes=suffixes, also=also, max_bytes=max_bytes, max_files=max_files)


def _central_directory(buffer: memoryview) -> tuple[int, int]:
    """(offset, size) of a zip's central directory, from its end records (zip64 included), found as zipfile
    finds them: the last end signature within the largest comment's reach of the end."""
    tail_start = max(0, len(buffer) - _END.size - 0xFFFF)
    at = bytes(buffer[tail_start:]).rfind(b"PK\x05\x06")
    if at < 0 or tail_start + at + _END.size > len(buffer):
        raise zipfile.BadZipFile("no end of central directory record")
    at += tail_start
    _, _, _, _, _, size, offset, _ = _END.unpack_from(buffer, at)
    if size == 0xFFFFFFFF or offset == 0xFFFFFFFF:  # zip64: the real values are in the zip64 end record
        locator = at - _ZIP64_LOCATOR.size
        if locator < 0 or bytes(buffer[locator:locator + 4]) != b"PK\x06\x07":
            raise zipfile.BadZipFile("no zip64 end of central directory locator")
        record = _ZIP64_LOCATOR.unpack_from(buffer, locator)[2]
        if record + _ZIP64_END.size > len(buffer) or bytes(buffer[record:record + 4]) != b"PK\x06\x06":
            raise zipfile.BadZipFile("no zip64 end of central directory record")
        size, offset = _ZIP64_END.unpack_from(buffer, record)[-2:]
    return offset, size


def count_entries(data: io.BytesIO, limit: int) -> int:
    """How many entries the zip's central directory holds, counted by walking their headers (not trusting the
    end record's count), stopping at ``limit + 1``; no object is made per entry."""
    buffer = data.getbuffer()
    try:
        offset, size = _central_directory(buffer)
        position, end, count = offset, min(offset + size, len(buffer)), 0
        while count <= limit and position + _ENTRY_BYTES <= end and bytes(buffer[position:position + 4]) == b"PK\x01\x02":
            name, extra, comment = struct.unpack_from("<3H", buffer, position + 28)
            position += _ENTRY_BYTES + name + extra + comment
            count += 1
        return count
    finally:
        buffer.release()


def unpack_code(data: io.BytesIO, ref: str, into: Path, *, suffixes: tuple[str, ...] = (".py",),
                also: Optional[Callable[[str], bool]] = None, max_bytes: int = MAX_CODE_BYTES,
                max_files: int = MAX_CODE_FILES, max_entries: int = MAX_ARCHIVE_ENTRIES) -> Path:
    """The files of a zipball (its bytes) whose names end with ``suffixes`` or whose path in the repository
    ``also`` accepts, under ``into``, within the caps."""
    if count_entries(data, max_entries) > max_entries:
        raise ArchiveTooLarge(f"the repository zipball at {ref[:7]} has over {max_entries} entries")
    with zipfile.ZipFile(data) as archive:
        wanted = []
        for info in archive.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.is_dir() or len(parts) < 2:
                continue
            if not (info.filename.endswith(suffixes) or (also is not None and also("/".join(parts[1:])))):
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
