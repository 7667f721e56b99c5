"""The train stage kind: its one task, the launcher run (engine/train.py), the outcome booked.

The launcher restarts ranks itself, so a train stage has no retry rounds:
its outcome is final, unless a stop ended it (then nothing is recorded and
a resume runs it again).
"""

from __future__ import annotations

import time
from pathlib import Path

from habitrun.engine.contract import Backend, FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.events import ConsoleLine, TrainStarted
from habitrun.engine.ledger import StageLedger
from habitrun.engine.run_context import RunContext
from habitrun.engine.stage_inputs import StageInputs
from habitrun.engine.stage_kind import OneResultKind
from habitrun.planner.plan import StagePlan
from habitrun.spec.recipe import StageSpec


class TrainStage(OneResultKind):
    """A rank group (torchrun-style) started by the launcher, its one outcome booked; no backend, no rounds."""

    name = "train"
    on_backend = False
    measured = False  # its ranks are measured by neither side: its events carry its wall time only

    def tasks(self, inputs: StageInputs, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        return [inputs.train_task(stage, plan)]

    def run(self, ctx: RunContext, stage: StageSpec, plan: StagePlan, to_run: list[str],
            ledger: StageLedger) -> None:
        run_train(ctx, self.tasks(ctx.inputs, stage, plan, to_run)[0], stage, ledger)

    def running(self, stage: StageSpec, backend: Backend | None) -> int | None:
        return stage.launch.nproc_per_node if stage.launch else 1


def run_train(ctx: RunContext, task: SubjectTask, stage: StageSpec, ledger: StageLedger) -> None:
    """Launch the stage's rank group and book how it ended."""
    # The launcher is imported only by a run that trains.
    from habitrun.engine.train import run_train_stage

    policy = ctx.recipe.stage_policy(stage.name)
    Path(task.workdir).mkdir(parents=True, exist_ok=True)
    ctx.events.emit(TrainStarted(stage=stage.name,
                                 nproc_per_node=stage.launch.nproc_per_node if stage.launch else 1,
                                 nnodes=stage.launch.nnodes if stage.launch else 1))
    result = run_train_stage(
        stage, policy, stage_dir=ctx.run.stage_dir(stage.name), workdir=Path(task.workdir),
        inputs=task.inputs, search_path=ctx.search_path, run_id=ctx.run.run_id,
        stop=ctx.stop, console=lambda line: ctx.events.show(ConsoleLine(line=line)),
    )
    kind = None if result.ok else (FailureKind.INTERRUPTED if ctx.stop.is_set() else FailureKind.EXCEPTION)
    outcome = SubjectOutcome(task=task, ok=result.ok, result=result.result, error=result.error, kind=kind,
                             traceback=result.traceback, duration_sec=result.duration_sec)
    task.attempt = max(1, result.attempts)
    task.log_path = result.log_dir
    if result.ok:
        ledger.done(outcome, time.time(), count_retry=False)  # the launcher's restarts are no retry rounds
    elif not ctx.stop.is_set():
        ledger.failed(outcome, time.time())
    else:
        return  # stopped: a resume runs it again
    ledger.submit()
    ledger.settle()
    if not result.ok and policy.on_subject_failure == "fail_fast":
        ctx.stop.set(f"fail_fast: train stage {stage.name!r} failed: {result.error}")
