"""Turning an outcome into its trace row and the matching fields of its event.

The usage comes from where the subject ran (engine/usage.py). A subject
whose worker died or was killed sent none: its row keeps what the runner
saw (when it ended, how long it ran) and leaves the rest NULL.
"""

from __future__ import annotations

import socket

from habitrun.engine.contract import SubjectOutcome
from habitrun.engine.events import SubjectDone, SubjectFailed, as_failed
from habitrun.store.trace import TraceRow

_HOST = socket.gethostname()


def trace_row(run_id: str, stage: str, outcome: SubjectOutcome, word: str, queued_at: float | None,
              now: float) -> TraceRow:
    """The trace row of one attempt (``word``: done, failed or retried)."""
    task = outcome.task
    usage = outcome.usage
    wall = round(outcome.duration_sec, 6)
    ok = outcome.ok
    if usage is None:
        return TraceRow(run_id, stage, task.subject_id, task.attempt, word, None if ok else outcome.kind,
                        None if ok else outcome.error, queued_at, now - wall, now, wall, None, None, None, None,
                        None, outcome.worker_pid, _HOST, None, task.key, None if ok else task.log_path)
    peak, child = usage.peak_rss_kb, usage.child_peak_rss_kb
    # positional: this runs per subject, and a keyword call of a 21-field named tuple costs about
    # 2 µs more (benchmarks/engine_cpu.py); the fields are TraceRow's, in its order
    return TraceRow(run_id, stage, task.subject_id, task.attempt, word, None if ok else outcome.kind,
                    None if ok else outcome.error, queued_at, usage.started_at, usage.ended_at, wall, usage.cpu_sec,
                    None if peak is None else round(peak / 1024, 3), None if child is None else round(child / 1024, 3),
                    usage.read_bytes, usage.write_bytes, outcome.worker_pid, usage.host, usage.gpu, task.key,
                    None if ok else task.log_path)


def done_event(stage: str, row: TraceRow) -> SubjectDone:
    """The ``subject_done`` event of a traced attempt (built straight from the row: this runs per subject)."""
    return SubjectDone(stage=stage, subject=row.subject, attempt=row.attempt, duration_sec=row.wall_sec,
                       pid=row.pid, queued_at=row.queued_at, started_at=row.started_at, ended_at=row.ended_at,
                       cpu_sec=row.cpu_sec, peak_rss_mb=row.peak_rss_mb, read_bytes=row.read_bytes,
                       write_bytes=row.write_bytes, host=row.host, gpu=row.gpu)


def failed_event(stage: str, row: TraceRow, final: bool) -> SubjectFailed:
    """The ``subject_failed`` event of a traced attempt."""
    return as_failed(done_event(stage, row), kind=row.kind, error=row.error, final=final, log=row.log)
