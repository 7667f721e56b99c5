"""What a run reports back: per stage counts, failure lines and the run's outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from habitrun.store.cohort import Cohort
from habitrun.store.runs import RunFolder


@dataclass
class FailureLine:
    """One failed subject, as `run` and `status` print it."""

    stage: str
    subject_id: str
    error: str
    kind: str | None
    log_path: str | None
    recorded: bool = False  # stored by an earlier run and not retried in this one


@dataclass
class StageCounts:
    """What happened to a stage's subjects in this run."""

    total: int = 0
    done: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class RunSummary:
    """The result of `run`/`resume`: outcome, exit code, counts and failures."""

    run: RunFolder | None  # None: nothing to run, and no run folder was asked for
    outcome: str  # success | failed | interrupted
    exit_code: int
    stages: dict[str, StageCounts] = field(default_factory=dict)
    failures: list[FailureLine] = field(default_factory=list)
    stop_reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)  # group stages' results (e.g. train metrics)
    outputs: dict[str, str] = field(default_factory=dict)  # group stage -> its work folder
    noop: bool = False  # every selected stage was already stored: nothing ran
    cohort: Cohort | None = None  # subjects found, left out before the run and why
    members: dict[str, int] = field(default_factory=dict)  # collect/train stage -> subjects it took

    @property
    def recorded_failures(self) -> list[FailureLine]:
        """Failures stored by an earlier run that this run did not retry."""
        return [f for f in self.failures if f.recorded]
