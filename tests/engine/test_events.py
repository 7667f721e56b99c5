"""Typed events: each kind is written with the keys stored runs hold, and reads back as itself."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from habitrun.engine.contract import FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.events import (
    EVENT_TYPES,
    UNSET,
    CheckpointCleared,
    ConsoleLine,
    LargeResult,
    RetryRound,
    RunFinished,
    RunStarted,
    RunWarning,
    StageDetached,
    StageFinished,
    StagePublished,
    StageStarted,
    Stopping,
    SubjectDone,
    SubjectFailed,
    SubjectSkipped,
    TrainStarted,
    event_dict,
    fields_dict,
    parse_event,
    subject_done_dict,
)
from habitrun.engine.tracing import done_event, failed_event, trace_row
from habitrun.engine.usage import Usage

MEASURED = ["duration_sec", "pid", "queued_at", "started_at", "ended_at", "cpu_sec", "peak_rss_mb", "read_bytes",
            "write_bytes", "host", "gpu"]


def _row(ok: bool = True) -> tuple:
    task = SubjectTask(key="k1", subject_id="S1", fields={}, inputs={}, workdir="/w", log_path="/l/S1.log", attempt=2)
    usage = Usage(started_at=10.0, ended_at=11.5, cpu_sec=1.25, peak_rss_kb=2048, child_peak_rss_kb=None,
                  read_bytes=100, write_bytes=200, host="node1", gpu="0")
    outcome = SubjectOutcome(task=task, ok=ok, error=None if ok else "ValueError: x",
                             kind=None if ok else FailureKind.EXCEPTION, duration_sec=1.5, worker_pid=42, usage=usage)
    return trace_row("r1", "feat", outcome, "done" if ok else "failed", 9.0, 12.0)


EVERY_KIND = [
    RunWarning(message="m"),
    RunStarted(run_id="r1", recipe="/r.yaml", subjects=3, stages=["a", "b"], user="u", resumed_from=None),
    RunFinished(outcome="success", exit_code=0, stages={"a": {"total": 1}}, failed_subjects=0, stop_reason=None,
                duration_sec=1.0, backends=[{"backend": "process", "workers": 2}]),
    StageStarted(stage="a", kind="map", total=3, cached=1, to_run=2, blocked=0, recorded_failures=0),
    StageFinished(stage="a", total=3, done=1, cached=1, failed=1, skipped=0, not_run=0),
    done_event("a", _row()),
    failed_event("a", _row(ok=False), True),
    SubjectSkipped(stage="b", subject="S1", reason="skipped: upstream failed"),
    RetryRound(stage="a", subjects=7, attempt=2, subject_ids=["S1", "S2", "S3", "S4", "S5"],
               kinds={"exception": 6, "timeout": 1}),
    CheckpointCleared(stage="a", records=3, retried=1),
    TrainStarted(stage="t", nproc_per_node=2, nnodes=1),
    Stopping(signal="SIGINT", stage="a", kind="map", running=2, grace_sec=15.0, backend="process"),
    ConsoleLine(line="[t/0] hello\n"),
    LargeResult(stage="a", subject="S1", size_mb=20.0, limit_mb=10),
    StagePublished(stage="a", folder="results/a/", files=3, written=1, removed=0),
    StageDetached(stage="a", subjects=40, jobs=["761", "762"]),
    RetryRound(stage="a", subjects=2, attempt=2),  # as runs before issue 32 wrote it: no ids, no kinds
]


def test_every_kind_is_covered_and_reads_back_as_itself() -> None:
    assert {type(e) for e in EVERY_KIND} == set(EVENT_TYPES.values())
    for event in EVERY_KIND:
        written = event_dict(event)
        assert written["event"] == event.EVENT
        assert parse_event({**written, "ts": 1.0}) == event


@pytest.mark.parametrize(("event", "keys"), [
    (EVERY_KIND[1], ["event", "run_id", "recipe", "subjects", "stages", "user", "resumed_from"]),
    (EVERY_KIND[2], ["event", "outcome", "exit_code", "stages", "failed_subjects", "stop_reason", "duration_sec",
                     "backends"]),
    (EVERY_KIND[3], ["event", "stage", "kind", "total", "cached", "to_run", "blocked", "recorded_failures"]),
    (EVERY_KIND[4], ["event", "stage", "total", "done", "cached", "failed", "skipped", "not_run"]),
    (EVERY_KIND[5], ["event", "stage", "subject", "attempt", *MEASURED]),
    (EVERY_KIND[6], ["event", "stage", "subject", "attempt", *MEASURED, "kind", "error", "final", "log"]),
    (EVERY_KIND[11], ["event", "signal", "stage", "kind", "running", "grace_sec", "backend"]),
    (replace(EVERY_KIND[11], now=True), ["event", "now", "signal", "stage", "kind", "running", "grace_sec",
                                         "backend"]),
    (EVERY_KIND[13], ["event", "stage", "subject", "size_mb", "limit_mb"]),
    (SubjectFailed(stage="t", subject="__stage__", attempt=1, kind="exception", error="e", final=True, log="/l"),
     ["event", "stage", "subject", "attempt", "kind", "error", "final", "log"]),  # a train stage's
    (SubjectFailed(stage="a", subject="S1", attempt=1, kind="disk_full", error="e", final=False, log="/l", pid=7),
     ["event", "stage", "subject", "attempt", "pid", "kind", "error", "final", "log"]),  # a full disk's
])
def test_each_kind_is_written_with_the_keys_stored_runs_hold(event: object, keys: list[str]) -> None:
    assert list(event_dict(event)) == keys  # type: ignore[arg-type]


def test_a_traced_attempt_carries_its_trace_rows_measurements() -> None:
    written = event_dict(failed_event("feat", _row(ok=False), False))
    assert written == {"event": "subject_failed", "stage": "feat", "subject": "S1", "attempt": 2,
                       "duration_sec": 1.5, "pid": 42, "queued_at": 9.0, "started_at": 10.0, "ended_at": 11.5,
                       "cpu_sec": 1.25, "peak_rss_mb": 2.0, "read_bytes": 100, "write_bytes": 200,
                       "host": "node1", "gpu": "0", "kind": "exception", "error": "ValueError: x", "final": False,
                       "log": "/l/S1.log"}


def test_an_unknown_kind_reads_as_nothing() -> None:
    assert parse_event({"event": "from_the_future", "x": 1}) is None
    assert parse_event({"no": "event"}) is None


@pytest.mark.parametrize("unset", [(), ("pid", "host", "gpu"),
                                   ("duration_sec", "pid", "queued_at", "started_at", "ended_at", "cpu_sec",
                                    "peak_rss_mb", "read_bytes", "write_bytes", "host", "gpu")])
def test_the_written_out_subject_done_matches_its_fields(unset: tuple[str, ...]) -> None:
    values = {f.name: f"v{i}" for i, f in enumerate(fields(SubjectDone))}
    done = SubjectDone(**{**values, **dict.fromkeys(unset, UNSET)})
    written = subject_done_dict(done)
    assert list(written.items()) == list(fields_dict(done).items())  # same keys, same order, same values
    assert len(written) == 1 + len(values) - len(unset)
    assert event_dict(done) == written
