"""Analyze files in forked children, each file bounded in time and memory, so that nothing a file (or a rule's
bug) does can hang or take down the process that asked: the CLI, the pre-commit hook, the Action, the language
server and the App's workers all analyze through :func:`run_isolated`.

The complexity guard (analyzers.guard) stops the inputs known to crash or stall libcst; this is the backstop
for the ones nobody knows yet. Each child analyzes the files it is handed one after another and sends each
result back as soon as it has it; if it dies (a signal: SIGSEGV, the memory limit) or stalls past the per-file
time limit, the file it was on gets an error entry and a fresh child goes on with the rest. A fork costs about
a millisecond: the child shares the parent's imported modules.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, TypeVar

from analyzers.config import FILE_TIMEOUT_DEFAULT

Result = TypeVar("Result")

MEMORY_BYTES = 3 << 30  # a child's data segment: libcst needs ~1 GB for a 1 MB file
_HEADER = struct.Struct("!Q")
_TASK = struct.Struct("!I")  # the index of the next item a child is to analyze
_OUT_OF_MEMORY = 3
# Every pipe end a parent holds, of every pool of the process: a child must close all of them, or it keeps
# another child's input open (that child never sees its end and never exits) or hides another child's death.
# The language server runs analyses from several threads at once, so forks and closes take this lock.
_FORK_LOCK = threading.Lock()
_PARENT_FDS: set[int] = set()


def run_isolated(items: Iterable[tuple[str, object]], analyze: Callable[[str, object], Result],
                 failed: Callable[[str, str, str], Result], *, seconds: float = FILE_TIMEOUT_DEFAULT,
                 memory: Optional[int] = MEMORY_BYTES, jobs: int = 1) -> dict[str, Result]:
    """``analyze(key, item)`` for every item, in up to ``jobs`` children at once; ``failed(key, kind, message)``
    stands in for the result of an item whose analysis crashed (kind "parser-crash") or ran out of time
    ("timeout"). Results must pickle."""
    pending = list(items)
    if not pending:
        return {}
    if not hasattr(os, "fork"):  # no fork (Windows): in-process, guarded by analyzers.guard only
        return {key: analyze(key, item) for key, item in pending}
    return _Pool(pending, analyze, failed, seconds, memory).run(max(1, min(jobs, len(pending))))


@dataclass
class _Child:
    pid: int
    tasks: int  # the parent's end of the pipe that hands the child item indexes
    results: int  # the parent's end of the pipe the child sends its results through
    current: Optional[int] = None  # the item it is analyzing
    deadline: float = 0.0
    buffer: bytearray = field(default_factory=bytearray)


class _Pool:
    def __init__(self, items, analyze, failed, seconds: float, memory: Optional[int]) -> None:
        self.items = items
        self.analyze = analyze
        self.failed = failed
        self.seconds = seconds
        self.memory = memory
        self.queue: deque[int] = deque(range(len(items)))
        self.children: dict[int, _Child] = {}  # by the results pipe's descriptor
        self.results: dict[str, object] = {}

    def run(self, jobs: int) -> dict[str, object]:
        try:
            while self.queue or self.children:
                while self.queue and len(self.children) < jobs:
                    self._hand_next(self._start())
                self._wait()
        finally:
            for child in list(self.children.values()):  # interrupted (Ctrl-C): leave no child behind
                self._end(child, kill=True)
        return self.results

    # ---- the parent ---------------------------------------------------------------------------------------
    def _start(self) -> _Child:
        with _FORK_LOCK:
            task_read, task_write = os.pipe()
            result_read, result_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (*_PARENT_FDS, task_write, result_read):
                    os.close(fd)
                self._serve(task_read, result_write)
            os.close(task_read)
            os.close(result_write)
            _PARENT_FDS.update((task_write, result_read))
        child = _Child(pid, task_write, result_read)
        self.children[result_read] = child
        return child

    def _hand_next(self, child: _Child) -> None:
        if not self.queue:
            _close(child.tasks)  # end of input: the child exits when it reads it
            child.tasks = -1
            return
        index = self.queue.popleft()
        try:
            os.write(child.tasks, _TASK.pack(index))
        except BrokenPipeError:  # it died between two items: the item goes to the next child
            self.queue.appendleft(index)
            return
        child.current = index
        child.deadline = time.monotonic() + self.seconds

    def _wait(self) -> None:
        busy = [c.deadline for c in self.children.values() if c.current is not None]
        timeout = max(0.0, min(busy) - time.monotonic()) if busy else None
        ready, _, _ = select.select(list(self.children), [], [], timeout)
        for fd in ready:
            child = self.children.get(fd)
            if child is not None:
                self._read(child)
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.current is not None and now >= child.deadline:
                self._fail(child, "timeout", f"analysis took over {self.seconds:g} s; stopped")
                self._end(child, kill=True)

    def _read(self, child: _Child) -> None:
        chunk = os.read(child.results, 1 << 20)
        if not chunk:  # the child exited, or died
            status = self._end(child, kill=False)
            if child.current is not None:
                self._fail(child, "parser-crash", self._death(status))
            return
        child.buffer += chunk
        while len(child.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(child.buffer)
            if len(child.buffer) < _HEADER.size + size:
                return
            index, result = pickle.loads(bytes(child.buffer[_HEADER.size:_HEADER.size + size]))
            del child.buffer[:_HEADER.size + size]
            self.results[self.items[index][0]] = result
            child.current = None
            self._hand_next(child)

    def _fail(self, child: _Child, kind: str, message: str) -> None:
        key = self.items[child.current][0]
        self.results[key] = self.failed(key, kind, message)
        child.current = None

    def _end(self, child: _Child, kill: bool) -> int:
        if kill:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fd in (child.tasks, child.results):
            if fd >= 0:
                _close(fd)
        self.children.pop(child.results, None)
        _, status = os.waitpid(child.pid, 0)
        return status

    def _death(self, status: int) -> str:
        if os.WIFSIGNALED(status):
            return f"the analysis crashed ({signal.Signals(os.WTERMSIG(status)).name}); not analyzed"
        if os.WEXITSTATUS(status) == _OUT_OF_MEMORY:
            return f"the analysis needed over {(self.memory or 0) >> 20} MiB; not analyzed"
        return f"the analysis failed (exit status {os.WEXITSTATUS(status)}); not analyzed"

    # ---- the child ----------------------------------------------------------------------------------------
    def _serve(self, tasks: int, results: int) -> None:
        """Analyze the items the parent hands over until it closes the pipe; never return into its code."""
        status = 0
        try:
            import faulthandler

            faulthandler.disable()  # the parent reports a crash; no traceback dump into its output
            if self.memory:
                import resource

                limit = _data_bytes() + self.memory  # on top of what the fork already shares with the parent
                resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            while True:
                task = _read_exactly(tasks, _TASK.size)
                if task is None:
                    break
                (index,) = _TASK.unpack(task)
                key, item = self.items[index]
                data = pickle.dumps((index, self.analyze(key, item)), protocol=pickle.HIGHEST_PROTOCOL)
                _write_all(results, _HEADER.pack(len(data)) + data)
        except MemoryError:
            status = _OUT_OF_MEMORY
        except BaseException:  # noqa: BLE001 - the parent sees the item unfinished and reports it
            status = 1
        finally:
            os._exit(status)


def _close(fd: int) -> None:
    with _FORK_LOCK:  # a number closed here may be reused by another thread's pipe at once
        _PARENT_FDS.discard(fd)
        os.close(fd)


def _read_exactly(fd: int, size: int) -> Optional[bytes]:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


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
