"""Map and collect stages (kinds): tasks through the backend in retry rounds, each outcome booked as it arrives.

The backend only turns tasks into outcomes. Here each batch of outcomes is
decided: a success or a final failure goes to the stage's ledger; a failure
with attempts left runs again in the next round; a subject that met a full
disk stops the run without a record; fail-fast stops it at the first final
failure.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import replace
from typing import ClassVar

from habitrun.engine.command.params import operator_params
from habitrun.engine.contract import FailureKind, OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.control import DETACHED, StopFlag
from habitrun.engine.events import RETRY_NAMED, RetryRound, RunWarning, StageDetached
from habitrun.engine.ledger import StageLedger
from habitrun.engine.run_context import RunContext
from habitrun.engine.stage_inputs import StageInputs
from habitrun.engine.stage_kind import OneResultKind, StageKind
from habitrun.engine.write_failure import WriteFailure
from habitrun.planner.duration_history import typical_duration
from habitrun.planner.plan import StagePlan
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec

log = logging.getLogger(__name__)


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
                log.debug("stage %s: %s#%d failed (%s), final: retry rounds %d, fail_fast %s, auto_retry_on %s",
                          ledger.stage, outcome.task.subject_id, outcome.task.attempt, outcome.kind, self.rounds,
                          self.fail_fast, ",".join(self.policy.auto_retry_on))
                ledger.failed(outcome, now)
                if self.fail_fast and not self.stop.is_set():
                    self.stop.set(f"fail_fast: subject {outcome.task.subject_id} failed in stage "
                                  f"{ledger.stage!r}: {outcome.error}")
            else:
                log.debug("stage %s: %s#%d failed (%s), retried as attempt %d", ledger.stage,
                          outcome.task.subject_id, outcome.task.attempt, outcome.kind, outcome.task.attempt + 1)
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


class MapStage(StageKind):
    """Per subject: one task per subject to run, on the stage's backend, in retry rounds."""

    name = "map"
    one_result = False
    on_backend = True
    debuggable = True
    operator_call: ClassVar[str] = "map"  # how invoke.py calls the operator (OperatorRef.kind)

    def tasks(self, inputs: StageInputs, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        return inputs.map_tasks(stage, plan, to_run)

    def run(self, ctx: RunContext, stage: StageSpec, plan: StagePlan, to_run: list[str],
            ledger: StageLedger) -> None:
        run_on_backend(ctx, self, self.operator_call, stage, plan, to_run, ledger)


class CollectStage(OneResultKind):
    """All members' results into one: one task, on the stage's backend, in retry rounds."""

    name = "collect"
    on_backend = True
    operator_call: ClassVar[str] = "collect"

    def tasks(self, inputs: StageInputs, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        return [inputs.group_task(stage, plan)]

    def run(self, ctx: RunContext, stage: StageSpec, plan: StagePlan, to_run: list[str],
            ledger: StageLedger) -> None:
        run_on_backend(ctx, self, self.operator_call, stage, plan, to_run, ledger)


def run_on_backend(ctx: RunContext, kind: StageKind, call: str, stage: StageSpec, plan: StagePlan,
                   to_run: list[str], ledger: StageLedger) -> None:
    """Run a stage's tasks (``kind.tasks``) to their end (or the stop), round after round, on its backend."""
    policy = ctx.recipe.stage_policy(stage.name)
    op = OperatorRef(stage=stage.name, path=stage.operator or "",
                     params=operator_params(stage, ctx.recipe, ctx.study_root, ctx.inputs.run_root),
                     kind=call, search_path=ctx.search_path)
    backend = ctx.now.backend = ctx.backends.for_policy(policy)
    ctx.events.emit_many([RunWarning(message=note) for note in ctx.backends.take_notes()])
    backend.scratch_dir = str(ctx.run.path / "scratch")  # subject output never leaves the run folder
    pending = kind.tasks(ctx.inputs, stage, plan, to_run)
    forecast, warning = ctx.forecast(stage, plan, policy, pending, backend)  # a memory budget's predictions
    if warning:
        ctx.tally.warnings.append(warning)
        ctx.events.emit(RunWarning(message=warning))
    backend.forecast = forecast
    if backend.wants_durations:  # the learned duration per subject (the slurm backend's chunk size)
        backend.typical_sec = typical_duration(ctx.store, stage.name, plan.key_prefix)
    stop = ctx.stop
    rounds = RetryRounds(policy=policy, ledger=ledger, stop=stop, write_failure=ctx.write_failure,
                         run_path=str(ctx.run.path))
    while pending and not stop.is_set():
        rounds.retry, rounds.kinds = [], {}
        ledger.queued_at = time.time()  # when this round's tasks were handed to the backend
        log.debug("stage %s: %d task(s) to the %s backend (attempt %d)", stage.name, len(pending), backend.name,
                  pending[0].attempt)
        backend.run_tasks(op, pending, rounds.report, stop)
        ledger.settle()
        if stop.reason == DETACHED and backend.left_running:
            ctx.events.emit(StageDetached(stage=stage.name, subjects=backend.left_subjects,
                                          jobs=list(backend.left_running)))
        if rounds.retry and not stop.is_set():
            ctx.events.emit(RetryRound(stage=stage.name, subjects=len(rounds.retry),
                                       attempt=rounds.retry[0].attempt,
                                       subject_ids=[t.subject_id for t in rounds.retry[:RETRY_NAMED]],
                                       kinds=dict(rounds.kinds)))
        pending = rounds.retry
