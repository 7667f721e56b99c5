"""Turning an outcome into its trace row and the matching fields of its event.

The usage comes from where the subject ran (engine/usage.py). A subject
whose worker died or was killed sent none: its row keeps what the runner
saw (when it ended, how long it ran) and leaves the rest NULL.
"""

from __future__ import annotations

import socket

from habitrun.engine.contract import SubjectOutcome
from habitrun.engine.events import SubjectDone, SubjectFailed, as_failed

_HOST = socket.gethostname()


def trace_row(run_id: str, stage: str, outcome: SubjectOutcome, word: str, queued_at: float | None,
              now: float) -> tuple:
    """One row in store.trace.TRACE_COLUMNS order."""
    task = outcome.task
    usage = outcome.usage
    wall = round(outcome.duration_sec, 6)
    if usage is None:
        started, ended, cpu, peak, child, read, write, host, gpu = now - wall, now, None, None, None, None, None, \
            _HOST, None
    else:
        started, ended, cpu, peak_kb, child_kb, read, write, host, gpu = usage
        peak = None if peak_kb is None else round(peak_kb / 1024, 3)
        child = None if child_kb is None else round(child_kb / 1024, 3)
    ok = outcome.ok
    return (run_id, stage, task.subject_id, task.attempt, word, None if ok else outcome.kind,
            None if ok else outcome.error, queued_at, started, ended, wall, cpu, peak, child, read, write,
            outcome.worker_pid, host, gpu, task.key, None if ok else task.log_path)


def done_event(stage: str, row: tuple) -> SubjectDone:
    """The ``subject_done`` event of a traced attempt (built straight from the row: this runs per subject)."""
    return SubjectDone(stage=stage, subject=row[2], attempt=row[3], duration_sec=row[10], pid=row[16],
                       queued_at=row[7], started_at=row[8], ended_at=row[9], cpu_sec=row[11], peak_rss_mb=row[12],
                       read_bytes=row[14], write_bytes=row[15], host=row[17], gpu=row[18])


def failed_event(stage: str, row: tuple, final: bool) -> SubjectFailed:
    """The ``subject_failed`` event of a traced attempt."""
    return as_failed(done_event(stage, row), kind=row[5], error=row[6], final=final, log=row[20])
