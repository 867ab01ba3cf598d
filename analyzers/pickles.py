"""Checkpoint scanning: the globals a pickle-based file imports, read from its opcodes, never unpickled.

Loading a pickle imports every global it names and calls what it reduces with, so the globals alone
say whether loading it can run code (the approach of picklescan and modelscan). Covered: zip-format
torch checkpoints (the ``*/data.pkl`` member; tensor data lives in other members, never read), legacy
torch files (several concatenated pickles, then raw storage bytes), plain pickles (``.pkl``, joblib
files), NumPy ``.npy``/``.npz`` object arrays (the pickle after the ``.npy`` header), and ``safetensors``
headers. Everything is streamed: a pickle's long byte strings (tensor data pickled inline) are skipped
unread, so memory stays bounded whatever the file's size.
"""
from __future__ import annotations

import _compat_pickle
import io
import json
import pickletools
import struct
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator, Optional

PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".pkl", ".pickle", ".joblib", ".npy", ".npz")
SAFETENSORS_SUFFIX = ".safetensors"
CHECKPOINT_SUFFIXES = PICKLE_SUFFIXES + (SAFETENSORS_SUFFIX,)

# What torch's weights-only unpickler accepts by default: ``_get_allowed_globals`` and
# ``_tensor_rebuild_functions`` in torch/_weights_only_unpickler.py (torch 2.13), spelled out here because
# analyzers never import torch. Dtypes, tensor and storage classes are matched by pattern below.
TORCH_WEIGHTS_ONLY_GLOBALS = frozenset({
    "collections.OrderedDict", "collections.Counter",
    "torch.nn.parameter.Parameter", "torch.serialization._get_layout", "torch.Size", "torch.Tensor",
    "torch.device", "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
    "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.per_channel_affine",
    "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_qtensor", "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_sparse_tensor",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_nested_tensor",
    "torch._utils._rebuild_wrapper_subclass", "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor", "torch._tensor._rebuild_from_type_v2",
    # torch.storage.TypedStorage / UntypedStorage keep their module name
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage", "torch.storage._LegacyStorage",
})
# What NumPy's own pickling emits for arrays, dtypes and scalars (.npy object arrays, joblib, pickled
# arrays): reconstructors that build an array from its bytes, no code. torch needs these added through
# ``add_safe_globals``; they are not a way to run code.
NUMPY_GLOBALS = frozenset({
    f"{module}.{name}" for module in ("numpy.core.multiarray", "numpy._core.multiarray")
    for name in ("_reconstruct", "scalar")
} | {"numpy.ndarray", "numpy.dtype", "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer"})
_TORCH_DTYPE_NAMES = frozenset({
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "complex32", "chalf", "complex64",
    "cfloat", "complex128", "cdouble", "uint8", "int8", "int16", "short", "int32", "int", "int64", "long",
    "bool", "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8",
    "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "uint16", "uint32", "uint64",
} | {f"uint{n}" for n in range(1, 8)} | {f"int{n}" for n in range(1, 8)})

_TORCH_CLASS_MODULES = frozenset({"torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse"})

# Globals that run code, spawn processes, touch files or the network when called: loading a pickle
# that imports one is code execution (the lists picklescan and modelscan keep, by module).
_DANGEROUS_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "_posixsubprocess", "pty", "runpy", "sys", "socket", "shutil",
    "importlib", "pickle", "_pickle", "cPickle", "marshal", "code", "codeop", "pdb", "bdb", "webbrowser",
    "ctypes", "pydoc", "timeit", "multiprocessing", "asyncio", "requests", "urllib", "urllib2", "http",
    "httplib", "ftplib", "smtplib", "telnetlib", "platform", "signal", "commands", "pip", "setuptools",
    "distutils", "ensurepip", "venv", "dill", "cloudpickle", "torch.hub", "torch.jit", "torch.package",
    "torch.utils.cpp_extension", "torch._dynamo", "torch._inductor", "numpy.f2py", "numpy.distutils",
    "numpy.testing", "IPython", "joblib", "tensorflow", "keras", "_io", "io",
    "tempfile", "glob", "zipimport", "linecache", "posixpath", "ntpath", "pathlib", "_operator",
})
_DANGEROUS_GLOBALS = frozenset({
    # not functools.partial (Hydra/Lightning configs pickle it): what it wraps is a global of its own, checked
    "operator.attrgetter", "operator.methodcaller", "operator.itemgetter", "functools.reduce", "torch.load", "torch.serialization.load", "torch.save", "numpy.load",
    "numpy.save", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt", "numpy.lib.npyio.load",
    "numpy.lib._npyio_impl.load",
})
# Path classes (Lightning hyper-parameters hold them): building one touches no file; their methods
# (``pathlib.Path.write_text``) stay dangerous.
_PATH_CLASSES = frozenset({"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"})
# Builtins that are plain data types: not allowlisted by torch, but calling them runs no code.
_INERT_BUILTINS = frozenset({
    "int", "float", "bool", "str", "bytes", "tuple", "list", "dict", "frozenset", "slice", "range", "object",
})

MAX_SAFETENSORS_HEADER = 100_000_000  # the limit the safetensors library itself enforces
_SKIP_ARGUMENT_BYTES = 1 << 16  # longer string/bytes arguments (inline tensor data) are skipped unread
_LEGACY_TORCH_PICKLES = 5  # magic number, protocol, sys info, the object, storage keys; then raw bytes
# torch's legacy format opens with a pickle of its magic number 0x1950a86a20f9469cfc6c (LONG1, 10 bytes), whatever
# the file is called: a torch.save to model.pkl is a legacy torch file too, with raw storage bytes after 5 pickles
_LEGACY_TORCH_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_ZIP_MAGIC = b"PK\x03\x04"
_LFS_POINTER = b"version https://git-lfs"  # the checkpoint lives in LFS storage, not in this file
_NPY_MAGIC = b"\x93NUMPY"


class ScanError(Exception):
    """A file the scanner cannot read as the format its name says."""


@dataclass(frozen=True)
class ImportedGlobal:
    module: str
    name: str
    where: str  # the zip member, or "pickle 2 of the stream"
    offset: int  # byte offset of the opcode in that pickle

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name


@dataclass
class ScanReport:
    """What one file imports; ``problems``: what stopped the scan of a part (a malformed pickle, a bad
    safetensors header). A global the scanner cannot name is an ``ImportedGlobal`` with module ``?``."""

    path: str
    kind: str  # zip-checkpoint | pickle | npy | npz | safetensors
    imports: list[ImportedGlobal] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


UNRESOLVED = "?"


def verdict(imported: ImportedGlobal) -> str:
    """``allowed``, ``dangerous`` (loading runs code) or ``unknown`` (weights_only=True refuses it)."""
    dotted = imported.dotted
    module, name = imported.module, imported.name
    if module == UNRESOLVED:
        return "dangerous"
    if dotted in TORCH_WEIGHTS_ONLY_GLOBALS or dotted in NUMPY_GLOBALS or dotted in JOBLIB_ARRAY_WRAPPERS:
        return "allowed"
    if module == "torch" and name in _TORCH_DTYPE_NAMES:
        return "allowed"  # torch.float32 and the other dtypes
    if module in _TORCH_CLASS_MODULES and name.isidentifier() and name.endswith(("Storage", "Tensor")):
        return "allowed"  # torch._tensor_classes, torch._storage_classes: torch.cuda.sparse.FloatTensor...
    if module == "numpy" and name.startswith("dtype"):
        return "allowed"
    if module.startswith(("numpy.dtypes", "numpy.core.numerictypes")):  # dtype classes (numpy.dtypes.Float32DType)
        return "allowed"
    if module == "pathlib" and name in _PATH_CLASSES:
        return "unknown"
    if dotted in _DANGEROUS_GLOBALS or any(module == m or module.startswith(m + ".") for m in _DANGEROUS_MODULES):
        return "dangerous"
    if module in ("builtins", "__builtin__"):
        return "unknown" if name in _INERT_BUILTINS else "dangerous"
    return "unknown"


# ---------------------------------------------------------------------------------------------
# Reading files


def scan_file(path: Path, display: Optional[str] = None) -> ScanReport:
    display = display or str(path)
    if display.endswith(SAFETENSORS_SUFFIX):
        report = ScanReport(display, "safetensors")
        report.problems.extend(safetensors_problems(path))
        return report
    with path.open("rb") as stream:
        head = stream.read(len(_LFS_POINTER))
        stream.seek(0)
        if not head:
            return ScanReport(display, "empty")  # nothing to load, nothing to run
        if head == _LFS_POINTER:
            return ScanReport(display, "lfs-pointer")
        if head.startswith(_ZIP_MAGIC):
            return _scan_zip(path, display)
        if head.startswith(_NPY_MAGIC):
            report = ScanReport(display, "npy")
            _scan_npy(stream, display, report)
            return report
        report = ScanReport(display, "pickle")
        if display.lower().endswith(".bin") and not head.startswith(b"\x80"):
            return report  # a raw binary (weights of another format, a tokenizer), not a pickle
    opener = _decompressor(head) if display.lower().endswith((".joblib", ".pkl", ".pickle")) else None
    if opener is not None:  # joblib.dump(..., compress=...): the pickle stream is compressed whole
        report.kind = "compressed pickle"
    legacy_torch = display.endswith((".pt", ".pth", ".ckpt", ".bin")) or (
        head[:1] == b"\x80" and head[2:2 + len(_LEGACY_TORCH_MAGIC)] == _LEGACY_TORCH_MAGIC)
    limit = _LEGACY_TORCH_PICKLES if legacy_torch else None
    with _opened(path, opener) as stream:
        arrays = _scan_pickles(stream, report, "pickle", limit, joblib_arrays=not legacy_torch)
    if arrays:
        # joblib.load steps over the arrays' bytes; pickle.load of the same file reads them as opcodes, and
        # whatever they hold runs before it fails: that reading is scanned too (its failing is expected).
        plain = ScanReport(display, report.kind)
        with _opened(path, opener) as stream:
            _scan_pickles(stream, plain, "pickle read by pickle.load", limit, joblib_arrays=False)
        report.imports.extend(plain.imports)
    return report


@contextmanager
def _opened(path: Path, opener) -> Iterator[IO[bytes]]:
    with path.open("rb") as raw:
        if opener is None:
            yield raw
        else:
            with opener(raw) as stream:
                yield stream


def _decompressor(head: bytes):
    """How to stream a compressed pickle (joblib's compressors, all in the standard library but lz4), by its
    magic bytes; none of them starts a valid pickle."""
    import bz2
    import gzip
    import lzma

    if head.startswith(b"\x1f\x8b"):
        return lambda stream: gzip.GzipFile(fileobj=stream)
    if head.startswith(b"BZh"):
        return lambda stream: bz2.BZ2File(stream)
    if head.startswith(b"\xfd7zXZ\x00"):
        return lambda stream: lzma.LZMAFile(stream, format=lzma.FORMAT_XZ)
    if head.startswith(b"]\x00\x00"):
        return lambda stream: lzma.LZMAFile(stream, format=lzma.FORMAT_ALONE)
    if head[:1] == b"x" and len(head) > 1 and (head[0] << 8 | head[1]) % 31 == 0:  # a zlib header
        return lambda stream: io.BufferedReader(_ZlibReader(stream))
    return None


class _ZlibReader(io.RawIOBase):
    """A zlib stream (joblib's default compressor) read as a file, a chunk at a time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.inflate = zlib.decompressobj()
        self.buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while not self.buffer:  # at most 1 MiB inflated at a time, whatever the ratio
            if self.inflate.unconsumed_tail:
                self.buffer = self.inflate.decompress(self.inflate.unconsumed_tail, 1 << 20)
                continue
            chunk = b"" if self.inflate.eof else self.stream.read(1 << 16)
            if not chunk:
                return 0
            self.buffer = self.inflate.decompress(chunk, 1 << 20)
        size = min(len(target), len(self.buffer))
        target[:size] = self.buffer[:size]
        self.buffer = self.buffer[size:]
        return size


def _scan_zip(path: Path, display: str) -> ScanReport:
    """A torch zip checkpoint (``archive/data.pkl``, plus any other ``.pkl`` member) or an ``.npz``."""
    kind = "npz" if display.endswith(".npz") else "zip-checkpoint"
    report = ScanReport(display, kind)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        report.problems.append(f"not a readable zip archive: {exc}")
        return report
    with archive:
        members = [info for info in archive.infolist() if not info.is_dir()]
        pickles = [m for m in members if m.filename.endswith(".pkl")]
        arrays = [m for m in members if m.filename.endswith(".npy")] if kind == "npz" else []
        if kind == "zip-checkpoint" and not pickles:
            report.problems.append("a zip archive without a data.pkl: not a torch checkpoint")
        for member in pickles:
            with archive.open(member) as stream:
                _scan_pickles(stream, report, member.filename, limit=1)  # torch.load reads one pickle
        for member in arrays:
            with archive.open(member) as stream:
                _scan_npy(stream, member.filename, report)
    return report


def _scan_npy(stream: IO[bytes], where: str, report: ScanReport) -> None:
    """An ``.npy`` array: a header dict; when its dtype holds objects, a pickle follows."""
    magic = stream.read(8)
    if len(magic) < 8 or not magic.startswith(_NPY_MAGIC):
        report.problems.append(f"{where}: not an .npy array (bad magic)")
        return
    size_format = "<H" if magic[6] == 1 else "<I"
    size_bytes = stream.read(struct.calcsize(size_format))
    if len(size_bytes) != struct.calcsize(size_format):
        report.problems.append(f"{where}: truncated .npy header")
        return
    (header_length,) = struct.unpack(size_format, size_bytes)
    if header_length > 1_000_000:
        report.problems.append(f"{where}: .npy header of {header_length} bytes")
        return
    header = stream.read(header_length).decode("latin-1")
    # The header is a Python dict literal; object arrays say 'descr': '|O'. Not evaluated, only searched.
    if "'|O'" in header or '"|O"' in header or "('O'" in header or "'O'" in header:
        _scan_pickles(stream, report, f"{where} (object array)", limit=1)


def _scan_pickles(stream: IO[bytes], report: ScanReport, where: str, limit: Optional[int],
                  joblib_arrays: bool = False) -> int:
    """Every pickle in the stream (pickle.load reads them one after another) until its end, or ``limit``
    pickles (a legacy torch file: after them come raw storage bytes). ``joblib_arrays``: read it as
    joblib.load does, stepping over the array bytes after each array wrapper; returns how many it stepped."""
    reader = _BoundedReader(stream)
    reader.joblib_arrays = joblib_arrays
    count = 0
    while limit is None or count < limit:
        if not reader.peek():
            if count == 0:
                report.problems.append(f"{where}: empty")
            break
        count += 1
        label = where if limit == 1 else f"{where} {count}"
        try:
            report.imports.extend(_globals_in_pickle(reader, label))
        except _Malformed as exc:
            report.problems.append(f"{label}: {exc}")
            break
    return reader.arrays_stepped


class _Malformed(Exception):
    pass


class _Skipped(bytes):
    """A long argument that was not read: its true length for genops' checks, placeholder content."""

    def __new__(cls, length: int):
        self = super().__new__(cls, b"\x00skipped")
        self.length = length
        return self

    def __len__(self) -> int:
        return self.length


class _BoundedReader:
    """The file object genops reads from: long ``read``/``readline`` requests are skipped in chunks (the
    bytes of tensors pickled inline), so no argument of any size is held in memory."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.position = 0
        self.pending = b""
        self.joblib_arrays = False  # step over the bytes joblib writes after an array wrapper
        self.arrays_stepped = 0

    def peek(self) -> bytes:
        if not self.pending:
            self.pending = self.stream.read(1)
        return self.pending

    def _raw(self, n: int) -> bytes:
        head, self.pending = self.pending[:n], self.pending[n:]
        data = head + (self.stream.read(n - len(head)) if n > len(head) else b"")
        self.position += len(data)
        return data

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise _Malformed("unbounded read")
        if n <= _SKIP_ARGUMENT_BYTES:
            return self._raw(n)
        remaining = n
        while remaining:
            chunk = self._raw(min(remaining, 1 << 20))
            if not chunk:
                return b""  # truncated: genops reports it
            remaining -= len(chunk)
        return _Skipped(n)

    def readline(self) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            byte = self._raw(1)
            if not byte:
                return line
            if len(line) < _SKIP_ARGUMENT_BYTES:
                line += byte
        return line

    def tell(self) -> int:
        return self.position


_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
               "BINUNICODE8"}
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_UNKNOWN = object()  # a stack value the scanner does not model
_SMALL = 64  # tuples and dicts are modelled up to this size (a joblib wrapper's state); larger ones are unknown
JOBLIB_ARRAY_WRAPPERS = frozenset({"joblib.numpy_pickle.NumpyArrayWrapper",
                                   "sklearn.externals.joblib.numpy_pickle.NumpyArrayWrapper"})


class _Global:
    def __init__(self, dotted: str) -> None:
        self.dotted = dotted


class _Instance:
    """An object a pickle builds from a global (REDUCE, NEWOBJ): its class, and the state BUILD gives it."""

    def __init__(self, dotted: str) -> None:
        self.dotted = dotted
        self.dtype: Optional[str] = None  # numpy.dtype(...)'s first argument ("f8", "O8", "U")
        self.elsize = 0  # a flexible dtype's item size, from its BUILD state
        self.state = None


def _globals_in_pickle(reader: _BoundedReader, where: str) -> Iterator[ImportedGlobal]:
    """The globals one pickle imports, in order. The stack and memo are emulated (as pickletools.dis does)
    for the few values that matter: the strings STACK_GLOBAL takes (a name built any other way is reported
    unresolved), and the shape and dtype of a joblib array whose bytes follow its wrapper in the stream."""
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    try:
        for opcode, arg, offset in pickletools.genops(reader):
            name = opcode.name
            imported = None
            if name in ("GLOBAL", "INST"):
                module, _, attribute = str(arg).partition(" ")
                imported = _imported(module, attribute, where, offset)
            elif name == "STACK_GLOBAL":
                pair = stack[-2:]
                imported = (_imported(pair[0], pair[1], where, offset)
                            if len(pair) == 2 and all(_is_name(v) for v in pair)
                            else ImportedGlobal(UNRESOLVED, "a name built on the pickle stack", where, offset))
            if imported is not None:
                yield imported
            built = _emulate(opcode, arg, stack, marks, memo, imported)
            if reader.joblib_arrays and isinstance(built, _Instance) and built.dotted in JOBLIB_ARRAY_WRAPPERS:
                reader.arrays_stepped += 1
                yield from _skip_joblib_array(reader, built, where)
    except (ValueError, IndexError) as exc:  # genops: unknown opcode, truncated argument
        raise _Malformed(str(exc)) from None


def _emulate(opcode, arg, stack: list, marks: list[int], memo: dict, imported: Optional[ImportedGlobal]):
    """Apply one opcode to the emulated stack; returns the object a BUILD completed, else None."""
    name = opcode.name
    before = opcode.stack_before
    if name == "MARK":
        marks.append(len(stack))
        return None
    if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
        memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1] if stack else _UNKNOWN
        return None
    if name in ("GET", "BINGET", "LONG_BINGET"):
        stack.append(memo.get(arg, _UNKNOWN))
        return None
    if name == "DUP":
        stack.append(stack[-1] if stack else _UNKNOWN)
        return None
    pops = len(before)
    marked: list = []
    if pickletools.markobject in before or (name == "POP" and marks and marks[-1] == len(stack)):
        if not marks:
            raise _Malformed(f"{name} without a MARK")
        start = marks.pop()
        marked = stack[start:]
        del stack[start:]
        pops = before.index(pickletools.markobject) if pickletools.markobject in before else 0
    if pops > len(stack):
        raise _Malformed(f"{name} pops more than the stack holds")
    popped = stack[len(stack) - pops:] if pops else []
    del stack[len(stack) - pops:]
    value = _value(name, arg, popped, marked, imported)
    stack.extend(value for _ in opcode.stack_after)
    return value if name == "BUILD" else None


def _value(name: str, arg, popped: list, marked: list, imported: Optional[ImportedGlobal]):
    """What an opcode pushes, as far as the scanner models it."""
    if name in _STRING_OPS:
        return arg if isinstance(arg, str) else _UNKNOWN
    if name in _INT_OPS:
        return arg if isinstance(arg, int) else _UNKNOWN
    if name in _CONSTANTS:
        return _CONSTANTS[name]
    if name in ("GLOBAL", "STACK_GLOBAL"):
        return _Global(imported.dotted) if imported is not None and imported.module != UNRESOLVED else _UNKNOWN
    if name in ("EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
        return tuple(popped)
    if name == "TUPLE":
        return tuple(marked) if len(marked) <= _SMALL else _UNKNOWN
    if name == "EMPTY_DICT":
        return {}
    if name in ("SETITEM", "SETITEMS"):
        target, pairs = popped[0], (popped[1:] if name == "SETITEM" else marked)
        if isinstance(target, dict):
            try:
                target.update(zip(pairs[::2], pairs[1::2]))
            except TypeError:  # an unhashable key: not a state the scanner needs
                pass
            if len(target) > _SMALL:
                target.clear()
        return target
    if name in ("REDUCE", "NEWOBJ", "NEWOBJ_EX"):
        factory, arguments = popped[0], popped[1]
        if not isinstance(factory, _Global):
            return _UNKNOWN
        built = _Instance(factory.dotted)
        if factory.dotted == "numpy.dtype" and isinstance(arguments, tuple) and arguments \
                and isinstance(arguments[0], str):
            built.dtype = arguments[0]
        return built
    if name == "BUILD":
        target, state = popped
        if isinstance(target, _Instance):
            target.state = state
            if target.dtype is not None and isinstance(state, tuple) and len(state) > 5 \
                    and isinstance(state[5], int) and state[5] > 0:
                target.elsize = state[5]
        return target
    return _UNKNOWN


def _skip_joblib_array(reader: _BoundedReader, wrapper: _Instance, where: str) -> Iterator[ImportedGlobal]:
    """joblib writes each NumPy array's bytes into the stream right after its wrapper (joblib's
    ``NumpyArrayWrapper.write_array``): step over them, or, for an object array, scan the pickle they are."""
    state = wrapper.state if isinstance(wrapper.state, dict) else {}
    dtype, shape = state.get("dtype"), state.get("shape")
    if not isinstance(dtype, _Instance) or dtype.dtype is None:
        raise _Malformed("a joblib array whose dtype the scanner cannot read: where the pickle goes on is unknown")
    if dtype.dtype.lstrip("<>|=").startswith("O"):
        reader.joblib_arrays = False  # joblib reads it with plain pickle.load: wrappers in it are just objects
        try:
            yield from _globals_in_pickle(reader, f"{where} (a joblib object array)")
        finally:
            reader.joblib_arrays = True
        return
    itemsize = dtype.elsize or _dtype_itemsize(dtype.dtype)
    if not (isinstance(shape, tuple) and all(isinstance(n, int) and n >= 0 for n in shape)) or not itemsize:
        raise _Malformed(f"a joblib array of shape {shape!r} and dtype {dtype.dtype!r}: its size is unknown")
    if state.get("numpy_array_alignment_bytes") is not None:  # joblib >= 1.2: a padding length, then padding
        padding = reader.read(1)
        if len(padding) != 1:
            raise _Malformed("truncated joblib array padding")
        reader.read(padding[0])
    count = 1
    for n in shape:
        count *= n
    if len(reader.read(count * itemsize)) != count * itemsize:
        raise _Malformed("truncated joblib array data")


def _dtype_itemsize(code: str) -> int:
    """The item size a dtype code names (``f8``: 8, ``c16``: 16, ``b1``: 1); 0 when it names none."""
    digits = code.lstrip("<>|=")[1:].split("[", 1)[0]
    size = int(digits) if digits.isdigit() else 0
    return size * 4 if code.lstrip("<>|=").startswith("U") else size


def _is_name(value) -> bool:
    return isinstance(value, str) and value != "" and "\x00" not in value and "\n" not in value


def _imported(module: str, name: str, where: str, offset: int) -> ImportedGlobal:
    if not (_is_name(module) and _is_name(name)):
        return ImportedGlobal(UNRESOLVED, "a name the scanner cannot read", where, offset)
    # As the unpickler does for protocol < 3 pickles written by Python 2 (torch does the same).
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return ImportedGlobal(module, name, where, offset)


# ---------------------------------------------------------------------------------------------
# safetensors


def safetensors_problems(path: Path) -> list[str]:
    """What is wrong with a safetensors file's header: its length (8 bytes, little-endian), its JSON, each
    tensor's dtype, shape and byte range (within the data, consistent with dtype and shape)."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            return ["shorter than the 8-byte header length"]
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > MAX_SAFETENSORS_HEADER:
            return [f"header length {header_length} exceeds {MAX_SAFETENSORS_HEADER} bytes"]
        if 8 + header_length > size:
            return [f"header length {header_length} runs past the end of the {size}-byte file"]
        raw = stream.read(header_length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"header is not JSON: {exc}"]
    if not isinstance(header, dict):
        return ["header is not a JSON object"]
    data_size = size - 8 - header_length
    problems: list[str] = []
    spans: list[tuple[int, int, str]] = []
    for tensor, info in header.items():
        if tensor == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                problems.append("__metadata__ must map strings to strings")
            continue
        problem = _tensor_problem(tensor, info, data_size, spans)
        if problem:
            problems.append(problem)
    spans.sort()
    for (start, end, first), (next_start, _, second) in zip(spans, spans[1:]):
        if next_start < end:
            problems.append(f"tensors {first!r} and {second!r} overlap")
    return problems


_SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}


def _tensor_problem(tensor: str, info, data_size: int, spans: list) -> Optional[str]:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        return f"tensor {tensor!r}: needs exactly dtype, shape and data_offsets"
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in _SAFETENSORS_DTYPE_BYTES:
        return f"tensor {tensor!r}: unknown dtype {dtype!r}"
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        return f"tensor {tensor!r}: shape {shape!r} is not a list of non-negative integers"
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        return f"tensor {tensor!r}: data_offsets {offsets!r} is not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return f"tensor {tensor!r}: data_offsets {offsets} outside the {data_size} bytes of data"
    elements = 1
    for dimension in shape:
        elements *= dimension
    if elements * _SAFETENSORS_DTYPE_BYTES[dtype] != end - begin:
        return (f"tensor {tensor!r}: {dtype} of shape {shape} needs {elements * _SAFETENSORS_DTYPE_BYTES[dtype]}"
                f" bytes, data_offsets span {end - begin}")
    spans.append((begin, end, tensor))
    return None


def is_checkpoint(path: str) -> bool:
    return path.lower().endswith(CHECKPOINT_SUFFIXES)


# ---------------------------------------------------------------------------------------------
# Findings


def checkpoint_result(path: Path, display: str, config) -> "FileResult":
    """The findings of one checkpoint file (rules TR620-TR622), as the engine reports a source file's."""
    from analyzers.model import FileError, FileResult, Finding
    from analyzers.rules.serialization.malformed_checkpoint import MalformedCheckpoint
    from analyzers.rules.serialization.pickle_runs_code import PickleRunsCode
    from analyzers.rules.serialization.pickle_unlisted_global import PickleImportsUnlistedGlobal

    result = FileResult(display)
    try:
        report = scan_file(path, display)
    except OSError as exc:
        result.errors.append(FileError(display, "read-error", str(exc)))
        return result
    enabled = {rule.id for rule in config.enabled_rules([PickleRunsCode, PickleImportsUnlistedGlobal,
                                                         MalformedCheckpoint])}
    reported: set[tuple[str, str]] = set()
    for imported in report.imports:
        kind = verdict(imported)
        if kind == "allowed" or (kind, imported.dotted) in reported:
            continue
        reported.add((kind, imported.dotted))
        if kind == "dangerous":
            rule = PickleRunsCode
            message = (f"loading this file calls `{imported.dotted}` (imported by {imported.where} at byte "
                       f"{imported.offset}): torch.load with weights_only=False, pickle.load, joblib.load or "
                       f"numpy.load(allow_pickle=True) run it. Do not load it; ask for the weights as safetensors")
            if imported.module == UNRESOLVED:
                message = (f"{imported.where} imports {imported.name} at byte {imported.offset}, which the scanner "
                           f"cannot name: treat loading it as running unknown code")
        else:
            rule = PickleImportsUnlistedGlobal
            message = (f"imports `{imported.dotted}` ({imported.where}), which torch.load(weights_only=True) "
                       f"refuses: loading it needs weights_only=False, which would also run anything else it "
                       f"imports. Save plain data instead, or allow it with torch.serialization.add_safe_globals")
        result.findings.append(_file_finding(display, rule, message, config))
    for problem in report.problems:
        result.findings.append(_file_finding(display, MalformedCheckpoint, f"{problem}: the file is not a "
                                             f"well-formed {report.kind} and cannot be vouched for", config))
    result.findings = [f for f in result.findings if f.rule in enabled and f.severity >= config.min_severity]
    result.findings.sort(key=lambda f: (-f.severity, f.rule, f.message))
    return result


def _file_finding(display: str, rule, message: str, config) -> "Finding":
    from analyzers.model import Finding

    # A binary file has no lines: the finding is on the file, line 1 by convention of SARIF and annotations.
    return Finding(path=display, line=1, column=1, end_line=1, end_column=1, rule=rule.id, slug=rule.slug,
                   category=rule.category.value, severity=config.severity_for(rule.id, rule.severity),
                   message=message)
