"""A task and an outcome cross a process boundary with every field, and as plain tuples (engine/wire.py)."""

from __future__ import annotations

import dataclasses
import pickle

from habitrun.engine.contract import FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.process import protocol as P
from habitrun.engine.usage import Usage, meter
from habitrun.engine.wire import (
    failure_wire,
    outcome_from_wire,
    outcome_wire,
    task_from_wire,
    task_wire,
)
from habitrun.store.trace import TRACE_COLUMNS, TraceRow

TASK = SubjectTask(key="k", subject_id="S1", fields={"a": 1}, inputs={"up": [2]}, workdir="/w", log_path="/l",
                   attempt=3)
USAGE = Usage(started_at=1.0, ended_at=2.0, cpu_sec=0.5, peak_rss_kb=300, child_peak_rss_kb=4, read_bytes=5,
              write_bytes=6, host="h", gpu="0")


def _every_field_set(cls: type, **values: object) -> object:
    missing = {f.name for f in dataclasses.fields(cls)} - set(values)
    assert not missing, f"give the test a distinct value for {sorted(missing)}"
    return cls(**values)


def test_a_task_round_trips_every_field() -> None:
    task = _every_field_set(SubjectTask, **dataclasses.asdict(TASK))
    wire = task_wire(task)
    assert type(wire) is tuple and len(wire) == len(dataclasses.fields(SubjectTask))
    assert task_from_wire(pickle.loads(pickle.dumps(wire))) == task


def test_an_outcome_round_trips_every_field_but_its_task() -> None:
    outcome = _every_field_set(SubjectOutcome, task=TASK, ok=False, result={"r": 1}, error="E: x",
                               kind=FailureKind.OOM, traceback="tb", duration_sec=1.25, worker_pid=77, usage=USAGE)
    wire = outcome_wire(outcome)
    assert len(wire) == len(dataclasses.fields(SubjectOutcome)) - 1
    back = outcome_from_wire(pickle.loads(pickle.dumps(wire)), TASK)
    assert back == outcome and type(back.usage) is Usage


def test_the_wire_carries_no_class_path() -> None:
    """Plain tuples and strings pickle small and fast; a named tuple or an enum would name its class."""
    failed = SubjectOutcome(task=TASK, ok=False, error="E", kind=FailureKind.TIMEOUT, usage=USAGE, worker_pid=1)
    for message in (P.run_message(TASK), P.done_message(failed), (P.DONE, failure_wire("E", FailureKind.OOM))):
        data = P.dumps(message)
        assert b"habitrun" not in data, message
    back = P.read_done(P.loads(P.dumps(P.done_message(failed))), TASK)
    assert back.kind == "timeout" and back.usage == USAGE


def test_a_success_reads_no_kind() -> None:
    wire = outcome_wire(SubjectOutcome(task=TASK, ok=True, result=1, kind=FailureKind.EXCEPTION))
    assert outcome_from_wire(wire, TASK).kind is None


def test_the_meter_measures_a_usage() -> None:
    gauge = meter()
    usage = gauge.end(gauge.begin())
    assert type(usage) is Usage and usage.ended_at >= usage.started_at and usage.host


def test_a_trace_row_is_the_tables_columns() -> None:
    assert TraceRow._fields == TRACE_COLUMNS


def test_trace_rows_put_each_value_in_its_column() -> None:
    """trace_row builds a plain tuple in TraceRow's order: each value lands in its named column."""
    from habitrun.engine.tracing import trace_row

    failed = SubjectOutcome(task=TASK, ok=False, error="E: x", kind=FailureKind.OOM, duration_sec=1.5,
                            worker_pid=77, usage=USAGE)
    row = trace_row("r1", "st", failed, "failed", 0.5, 9.0)
    assert type(row) is tuple  # journaled and inserted as it is: see trace_row
    assert TraceRow._make(row)._asdict() == {
        "run_id": "r1", "stage": "st", "subject": "S1", "attempt": 3, "outcome": "failed", "kind": "oom",
        "error": "E: x", "queued_at": 0.5, "started_at": 1.0, "ended_at": 2.0, "wall_sec": 1.5, "cpu_sec": 0.5,
        "peak_rss_mb": round(300 / 1024, 3), "child_peak_rss_mb": round(4 / 1024, 3), "read_bytes": 5,
        "write_bytes": 6, "pid": 77, "host": "h", "gpu": "0", "key": "k", "log": "/l"}
    died = TraceRow._make(trace_row("r1", "st", SubjectOutcome(task=TASK, ok=True, result=1, duration_sec=2.0),
                                    "done", None, 9.0))
    assert (died.started_at, died.ended_at, died.wall_sec, died.cpu_sec, died.kind, died.log, died.key) == \
        (7.0, 9.0, 2.0, None, None, None, "k")
