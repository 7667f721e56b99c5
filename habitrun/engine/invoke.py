"""Binding a stage's operator and calling it for one task, inside whichever process runs it.

Shared by every backend so that a subject behaves the same in-process, in a
worker process or on a Dask worker: same Subject object, same log file, same
classification of failures.

Output capture is cheap per subject: in a worker process, file descriptors 1
and 2 point for the worker's whole life at an unlinked scratch file; after
each subject the bytes it wrote (C libraries and child processes included)
are copied to its log file, which therefore exists when the subject printed
something or failed, and costs nothing when it did neither.
"""

from __future__ import annotations

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

from habitrun.engine.backend import FailureKind, OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.subject import Collection, Subject
from habitrun.engine.usage import meter
from habitrun.spec.operators import resolve_operator

BoundOperator = Callable[[SubjectTask], Any]
SCRATCH_RESET_BYTES = 4 << 20  # the scratch file is emptied once it grows past this


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
    """Fds 1 and 2 of this process redirected, for its life, to one unlinked append-only file."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.fd = self._open()
        _flush_std()
        os.dup2(self.fd, 1)
        os.dup2(self.fd, 2)
        self.read_to = 0  # where the last subject's output ended: the next one's starts there

    @staticmethod
    def _open() -> int:
        fd, name = tempfile.mkstemp(prefix="habitrun-out-")
        os.unlink(name)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        return fd

    def mark(self) -> int:
        """Where the next subject's output starts: where the last one's ended, so anything
        written between two subjects (an operator's own thread, say) goes to the next log."""
        return self.read_to

    def since(self, start: int) -> bytes:
        """What was written after ``start``; past SCRATCH_RESET_BYTES the file is emptied after reading."""
        _flush_std()
        end = os.lseek(self.fd, 0, os.SEEK_END)
        output = os.pread(self.fd, end - start, start) if end > start else b""
        if end > SCRATCH_RESET_BYTES:
            os.ftruncate(self.fd, 0)
            end = 0
        self.read_to = end
        return output


_scratch: _FdScratch | None = None


def _fd_scratch() -> _FdScratch:
    global _scratch
    if _scratch is None or _scratch.pid != os.getpid():
        _scratch = _FdScratch()
    return _scratch


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


def _write_log(task: SubjectTask, output: bytes, tb: str | None) -> None:
    path = task.log_path
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab") as log:
            log.write(f"--- habitrun: subject {task.subject_id} attempt {task.attempt} pid {os.getpid()} ---\n".encode())
            log.write(output)
            if tb:
                log.write(tb.encode("utf-8", "replace"))
    except OSError:
        pass  # a log that cannot be written must not turn a result into a failure


def execute(bound: BoundOperator, task: SubjectTask, *, capture: str = "fd") -> SubjectOutcome:
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
    except BaseException as exc:  # noqa: BLE001 - isolating the subject is the point
        tb, error, kind = traceback.format_exc(), one_line(exc), FailureKind.EXCEPTION
    finally:
        usage = gauge.end(mark) if mark is not None else None
        if buffer is None:
            output = scratch.since(out_mark)
        else:
            sys.stdout, sys.stderr = saved
            output = buffer.getvalue().encode("utf-8", "replace")
    if output or tb:
        _write_log(task, output, tb)
    duration = time.perf_counter() - start
    if kind is not None:
        return SubjectOutcome(task, False, None, error, kind, tb, duration, pid, usage)
    return SubjectOutcome(task, True, result, None, None, None, duration, pid, usage)
