"""Turning an outcome into its trace row and the matching fields of its event.

The usage comes from where the subject ran (engine/usage.py). A subject
whose worker died or was killed sent none: its row keeps what the runner
saw (when it ended, how long it ran) and leaves the rest NULL.
"""

from __future__ import annotations

import socket

from habitrun.engine.contract import SubjectOutcome
from habitrun.engine.events import SubjectDone, SubjectFailed, as_failed
from habitrun.store.trace import COL

_HOST = socket.gethostname()


def trace_row(run_id: str, stage: str, outcome: SubjectOutcome, word: str, queued_at: float | None,
              now: float) -> tuple:
    """The trace row of one attempt (``word``: done, failed or retried): ``store.trace.TraceRow``'s fields in its
    order, as a plain tuple. It is journaled and inserted per subject, where a named tuple costs several
    µs more (pickled by its class, bound by SQLite item by item); read it by name through ``COL``."""
    task = outcome.task
    usage = outcome.usage
    wall = round(outcome.duration_sec, 6)
    ok = outcome.ok
    if usage is None:
        return (run_id, stage, task.subject_id, task.attempt, word, None if ok else outcome.kind,
                None if ok else outcome.error, queued_at, now - wall, now, wall, None, None, None, None, None,
                outcome.worker_pid, _HOST, None, task.key, None if ok else task.log_path)
    peak, child = usage.peak_rss_kb, usage.child_peak_rss_kb
    return (run_id, stage, task.subject_id, task.attempt, word, None if ok else outcome.kind,
            None if ok else outcome.error, queued_at, usage.started_at, usage.ended_at, wall, usage.cpu_sec,
            None if peak is None else round(peak / 1024, 3), None if child is None else round(child / 1024, 3),
            usage.read_bytes, usage.write_bytes, outcome.worker_pid, usage.host, usage.gpu, task.key,
            None if ok else task.log_path)


_SUBJECT, _ATTEMPT, _WALL, _PID, _QUEUED, _STARTED, _ENDED, _CPU, _PEAK, _READ, _WRITE, _HOST_AT, _GPU = (
    COL[name] for name in ("subject", "attempt", "wall_sec", "pid", "queued_at", "started_at", "ended_at", "cpu_sec",
                           "peak_rss_mb", "read_bytes", "write_bytes", "host", "gpu"))
_KIND, _ERROR, _LOG = COL["kind"], COL["error"], COL["log"]


def done_event(stage: str, row: tuple) -> SubjectDone:
    """The ``subject_done`` event of a traced attempt (built straight from the row: this runs per subject)."""
    return SubjectDone(stage=stage, subject=row[_SUBJECT], attempt=row[_ATTEMPT], duration_sec=row[_WALL],
                       pid=row[_PID], queued_at=row[_QUEUED], started_at=row[_STARTED], ended_at=row[_ENDED],
                       cpu_sec=row[_CPU], peak_rss_mb=row[_PEAK], read_bytes=row[_READ], write_bytes=row[_WRITE],
                       host=row[_HOST_AT], gpu=row[_GPU])


def failed_event(stage: str, row: tuple, final: bool) -> SubjectFailed:
    """The ``subject_failed`` event of a traced attempt."""
    return as_failed(done_event(stage, row), kind=row[_KIND], error=row[_ERROR], final=final, log=row[_LOG])
