"""Binding a stage's operator and calling it for one task, inside whichever process runs it.

Shared by every backend so that a subject behaves the same in-process, in a
worker process or on a Dask worker: same Subject object, same log file, same
classification of failures.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from habitrun.engine.backend import FailureKind, OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.subject import Collection, Subject
from habitrun.spec.operators import resolve_operator

BoundOperator = Callable[[SubjectTask], Any]


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
        return call(Subject(task.subject_id, task.fields, task.inputs, Path(task.workdir)))

    return run_map


@contextlib.contextmanager
def captured_output(log_path: str, mode: str) -> Iterator[Any]:
    """Send what the operator prints to its log file.

    ``mode="fd"`` redirects file descriptors 1 and 2 (catches C libraries and
    child processes too) and is used in worker processes; ``"python"`` swaps
    ``sys.stdout``/``sys.stderr`` only, for the in-process backend whose own
    console must keep working.
    """
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    try:
        if mode == "fd":
            sys.stdout.flush()
            sys.stderr.flush()
            saved = (os.dup(1), os.dup(2))
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield log
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        else:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield log
    finally:
        log.close()


def one_line(exc: BaseException) -> str:
    """``"ValueError: bad spacing"``: the first line of the exception, for records and `status`."""
    text = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return text.splitlines()[0] if text else type(exc).__name__


def execute(bound: BoundOperator, task: SubjectTask, *, capture: str = "fd") -> SubjectOutcome:
    """Run one task; every exception becomes a failed outcome (MemoryError as out-of-memory)."""
    start = time.perf_counter()
    pid = os.getpid()
    os.makedirs(task.workdir, exist_ok=True)
    try:
        with captured_output(task.log_path, capture) as log:
            log.write(f"--- habitrun: subject {task.subject_id} attempt {task.attempt} pid {pid} ---\n")
            try:
                result = bound(task)
            except MemoryError as exc:
                tb = traceback.format_exc()
                log.write(tb)
                return SubjectOutcome(task, False, error=f"out of memory: {one_line(exc)}", kind=FailureKind.OOM,
                                      traceback=tb, duration_sec=time.perf_counter() - start, worker_pid=pid)
            except BaseException as exc:  # noqa: BLE001 - isolating the subject is the point
                if isinstance(exc, KeyboardInterrupt):
                    raise
                tb = traceback.format_exc()
                log.write(tb)
                kind = FailureKind.NO_REPORT if isinstance(exc, SystemExit) else FailureKind.EXCEPTION
                message = (f"operator called sys.exit({exc.code!r}) without returning a result"
                           if isinstance(exc, SystemExit) else one_line(exc))
                return SubjectOutcome(task, False, error=message, kind=kind, traceback=tb,
                                      duration_sec=time.perf_counter() - start, worker_pid=pid)
    except OSError as exc:
        return SubjectOutcome(task, False, error=f"cannot write log {task.log_path}: {exc}",
                              kind=FailureKind.EXCEPTION, duration_sec=time.perf_counter() - start, worker_pid=pid)
    return SubjectOutcome(task, True, result=result, duration_sec=time.perf_counter() - start, worker_pid=pid)


