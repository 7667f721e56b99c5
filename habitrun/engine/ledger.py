"""A stage's ledger: the one place where a subject's outcome is booked.

Map, collect and train stages all book an outcome the same way: its plan
status, its stage count, a failure line for the summary, its store record,
its trace row and its event. The records, rows and events of a batch go to
the recorder together (stored first, then reported), so a reported subject
is always a stored one.
"""

from __future__ import annotations

from habitrun.engine.contract import SubjectOutcome, SubjectTask
from habitrun.engine.events import Event, SubjectDone, SubjectFailed
from habitrun.engine.recorder import Recorder
from habitrun.engine.run_summary import FailureLine, StageCounts
from habitrun.engine.tracing import done_event, failed_event, trace_row
from habitrun.planner.plan import StagePlan, SubjectStatus
from habitrun.store.checkpoint import Record


class StageLedger:
    """Books one stage's outcomes in this run.

    ``measured``: events carry the attempt's measurements (its trace row); a
    train stage's ranks are measured by neither side, so its events carry its
    wall time only.
    """

    def __init__(self, *, stage: str, plan: StagePlan, counts: StageCounts, run_id: str, recorder: Recorder,
                 failures: list[FailureLine], finished: set[str], retried: set[str], measured: bool = True) -> None:
        self.stage = stage
        self.plan = plan
        self.counts = counts
        self.run_id = run_id
        self.recorder = recorder
        self.failures = failures  # the run's, in the order they happened
        self.finished = finished  # subjects with an outcome in this run
        self.retried = retried  # subjects that succeeded after a failed attempt
        self.measured = measured
        self.queued_at: float | None = None  # when the current round was handed to the backend
        self._records: list[Record] = []
        self._events: list[Event] = []
        self._trace: list[tuple] = []  # TraceRow's fields, as plain tuples (engine/tracing.py)

    def record(self, task: SubjectTask, outcome: SubjectOutcome) -> Record:
        """The store record of an outcome."""
        ok = outcome.ok
        return Record(
            stage=self.stage, key=task.key, subject_id=task.subject_id, ok=ok, result=outcome.result if ok else None,
            error=None if ok else outcome.error, kind=None if ok else outcome.kind, attempts=task.attempt,
            components=self.plan.components_json(task.subject_id), run_id=self.run_id, log_path=task.log_path,
            duration_sec=outcome.duration_sec)

    def done(self, outcome: SubjectOutcome, now: float, *, count_retry: bool = True) -> None:
        """A success: stored, counted, reported."""
        task = outcome.task
        sid = task.subject_id
        self.plan.status[sid] = SubjectStatus.DONE
        self.counts.done += 1
        self.finished.add(sid)
        if count_retry and task.attempt > 1:
            self.retried.add(sid)
        self._records.append(self.record(task, outcome))
        row = trace_row(self.run_id, self.stage, outcome, "done", self.queued_at, now)
        self._trace.append(row)
        self._events.append(done_event(self.stage, row) if self.measured else SubjectDone(
            stage=self.stage, subject=sid, attempt=task.attempt, duration_sec=round(outcome.duration_sec, 3)))

    def failed(self, outcome: SubjectOutcome, now: float) -> None:
        """A final failure: stored, counted, listed in the summary, reported."""
        task = outcome.task
        sid = task.subject_id
        self.plan.status[sid] = SubjectStatus.FAILED
        self.counts.failed += 1
        self.finished.add(sid)
        self._records.append(self.record(task, outcome))
        self.failures.append(FailureLine(self.stage, sid, outcome.error or "failed", outcome.kind, task.log_path))
        self._attempt_failed(outcome, now, final=True)

    def retrying(self, outcome: SubjectOutcome, now: float) -> None:
        """A failure with attempts left: traced and reported, never stored (a later round decides)."""
        self._attempt_failed(outcome, now, final=False)

    def _attempt_failed(self, outcome: SubjectOutcome, now: float, *, final: bool) -> None:
        task = outcome.task
        row = trace_row(self.run_id, self.stage, outcome, "failed" if final else "retried", self.queued_at, now)
        self._trace.append(row)
        self._events.append(failed_event(self.stage, row, final) if self.measured else SubjectFailed(
            stage=self.stage, subject=task.subject_id, attempt=task.attempt, kind=outcome.kind,
            error=outcome.error, final=final, log=task.log_path))

    def lost(self, outcome: SubjectOutcome) -> None:
        """An attempt the machine failed (a full disk): reported, never stored nor traced."""
        task = outcome.task
        self._events.append(SubjectFailed(
            stage=self.stage, subject=task.subject_id, attempt=task.attempt, kind=outcome.kind,
            error=outcome.error, final=False, log=task.log_path, pid=outcome.worker_pid))

    def submit(self) -> None:
        """Hand what was booked since the last submit to the recorder (stored, then reported)."""
        self.recorder.submit(self._records, self._events, self._trace)
        self._records, self._events, self._trace = [], [], []

    def settle(self) -> None:
        """Wait until everything submitted is stored; a success the store refused counts as a failure."""
        self.recorder.flush()
        converted = self.recorder.converted
        while converted:
            record = converted.pop()
            self.plan.status[record.subject_id] = SubjectStatus.FAILED
            self.counts.done -= 1
            self.counts.failed += 1
            self.failures.append(FailureLine(record.stage, record.subject_id, record.error or "", record.kind,
                                             record.log_path))
