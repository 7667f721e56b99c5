"""What a stage kind may use of the run it is part of: a narrow context, not the runner.

A stage kind (engine/stage_kind.py) runs its tasks with the run's store,
recorder, events, stop flag, run folder, backends and task builder, and books
its outcomes into the run's tallies. It never sees the runner itself, so the
runner can change without the kinds, and a new kind needs nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from habitrun.engine.backend_choice import BackendPool
from habitrun.engine.contract import Backend
from habitrun.engine.control import StopFlag
from habitrun.engine.event_stream import EventStream
from habitrun.engine.memory_forecast import Forecaster
from habitrun.engine.recorder import Recorder
from habitrun.engine.run_summary import FailureLine, StageCounts
from habitrun.engine.stage_inputs import StageInputs
from habitrun.engine.write_failure import WriteFailure
from habitrun.spec.recipe import Recipe, StageSpec
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.runs import RunFolder


@dataclass
class NowRunning:
    """The stage running now and its backend: set by the stage, read by the running file and the stop notice."""

    stage: StageSpec | None = None
    backend: Backend | None = None


@dataclass
class RunTally:
    """The run's books, filled stage by stage: counts, failure lines, who finished, who was retried."""

    counts: dict[str, StageCounts] = field(default_factory=dict)
    failures: list[FailureLine] = field(default_factory=list)
    finished: dict[str, set[str]] = field(default_factory=dict)  # stage -> subjects with an outcome in this run
    retried: dict[str, set[str]] = field(default_factory=dict)  # stage -> subjects that succeeded after a failure
    warnings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # group stages refused on a partial cohort
    group_results: dict[str, Any] = field(default_factory=dict)  # collect/train stage -> its one result


@dataclass
class RunContext:
    """The parts of a run a stage kind runs with (see the module docstring)."""

    recipe: Recipe
    search_path: tuple[str, ...]
    store: CheckpointStore
    recorder: Recorder
    events: EventStream
    stop: StopFlag
    run: RunFolder
    backends: BackendPool
    inputs: StageInputs
    write_failure: WriteFailure
    tally: RunTally
    now: NowRunning
    study_root: Path  # the recipe's folder: where a stage publishes (engine/publish.py)
    forecast: Forecaster  # a memory budget's predictions for a stage (engine/memory_forecast.py)
