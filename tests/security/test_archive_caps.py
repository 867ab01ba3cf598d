"""Hostile archives (small, generated here) against the caps of the code the App fetches (issue 23, item 14):
zipfile builds one object per central-directory entry and tarfile reads a long-name or pax header whole, both
before any cap was looked at (1M zip entries: +764 MiB and 12 s; a 768 MiB long name as much). The caps now
hold while the archive is read, before what they cap is materialised."""
from __future__ import annotations

import gzip
import io
import struct
import tarfile
import tracemalloc
import zipfile

import pytest

from bot.archives import MAX_ARCHIVE_ENTRIES, ArchiveTooLarge, count_entries, unpack_code
from bot.smoke import MAX_TAR_HEADER_BYTES, TarballTooLarge, unpack_tree

REF = "abc1234" * 5
ROOT = "octo-models-abc1234"
PEAK_BYTES = 16 << 20  # what refusing may cost, far below what parsing the hostile part would


def many_entry_zip(entries: int, claimed: int | None = None) -> io.BytesIO:
    """A stored zip of ``entries`` empty files, written directly (zipfile's writer would itself hold an object
    per entry); the end record claims ``claimed`` entries (default: the truth)."""
    local, directory = bytearray(), bytearray()
    for n in range(entries):
        name = f"{ROOT}/d{n % 1000}/{n}.txt".encode()
        directory += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0,
                                 0, len(local)) + name
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name
    count = min(entries if claimed is None else claimed, 0xFFFF)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(directory), len(local), 0)
    return io.BytesIO(bytes(local + directory + end))


def peak_while(function) -> int:
    tracemalloc.start()
    try:
        function()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_the_directory_walk_counts_what_zipfile_would_list():
    for entries in (0, 3, 70_000):  # 70,000: past 65,535, a zip64 end record
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for n in range(entries):
                archive.writestr(f"{ROOT}/{n}.py", b"")
        assert count_entries(buffer, MAX_ARCHIVE_ENTRIES) == entries == len(zipfile.ZipFile(buffer).infolist())
    assert count_entries(many_entry_zip(500), 100) == 101  # stops past the limit


@pytest.mark.parametrize("claimed", [None, 1])  # the end record's count is not trusted
def test_a_zipball_of_too_many_entries_is_refused_before_they_are_listed(tmp_path, claimed):
    data = many_entry_zip(MAX_ARCHIVE_ENTRIES + 1, claimed)

    def unpack():
        with pytest.raises(ArchiveTooLarge, match=f"over {MAX_ARCHIVE_ENTRIES} entries"):
            unpack_code(data, REF, tmp_path / "code")

    assert peak_while(unpack) < PEAK_BYTES
    assert not (tmp_path / "code").exists()


def test_a_zipball_within_the_caps_is_unpacked(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{ROOT}/pkg/model.py", "import torch\n")
        archive.writestr(f"{ROOT}/README.md", "# models\n")
    code = unpack_code(buffer, REF, tmp_path / "code")
    assert [str(p.relative_to(code)) for p in code.rglob("*") if p.is_file()] == ["pkg/model.py"]


def tarball(header_type: bytes, declared: int, filler: bytes) -> io.BytesIO:
    """A gzip'd tarball whose first member is an extended header (``header_type``) of ``declared`` bytes of
    ``filler``: tiny compressed, ``declared`` bytes for tarfile to read as one string."""
    header = tarfile.TarInfo("././@LongLink" if header_type == tarfile.GNUTYPE_LONGNAME else "pax")
    header.type, header.size = header_type, declared
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as out:
        out.write(header.tobuf(tarfile.GNU_FORMAT if header_type == tarfile.GNUTYPE_LONGNAME
                               else tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
        block = filler * ((1 << 20) // len(filler))
        for _ in range(declared // len(block)):
            out.write(block)
        out.write(b"\n" * (declared % len(block)))
        member = tarfile.TarInfo(f"{ROOT}/after.py")
        member.size = 1
        out.write(member.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + b"x" + b"\0" * 511 + b"\0" * 1024)
    raw.seek(0)
    return raw


@pytest.mark.parametrize("header_type, filler", [(tarfile.GNUTYPE_LONGNAME, b"a"),
                                                 (tarfile.XHDTYPE, b"9 a=b\n")])
def test_a_long_name_or_pax_header_bomb_is_refused_before_it_is_read(tmp_path, header_type, filler):
    data = tarball(header_type, 64 << 20, filler)  # 64 MiB of header in ~64 KiB

    def unpack():
        with pytest.raises(TarballTooLarge, match="long name or pax header"):
            unpack_tree(data, tmp_path / "tree", ref=REF)

    assert peak_while(unpack) < PEAK_BYTES
    assert not (tmp_path / "tree" / "after.py").exists()


def test_a_sparse_member_is_refused(tmp_path):
    member = tarfile.TarInfo(f"{ROOT}/sparse.py")
    member.type = tarfile.GNUTYPE_SPARSE
    data = io.BytesIO(gzip.compress(member.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + b"\0" * 1024))
    with pytest.raises(TarballTooLarge, match="sparse"):
        unpack_tree(data, tmp_path / "tree", ref=REF)


def test_long_names_and_pax_headers_within_the_cap_still_unpack(tmp_path):
    deep = "/".join(["d" * 60] * 6) + "/model.py"  # a 371-character path: a pax header
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": REF}) as archive:  # GitHub's global header holds the commit
        for name, text in ((f"{ROOT}/{deep}", b"import torch\n"), (f"{ROOT}/top.py", b"x = 1\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            archive.addfile(info, io.BytesIO(text))
    raw.seek(0)
    tree = unpack_tree(raw, tmp_path / "tree", ref=REF)
    assert (tree / deep).read_bytes() == b"import torch\n" and (tree / "top.py").is_file()
    assert len(deep) < MAX_TAR_HEADER_BYTES
