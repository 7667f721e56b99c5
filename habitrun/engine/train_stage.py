"""A train stage in the run: its one task, the launcher run (engine/train.py), the outcome booked.

The launcher restarts ranks itself, so a train stage has no retry rounds:
its outcome is final, unless a stop ended it (then nothing is recorded and
a resume runs it again).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from habitrun.engine.contract import FailureKind, SubjectOutcome
from habitrun.engine.events import ConsoleLine, TrainStarted
from habitrun.engine.ledger import StageLedger
from habitrun.planner.plan import StagePlan
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec

if TYPE_CHECKING:
    from habitrun.engine.runner import StudyRunner


def run_train(runner: StudyRunner, stage: StageSpec, plan: StagePlan, policy: RunPolicy,
              ledger: StageLedger) -> None:
    """Launch the stage's rank group and book how it ended."""
    # The launcher is imported only by a run that trains.
    from habitrun.engine.train import run_train_stage

    task = runner.inputs.train_task(stage, plan)
    Path(task.workdir).mkdir(parents=True, exist_ok=True)
    runner.events.emit(TrainStarted(stage=stage.name,
                                    nproc_per_node=stage.launch.nproc_per_node if stage.launch else 1,
                                    nnodes=stage.launch.nnodes if stage.launch else 1))
    result = run_train_stage(
        stage, policy, stage_dir=runner.run.stage_dir(stage.name), workdir=Path(task.workdir),
        inputs=task.inputs, search_path=runner.loaded.search_path, run_id=runner.run.run_id,
        stop=runner.stop, console=lambda line: runner.events.show(ConsoleLine(line=line)),
    )
    kind = None if result.ok else (FailureKind.INTERRUPTED if runner.stop.is_set() else FailureKind.EXCEPTION)
    outcome = SubjectOutcome(task=task, ok=result.ok, result=result.result, error=result.error, kind=kind,
                             traceback=result.traceback, duration_sec=result.duration_sec)
    task.attempt = max(1, result.attempts)
    task.log_path = result.log_dir
    if result.ok:
        ledger.done(outcome, time.time(), count_retry=False)  # the launcher's restarts are no retry rounds
    elif not runner.stop.is_set():
        ledger.failed(outcome, time.time())
    else:
        return  # stopped: a resume runs it again
    ledger.submit()
    ledger.settle()
    if not result.ok and policy.on_subject_failure == "fail_fast":
        runner.stop.set(f"fail_fast: train stage {stage.name!r} failed: {result.error}")
