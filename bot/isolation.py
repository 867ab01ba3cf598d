"""Analyze untrusted files in a forked child, so that nothing a file does to the parser can take the
worker down.

The complexity guard (analyzers.guard) stops the inputs known to crash or stall libcst; this is the
backstop for the ones nobody knows yet. The child analyzes the files one after another and sends
each result back as soon as it has it; if it dies (a signal: SIGSEGV, the memory limit) or stalls
past the per-file time limit, the file it was on gets an error entry and a fresh child goes on with
the rest. A fork costs about a millisecond: the child shares the worker's imported modules.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import time
from typing import Callable, Iterable, Optional, TypeVar

Result = TypeVar("Result")

FILE_SECONDS = 60.0  # one file's analysis; a normal file takes well under a second
MEMORY_BYTES = 3 << 30  # the child's data segment: libcst needs ~1 GB for a 1 MB file
_HEADER = struct.Struct("!Q")
_OUT_OF_MEMORY = 3


def run_isolated(items: Iterable[tuple[str, object]], analyze: Callable[[str, object], Result],
                 failed: Callable[[str, str, str], Result], *, seconds: float = FILE_SECONDS,
                 memory: Optional[int] = MEMORY_BYTES) -> dict[str, Result]:
    """``analyze(key, item)`` for every item, in a child; ``failed(key, kind, message)`` stands in
    for the result of an item whose analysis crashed (kind "parser-crash") or ran out of time
    ("timeout"). Results must pickle."""
    pending = list(items)
    results: dict[str, Result] = {}
    if not hasattr(os, "fork"):  # no fork (not Linux/macOS): in-process, guarded by analyzers.guard only
        return {key: analyze(key, item) for key, item in pending}
    while pending:
        done, problem = _one_child(pending, analyze, seconds, memory)
        for key, result in done:
            results[key] = result
        pending = pending[len(done):]
        if problem is not None and pending:
            key = pending.pop(0)[0]  # the file the child was on when it died
            results[key] = failed(key, *problem)
    return results


def _one_child(pending, analyze, seconds, memory):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: analyze, report each result, never return into the worker's code
        status = 0
        try:
            os.close(read_end)
            import faulthandler

            faulthandler.disable()  # the parent reports a crash; no traceback dump into the worker's log
            if memory:
                import resource

                limit = _data_bytes() + memory  # on top of what the fork already shares with the worker
                resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            for key, item in pending:
                data = pickle.dumps((key, analyze(key, item)), protocol=pickle.HIGHEST_PROTOCOL)
                _write_all(write_end, _HEADER.pack(len(data)) + data)
        except MemoryError:
            status = _OUT_OF_MEMORY
        except BaseException:  # noqa: BLE001 - the parent sees the file unfinished and reports it
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    done: list[tuple[str, object]] = []
    problem = None
    buffer = b""
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                problem = ("timeout", f"analysis took over {seconds:.0f} s; stopped")
                break
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break  # the child exited (or died)
            buffer += chunk
            while len(buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(buffer)
                if len(buffer) < _HEADER.size + size:
                    break
                done.append(pickle.loads(buffer[_HEADER.size:_HEADER.size + size]))
                buffer = buffer[_HEADER.size + size:]
                deadline = time.monotonic() + seconds  # the next file gets its own time
    finally:
        os.close(read_end)
        if problem is not None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if problem is None and len(done) < len(pending):
        if os.WIFSIGNALED(status):
            problem = ("parser-crash", f"the analysis crashed ({signal.Signals(os.WTERMSIG(status)).name}); not analyzed")
        elif os.WEXITSTATUS(status) == _OUT_OF_MEMORY:
            problem = ("parser-crash", f"the analysis needed over {memory >> 20} MiB; not analyzed")
        else:
            problem = ("parser-crash", f"the analysis failed (exit status {os.WEXITSTATUS(status)}); not analyzed")
    return done, problem


def _data_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
