"""Binding a stage's operator and calling it for one task, inside whichever process runs it.

Shared by every backend so that a subject behaves the same in-process, in a
worker process or on a Dask worker: same Subject object, same log file, same
classification of failures.

Output capture is cheap per subject: in a worker process, file descriptors 1
and 2 point for the worker's whole life at a scratch file (in the run folder
when the backend names one, so the runner can still read what a subject
printed when its worker dies or times out); after each subject the bytes it
wrote (C libraries and child processes included) are copied to its log file,
which therefore exists when the subject printed something or failed, and
costs nothing when it did neither. A subject that closed fds 1 and 2 (or
``sys.stdout``) does not take the next subject's output with it: both are
pointed back at the scratch file before every subject. Past ``log_max_bytes``
a log keeps the head and the tail of what was printed, with a line saying how
much was cut. Subject ids in log headers have control characters escaped.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import io
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from habitrun.engine.contract import (
    FailureKind,
    OperatorRef,
    SubjectOutcome,
    SubjectTask,
)
from habitrun.engine.subject import Collection, Subject
from habitrun.engine.usage import meter
from habitrun.spec.operators import resolve_operator

BoundOperator = Callable[[SubjectTask], Any]
SCRATCH_RESET_BYTES = 4 << 20  # the scratch file is emptied once it grows past this
DEFAULT_LOG_MAX_BYTES = 10 << 20  # a subject's output past this keeps only its head and tail


def bind_operator(op: OperatorRef) -> BoundOperator:
    """Import the operator once; a class is instantiated with the params here (once per worker)."""
    obj = resolve_operator(op.path, op.search_path, stage=op.stage)
    params = dict(op.params)
    if isinstance(obj, type):
        instance = obj(**params)
        call: Callable[[Any], Any] = instance
    else:
        call = functools.partial(obj, **params) if params else obj
    if op.kind == "collect":

        def run_collect(task: SubjectTask) -> Any:
            return call(Collection(task.inputs, Path(task.workdir), task.fields.get("subjects")))

        return run_collect

    def run_map(task: SubjectTask) -> Any:
        return call(Subject(task.subject_id, task.fields, task.inputs, task.workdir))

    return run_map


class _FdScratch:
    """Fds 1 and 2 of this process redirected, for its life, to one append-only file.

    At ``path`` when given (the runner reads it after a death and removes it),
    else an unlinked temporary file.
    """

    def __init__(self, path: str | None) -> None:
        self.pid = os.getpid()
        self.path = path
        self.fd = self._open()
        self.read_to = 0  # where the last subject's output ended: the next one's starts there
        self.checked: dict[str, Any] = {}  # sys.stdout/stderr as last found writing to fd 1/2
        self.restore()

    def _open(self) -> int:
        if self.path:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        else:
            fd, name = tempfile.mkstemp(prefix="habitrun-out-")
            os.unlink(name)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        return fd

    def restore(self) -> None:
        """Point fds 1 and 2 (and sys.stdout/stderr) at the scratch file, whatever the last subject did."""
        _flush_std()
        try:
            os.fstat(self.fd)
        except OSError:  # the subject closed it too: open it again (by path), or a fresh one
            self.fd = self._open()
            self.read_to = os.lseek(self.fd, 0, os.SEEK_END)
        os.dup2(self.fd, 1)
        os.dup2(self.fd, 2)
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = getattr(sys, name)
            if stream is not None and stream is self.checked.get(name) and not getattr(stream, "closed", True):
                continue  # as checked before the last subject (this runs once per subject)
            if not _writes_to(stream, fd):
                stream = open(fd, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115
                setattr(sys, name, stream)
            self.checked[name] = stream

    def mark(self) -> int:
        """Where the next subject's output starts: where the last one's ended, so anything
        written between two subjects (an operator's own thread, say) goes to the next log."""
        self.restore()
        return self.read_to

    def since(self, start: int, limit: int) -> bytes:
        """What was written after ``start`` (head and tail past ``limit``); past
        SCRATCH_RESET_BYTES the file is emptied after reading."""
        _flush_std()
        try:
            end = os.lseek(self.fd, 0, os.SEEK_END)
            output = read_capped(self.fd, start, end, limit)
            if end > SCRATCH_RESET_BYTES:
                os.ftruncate(self.fd, 0)
                end = 0
        except OSError:  # the subject closed our file: its output is lost, the next one's is not
            self.fd = self._open()
            end = os.lseek(self.fd, 0, os.SEEK_END)
            output = b""
        self.read_to = end
        return output


def _writes_to(stream: Any, fd: int) -> bool:
    """Whether ``stream`` is open and writes to ``fd``. A fork worker inherits the runner's
    Python-level stream, which in a notebook, an embedding program or under a redirect is not
    fd 1: print() would then bypass the fds a subject's log is read from."""
    if stream is None or getattr(stream, "closed", False):
        return False
    try:
        return stream.fileno() == fd
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return False


def read_capped(fd: int, start: int, end: int, limit: int) -> bytes:
    """Bytes ``start:end`` of ``fd``; past ``limit`` its head and tail with a line saying what was cut."""
    size = end - start
    if size <= 0:
        return b""
    if limit <= 0 or size <= limit:
        return os.pread(fd, size, start)
    half = limit // 2
    cut = size - 2 * half
    note = f"\n--- habitrun: {cut} bytes cut here (log_max_mb keeps the first and last {half} bytes) ---\n"
    return os.pread(fd, half, start) + note.encode() + os.pread(fd, half, end - half)


_scratch: _FdScratch | None = None


def _fd_scratch(path: str | None = None) -> _FdScratch:
    global _scratch
    if _scratch is None or _scratch.pid != os.getpid():
        _scratch = _FdScratch(path)
    return _scratch


def capture_output_in(path: str | None) -> None:
    """In a worker process: send fds 1 and 2 to the scratch file at ``path`` from now on."""
    _fd_scratch(path)


def output_mark() -> int:
    """Where the next subject's output will start in this process's scratch file."""
    return _fd_scratch().read_to


def printable(text: str) -> str:
    """``text`` with control characters (ESC, CR, NUL...) written as escapes: safe in a terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def log_header(task: SubjectTask, pid: int) -> bytes:
    return f"--- habitrun: subject {printable(task.subject_id)} attempt {task.attempt} pid {pid} ---\n".encode()


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def one_line(exc: BaseException) -> str:
    """``"ValueError: bad spacing"``: the first line of the exception, for records and `status`."""
    text = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return text.splitlines()[0] if text else type(exc).__name__


_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_log(task: SubjectTask, output: bytes, tb: str | None, pid: int | None = None) -> None:
    """Append to the subject's log: a header naming the process that ran it (``pid``, else this one),
    what it wrote, and the traceback."""
    path = task.log_path
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab") as log:
            log.write(log_header(task, os.getpid() if pid is None else pid))
            log.write(output)
            if tb:
                log.write(tb.encode("utf-8", "replace"))
    except OSError:
        pass  # a log that cannot be written must not turn a result into a failure


def execute(bound: BoundOperator, task: SubjectTask, *, capture: str = "fd",
            log_max_bytes: int = DEFAULT_LOG_MAX_BYTES) -> SubjectOutcome:
    """Run one task; every exception becomes a failed outcome (MemoryError as out-of-memory).

    ``capture="fd"`` (worker processes) catches everything written to fds 1
    and 2; ``"python"`` (the in-process backend, whose console must keep
    working) swaps ``sys.stdout``/``sys.stderr`` for the call.
    """
    gauge = meter()
    mark = None
    start = time.perf_counter()
    pid = os.getpid()
    result: Any = None
    error: str | None = None
    kind: str | None = None
    tb: str | None = None
    if capture == "fd":
        scratch = _fd_scratch()
        out_mark = scratch.mark()
        buffer = None
    else:
        buffer = io.StringIO()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = buffer
    try:
        mark = gauge.begin()
        result = bound(task)
    except MemoryError as exc:
        tb, error, kind = traceback.format_exc(), f"out of memory: {one_line(exc)}", FailureKind.OOM
    except SystemExit as exc:
        tb, kind = traceback.format_exc(), FailureKind.NO_REPORT
        error = f"operator called sys.exit({exc.code!r}) without returning a result"
    except KeyboardInterrupt:
        raise
    except OSError as exc:  # a full disk (its output, its work folder) is not the subject's fault
        tb, error = traceback.format_exc(), one_line(exc)
        kind = FailureKind.DISK_FULL if exc.errno in _DISK_FULL else FailureKind.EXCEPTION
    except BaseException as exc:  # noqa: BLE001 - isolating the subject is the point
        tb, error, kind = traceback.format_exc(), one_line(exc), FailureKind.EXCEPTION
    finally:
        usage = gauge.end(mark) if mark is not None else None
        if buffer is None:
            output = scratch.since(out_mark, log_max_bytes)
        else:
            sys.stdout, sys.stderr = saved
            output = buffer.getvalue().encode("utf-8", "replace")
            if log_max_bytes > 0 and len(output) > log_max_bytes:
                half = log_max_bytes // 2
                note = f"\n--- habitrun: {len(output) - 2 * half} bytes cut here ---\n".encode()
                output = output[:half] + note + output[-half:]
    if output or tb:
        write_log(task, output, tb)
    duration = time.perf_counter() - start
    if kind is not None:
        return SubjectOutcome(task=task, ok=False, error=error, kind=kind, traceback=tb, duration_sec=duration,
                              worker_pid=pid, usage=usage)
    return SubjectOutcome(task=task, ok=True, result=result, duration_sec=duration, worker_pid=pid, usage=usage)
