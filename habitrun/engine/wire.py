"""A task and an outcome as they cross a process boundary: plain tuples, each field order written once here.

The process backend's pipes (:mod:`habitrun.engine.process.protocol`) and the
Dask backend's markers (:mod:`habitrun.engine.dask_backend.worker`) carry
these; nothing else builds or reads them by position. A plain tuple pickles
in a fraction of the time a dataclass or a named tuple does (a named tuple
writes its class path into every message: about 2 µs more a subject on each
side), so the wire stays positional and each side turns it into the named
object at once. ``tests/engine/test_wire.py`` round-trips every field, so a
field added to :class:`SubjectTask` or :class:`SubjectOutcome` and not here
fails there.
"""

from __future__ import annotations

from typing import Any

from habitrun.engine.contract import SubjectOutcome, SubjectTask
from habitrun.engine.usage import Usage

# (key, subject_id, fields, inputs, workdir, log_path, attempt): every SubjectTask field.
TaskWire = tuple[str, str, dict[str, Any], dict[str, Any], str, str, int]
# (ok, result, error, kind, traceback, duration_sec, worker_pid, usage): every SubjectOutcome field but
# its task (the receiver knows which task a reply answers); usage as the plain tuple of Usage's fields.
OutcomeWire = tuple[bool, Any, "str | None", "str | None", "str | None", float, "int | None", "tuple | None"]
_tuple_as = tuple.__new__  # a plain tuple of Usage's fields as a Usage: a third of Usage._make's cost


def task_wire(task: SubjectTask) -> TaskWire:
    """The task as it travels."""
    return (task.key, task.subject_id, task.fields, task.inputs, task.workdir, task.log_path, task.attempt)


def task_from_wire(wire: TaskWire) -> SubjectTask:
    """The task a :func:`task_wire` tuple carries."""
    key, subject_id, fields, inputs, workdir, log_path, attempt = wire
    return SubjectTask(key=key, subject_id=subject_id, fields=fields, inputs=inputs, workdir=workdir,
                       log_path=log_path, attempt=attempt)


def outcome_wire(outcome: SubjectOutcome) -> OutcomeWire:
    """The outcome as it travels (its usage as a plain tuple: see the module's docstring)."""
    usage = outcome.usage
    return (outcome.ok, outcome.result, outcome.error, outcome.kind, outcome.traceback, outcome.duration_sec,
            outcome.worker_pid, None if usage is None else tuple(usage))


def failure_wire(error: str, kind: str, traceback: str | None = None, duration_sec: float = 0.0,
                 worker_pid: int | None = None, usage: tuple | None = None) -> OutcomeWire:
    """A failure that no operator's outcome carries (the worker's own: a task it could not read...)."""
    return (False, None, error, kind, traceback, duration_sec, worker_pid,
            None if usage is None else tuple(usage))


def outcome_from_wire(wire: OutcomeWire, task: SubjectTask) -> SubjectOutcome:
    """The outcome of ``task`` an :func:`outcome_wire` tuple carries."""
    ok, result, error, kind, traceback, duration, pid, usage = wire
    return SubjectOutcome(task=task, ok=ok, result=result, error=error, kind=None if ok else kind,
                          traceback=traceback, duration_sec=duration, worker_pid=pid,
                          usage=None if usage is None else _tuple_as(Usage, usage))


def wire_duration(wire: OutcomeWire) -> float:
    """How long the subject of an :func:`outcome_wire` tuple ran."""
    return wire[5]
