"""Planning each stage just before it runs, and what of its plan this run really runs.

A stage is planned from the plans of the stages before it. A resume leaves
out what an interrupted run of its chain already finished; failures an
earlier run stored and this one does not retry become recorded failure lines.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from habitrun.engine.run_summary import FailureLine
from habitrun.planner.context import KeyContext
from habitrun.planner.plan import StagePlan, SubjectStatus, plan_stage
from habitrun.spec.recipe import Recipe, StageSpec
from habitrun.spec.subjects import SubjectRow
from habitrun.store.checkpoint import CheckpointStore

log = logging.getLogger(__name__)


class StagePlanner:
    """Keeps every stage's plan for the run; plans made ahead are reused when the stage runs."""

    def __init__(self, *, recipe: Recipe, subjects: Sequence[SubjectRow], store: CheckpointStore,
                 context: KeyContext, chain: set[str], rerun_ids: frozenset[str]) -> None:
        self.recipe = recipe
        self.subjects = subjects
        self.store = store
        self.context = context
        self.fingerprints = {name: info.fingerprint for name, info in context.stages.items()}
        self.chain = chain  # run ids of the resume chain
        self.rerun_ids = rerun_ids  # --rerun of this command: rerun even within a resume chain
        self.plans: dict[str, StagePlan] = {}

    def plan(self, stage: StageSpec) -> StagePlan:
        """Plan one stage (and keep the plan); results stored under the key an older habitrun
        gave the same inputs move to today's key here, so what runs after reads them."""
        plan = plan_stage(self.recipe, stage.name, self.subjects, self.plans, self.store,
                          self.fingerprints[stage.name], context=self.context)
        if plan.adopted:
            self.store.adopt([(old, plan.keys[sid], plan.components_json(sid)) for sid, old in plan.adopted.items()])
            plan.adopted.clear()
        self.plans[stage.name] = plan
        if log.isEnabledFor(logging.DEBUG):
            _log_plan(stage.name, plan)
        return plan

    def plan_for(self, stage: StageSpec) -> StagePlan:
        """The stage's plan: the one made ahead, else a new one."""
        plan = self.plans.get(stage.name)
        return plan if plan is not None else self.plan(stage)

    def plan_ahead(self, stages: Sequence[StageSpec]) -> bool:
        """Plan stages in order until one has work; False when none has (a no-op run).

        As long as the stages before have nothing to run their statuses cannot
        change, so the plans made here are the ones the run would make.
        """
        return any(self.to_run(self.plan(stage)) for stage in stages)

    def to_run(self, plan: StagePlan) -> list[str]:
        """The plan's work, minus what an interrupted run in this resume chain already finished.

        A success whose stored result is unreadable is not finished work, whichever run
        stored it: a resume recomputes it as `run` does."""
        to_run = plan.to_run()
        if not self.chain or not to_run:
            return to_run
        states = self.store.states(plan.keys[sid] for sid in to_run)
        unreadable = plan.unreadable()
        keep = []
        for sid in to_run:
            state = states.get(plan.keys[sid])
            if sid in unreadable:
                keep.append(sid)
                continue
            if state is not None and state.ok and state.run_id in self.chain and not (
                    sid in self.rerun_ids and plan.status[sid] is SubjectStatus.FORCED):  # --rerun asks again
                plan.status[sid] = SubjectStatus.DONE
                continue
            keep.append(sid)
        return keep

    def recorded_failures(self, stage: str, plan: StagePlan, to_run: set[str]) -> list[FailureLine]:
        """Failures an earlier run stored that this run does not retry."""
        old = [sid for sid, st in plan.status.items() if st == SubjectStatus.FAILED and sid not in to_run]
        if not old:
            return []
        states = self.store.states(plan.keys[sid] for sid in old)
        lines = []
        for sid in old:
            state = states.get(plan.keys[sid])
            lines.append(FailureLine(stage, sid, state.error or "failed" if state else "?",
                                     state.kind if state else None, state.log_path if state else None,
                                     recorded=True))
        return lines


def _log_plan(stage: str, plan: StagePlan) -> None:
    """What the planner decided for a stage: subjects per status, and the most common reasons."""
    statuses = Counter(status.value for status in plan.status.values())
    reasons = Counter(reasons[0] for reasons in plan.reasons.values() if reasons)
    log.debug("plan %s: %s; to run: %d", stage, ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())),
              len(plan.to_run()))
    for reason, n in reasons.most_common(5):
        log.debug("plan %s: %d subject(s): %s", stage, n, reason)
