"""Map and collect stages: tasks through the backend in retry rounds, each outcome booked as it arrives.

The backend only turns tasks into outcomes. Here each batch of outcomes is
decided: a success or a final failure goes to the stage's ledger; a failure
with attempts left runs again in the next round; a subject that met a full
disk stops the run without a record; fail-fast stops it at the first final
failure.
"""

from __future__ import annotations

import errno
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from habitrun.engine.contract import FailureKind, OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.events import RETRY_NAMED, RetryRound, RunWarning
from habitrun.engine.ledger import StageLedger
from habitrun.engine.memory_forecast import forecast_for
from habitrun.engine.write_failure import WriteFailure
from habitrun.planner.plan import StagePlan
from habitrun.spec.gcpause import gc_paused
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec

if TYPE_CHECKING:
    from habitrun.engine.runner import StudyRunner


class RetryRounds:
    """Decides each reported outcome of a stage; collects the tasks the next round runs."""

    def __init__(self, *, policy: RunPolicy, ledger: StageLedger, stop: StopFlag, write_failure: WriteFailure,
                 run_path: str) -> None:
        self.policy = policy
        self.rounds = policy.auto_retry_rounds
        self.fail_fast = policy.on_subject_failure == "fail_fast"
        self.ledger = ledger
        self.stop = stop
        self.write_failure = write_failure
        self.run_path = run_path
        self.retry: list[SubjectTask] = []
        self.kinds: dict[str, int] = {}  # failure kind -> subjects of this round retried for it

    def report(self, outcomes: list[SubjectOutcome]) -> None:
        """The backend's report callback: book each outcome, then hand the batch to the recorder."""
        ledger = self.ledger
        now = time.time()
        for outcome in outcomes:
            if outcome.ok:
                ledger.done(outcome, now)
            elif outcome.kind == FailureKind.DISK_FULL:  # the machine's fault: stop, record nothing
                self.disk_full(outcome)
            # Once a stop is asked for, a failure with attempts left is not run (a resume
            # runs it), never a recorded failure: its last chance was taken by the stop.
            elif outcome.task.attempt > self.rounds or self.fail_fast or not self.policy.retries(outcome.kind):
                ledger.failed(outcome, now)
                if self.fail_fast and not self.stop.is_set():
                    self.stop.set(f"fail_fast: subject {outcome.task.subject_id} failed in stage "
                                  f"{ledger.stage!r}: {outcome.error}")
            else:
                ledger.retrying(outcome, now)
                self.retry.append(replace(outcome.task, attempt=outcome.task.attempt + 1))
                kind = str(outcome.kind)
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
        ledger.submit()  # stored first, then reported

    def disk_full(self, outcome: SubjectOutcome) -> None:
        self.ledger.lost(outcome)
        sid, stage = outcome.task.subject_id, self.ledger.stage
        self.write_failure.note(self.run_path, OSError(errno.ENOSPC, (
            f"No space left on device (subject {sid} of stage {stage}: {outcome.error})")))


def run_on_backend(runner: StudyRunner, stage: StageSpec, plan: StagePlan, policy: RunPolicy,
                   to_run: list[str], ledger: StageLedger) -> None:
    """Run a map or collect stage's subjects to their end (or the stop), round after round."""
    op = OperatorRef(stage=stage.name, path=stage.operator or "", params=dict(stage.params),
                     kind="collect" if stage.kind == "collect" else "map", search_path=runner.loaded.search_path)
    backend = runner.current_backend = runner.backends.for_policy(policy)
    runner.events.emit_many([RunWarning(message=note) for note in runner.backends.take_notes()])
    backend.scratch_dir = str(runner.run.path / "scratch")  # subject output never leaves the run folder
    with gc_paused():  # tens of thousands of tasks, no cycles: the collector would only walk them
        pending = runner.inputs.tasks(stage, plan, to_run)
    backend.forecast = forecast_for(runner, stage, plan, policy, pending)  # a memory budget's predictions
    rounds = RetryRounds(policy=policy, ledger=ledger, stop=runner.stop, write_failure=runner.write_failure,
                         run_path=str(runner.run.path))
    while pending and not runner.stop.is_set():
        rounds.retry, rounds.kinds = [], {}
        ledger.queued_at = time.time()  # when this round's tasks were handed to the backend
        backend.run_tasks(op, pending, rounds.report, runner.stop)
        ledger.settle()
        if rounds.retry and not runner.stop.is_set():
            runner.events.emit(RetryRound(stage=stage.name, subjects=len(rounds.retry),
                                          attempt=rounds.retry[0].attempt,
                                          subject_ids=[t.subject_id for t in rounds.retry[:RETRY_NAMED]],
                                          kinds=dict(rounds.kinds)))
        pending = rounds.retry
