"""The stage ledger: one outcome -> plan status, count, failure line, store record, trace row and event."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from habitrun.engine.contract import FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.events import SubjectDone, SubjectFailed, event_dict
from habitrun.engine.ledger import StageLedger
from habitrun.engine.recorder import Recorder
from habitrun.engine.run_summary import FailureLine, StageCounts
from habitrun.planner.plan import StagePlan, SubjectStatus
from habitrun.spec.policy import RunPolicy
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.trace import TRACE_COLUMNS

SUBJECTS = ["S1", "S2", "S3", "S4"]


def _plan() -> StagePlan:
    return StagePlan(name="feat", kind="map", policy=RunPolicy(), identity="i", fingerprint="f",
                     keys={sid: f"k{sid}" for sid in SUBJECTS}, status=dict.fromkeys(SUBJECTS, SubjectStatus.PENDING),
                     reasons={}, components={sid: {"subject": sid} for sid in SUBJECTS})


def _outcome(sid: str, *, ok: bool = True, attempt: int = 1, result: object = 1, kind: str | None = None) -> SubjectOutcome:
    task = SubjectTask(key=f"k{sid}", subject_id=sid, fields={}, inputs={}, workdir="/w", log_path=f"/l/{sid}.log",
                       attempt=attempt)
    return SubjectOutcome(task=task, ok=ok, result=result if ok else None, error=None if ok else "ValueError: x",
                          kind=None if ok else kind or FailureKind.EXCEPTION, duration_sec=0.5, worker_pid=7)


@pytest.fixture
def booked(tmp_path: Path):
    store = CheckpointStore.open(tmp_path / "store")
    emitted: list = []
    recorder = Recorder(store, emitted.extend)
    failures: list[FailureLine] = []
    ledger = StageLedger(stage="feat", plan=_plan(), counts=StageCounts(total=4), run_id="r1", recorder=recorder,
                         failures=failures, finished=set(), retried=set())
    try:
        yield ledger, store, emitted
    finally:
        recorder.close()
        store.close()


@pytest.mark.timeout(60)
def test_each_outcome_is_booked_everywhere_at_once(booked) -> None:
    ledger, store, emitted = booked
    ledger.queued_at = 100.0
    ledger.done(_outcome("S1", attempt=2), 101.0)
    ledger.failed(_outcome("S2", ok=False, attempt=3), 101.0)
    ledger.retrying(_outcome("S3", ok=False), 101.0)
    ledger.lost(_outcome("S4", ok=False, kind=FailureKind.DISK_FULL))
    ledger.submit()
    ledger.settle()

    plan, counts = ledger.plan, ledger.counts
    assert [plan.status[s] for s in SUBJECTS] == [SubjectStatus.DONE, SubjectStatus.FAILED, SubjectStatus.PENDING,
                                                   SubjectStatus.PENDING]
    assert (counts.done, counts.failed) == (1, 1)
    assert ledger.finished == {"S1", "S2"} and ledger.retried == {"S1"}
    assert ledger.failures == [FailureLine("feat", "S2", "ValueError: x", FailureKind.EXCEPTION, "/l/S2.log")]
    states = store.states(["kS1", "kS2", "kS3", "kS4"])
    assert set(states) == {"kS1", "kS2"}  # a retried or lost attempt is never stored
    assert states["kS1"].ok and states["kS1"].attempts == 2 and states["kS1"].run_id == "r1"
    assert not states["kS2"].ok and states["kS2"].kind == FailureKind.EXCEPTION
    assert store.results(["kS1"]) == {"kS1": 1}
    outcomes = {row[TRACE_COLUMNS.index("subject")]: row[TRACE_COLUMNS.index("outcome")] for row in store.trace()}
    assert outcomes == {"S1": "done", "S2": "failed", "S3": "retried"}
    assert [(type(e), e.subject) for e in emitted] == [(SubjectDone, "S1"), (SubjectFailed, "S2"),
                                                      (SubjectFailed, "S3"), (SubjectFailed, "S4")]
    assert [e.final for e in emitted[1:]] == [True, False, False]
    assert emitted[0].queued_at == 100.0 and emitted[3].pid == 7


@pytest.mark.timeout(60)
def test_a_success_the_store_refuses_is_counted_as_a_failure(booked) -> None:
    ledger, store, emitted = booked
    ledger.done(_outcome("S1", result=threading.Lock()), 1.0)
    ledger.done(_outcome("S2"), 1.0)
    ledger.submit()
    ledger.settle()
    assert (ledger.counts.done, ledger.counts.failed) == (1, 1)
    assert ledger.plan.status["S1"] is SubjectStatus.FAILED
    assert [f.subject_id for f in ledger.failures] == ["S1"] and "cannot be stored" in ledger.failures[0].error
    assert [event_dict(e)["event"] for e in emitted] == ["subject_failed", "subject_done"]
    assert emitted[0].kind == FailureKind.UNPICKLABLE and emitted[0].pid == 7  # the attempt's measurements kept


@pytest.mark.timeout(60)
def test_an_unmeasured_stage_reports_its_wall_time_only(booked) -> None:
    ledger, _store, emitted = booked
    ledger.measured = False  # a train stage: the launcher's ranks are measured by neither side
    ledger.done(_outcome("S1"), 1.0)
    ledger.failed(_outcome("S2", ok=False), 1.0)
    ledger.submit()
    ledger.settle()
    assert [list(event_dict(e)) for e in emitted] == [
        ["event", "stage", "subject", "attempt", "duration_sec"],
        ["event", "stage", "subject", "attempt", "kind", "error", "final", "log"],
    ]
