"""Turning an outcome into its trace row and the matching fields of its event.

The usage comes from where the subject ran (engine/usage.py). A subject
whose worker died or was killed sent none: its row keeps what the runner
saw (when it ended, how long it ran) and leaves the rest NULL.
"""

from __future__ import annotations

import socket

from habitrun.engine.contract import SubjectOutcome
from habitrun.engine.events import SubjectDone, SubjectFailed, as_failed
from habitrun.positional import builder

_HOST = socket.gethostname()
# One per subject: positional, in the trace row's own order (see habitrun/positional.py).
_new_done = builder(SubjectDone, "stage", "subject", "attempt", "duration_sec", "pid", "queued_at", "started_at",
                    "ended_at", "cpu_sec", "peak_rss_mb", "read_bytes", "write_bytes", "host", "gpu")


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
    return _new_done(stage, row[2], row[3], row[10], row[16], row[7], row[8], row[9], row[11], row[12], row[14],
                     row[15], row[17], row[18])


def failed_event(stage: str, row: tuple, final: bool) -> SubjectFailed:
    """The ``subject_failed`` event of a traced attempt."""
    return as_failed(done_event(stage, row), kind=row[5], error=row[6], final=final, log=row[20])
