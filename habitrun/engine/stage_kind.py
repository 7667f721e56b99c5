"""The one shape every stage kind has: validate, plan shape, tasks, run, book.

A kind is a class (map and collect in map_stage.py, train in train_stage.py)
registered in stage_kinds.py, the one place a kind's name is looked up. The
run (stages.py) asks the stage's kind whether it may run on its plan
(``validate``), what its plan looks like (``one_result``), builds its tasks
(``tasks``), runs them (``run``) and books their outcomes through the ledger
``book`` gives; the runner asks it whether its tasks go to a backend
(``on_backend``) and how many subjects it is running (``running``).
Each gets a narrow RunContext (run_context.py), never the runner.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from habitrun.engine.contract import Backend, SubjectTask
from habitrun.engine.ledger import StageLedger
from habitrun.engine.run_context import RunContext
from habitrun.engine.run_summary import StageCounts
from habitrun.engine.stage_inputs import StageInputs
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan, SubjectStatus
from habitrun.spec.recipe import StageSpec
from habitrun.spec.subjects import SubjectRow, subject_ids
from habitrun.store.cohort import Cohort, missing_from, refusal_text


@dataclass(frozen=True)
class CohortCheck:
    """What ``require_complete_cohort`` looks at for one stage: the policy, the cohort, who is in the run."""

    required: bool  # the stage's policy asks for a complete cohort
    cohort: Cohort
    subjects: Sequence[SubjectRow]  # the run's
    takes_subjects: bool  # a stage it needs gives one result per subject

    def missing(self, members: Sequence[str]) -> list[tuple[str, str]]:
        """Who the stage would go without (see store/cohort.py ``missing_from``)."""
        return missing_from(self.cohort, subject_ids(self.subjects), members if self.takes_subjects else None)


class StageKind(ABC):
    """One kind of stage: its facts as class attributes, its behaviour as methods (see the module docstring)."""

    name: ClassVar[str]  # the recipe's ``kind:`` value
    one_result: ClassVar[bool]  # plan shape: one result for its members (GROUP_SUBJECT) rather than one per subject
    on_backend: ClassVar[bool]  # its tasks run on a Backend (whose workers can boot ahead)
    measured: ClassVar[bool] = True  # its outcomes carry the attempt's measurements (see StageLedger)
    debuggable: ClassVar[bool] = False  # `habitrun debug` can call its operator for one subject in-process

    def validate(self, stage: StageSpec, plan: StagePlan, cohort: CohortCheck) -> str | None:
        """Why the stage must not run on this plan (it fails without running); None: it runs."""
        return None

    @abstractmethod
    def tasks(self, inputs: StageInputs, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        """The tasks that run ``to_run`` (subject ids; GROUP_SUBJECT for a one-result kind)."""

    @abstractmethod
    def run(self, ctx: RunContext, stage: StageSpec, plan: StagePlan, to_run: list[str],
            ledger: StageLedger) -> None:
        """Run the stage's tasks to their end (or the stop), each outcome booked through ``ledger``."""

    def book(self, ctx: RunContext, stage: StageSpec, plan: StagePlan, counts: StageCounts) -> StageLedger:
        """The ledger this stage's outcomes are booked through (the same for every kind)."""
        tally = ctx.tally
        return StageLedger(stage=stage.name, plan=plan, counts=counts, run_id=ctx.run.run_id, recorder=ctx.recorder,
                           failures=tally.failures, finished=tally.finished.setdefault(stage.name, set()),
                           retried=tally.retried.setdefault(stage.name, set()), measured=self.measured)

    def running(self, stage: StageSpec, backend: Backend | None) -> int | None:
        """How many subjects it is running now (the stop notice); None: unknown."""
        return backend.running() if backend is not None else None


class OneResultKind(StageKind):
    """A kind whose members' results become one (collect, train): it may refuse a partial cohort."""

    one_result = True

    def validate(self, stage: StageSpec, plan: StagePlan, cohort: CohortCheck) -> str | None:
        """``require_complete_cohort``: the refusal when members are missing; None: it runs."""
        if not cohort.required or plan.status.get(GROUP_SUBJECT) == SubjectStatus.BLOCKED:
            return None  # blocked: already skipped, a group stage it needs is unavailable
        missing = cohort.missing(plan.members)
        return refusal_text(stage.name, missing) if missing else None
