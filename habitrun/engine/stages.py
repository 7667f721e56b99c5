"""Running one stage of the run: its counts before and after, its subjects, its stored results read back.

A stage starts by counting what is cached, blocked (an upstream subject
failed) and recorded as failed by an earlier run; its subjects then run as
its kind runs them (engine/stage_kinds.py: on the backend for map and
collect, the launcher for train), each outcome booked by the stage's ledger.
A stored result that fails its check when a later stage reads it is
recomputed in its own stage first (once), then read again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from habitrun.engine.events import (
    RunWarning,
    StageFinished,
    StagePublished,
    StageStarted,
    SubjectSkipped,
)
from habitrun.engine.planning import StagePlanner
from habitrun.engine.publish import publish_stage
from habitrun.engine.run_context import RunContext
from habitrun.engine.run_summary import FailureLine, StageCounts
from habitrun.engine.stage_kind import CohortCheck
from habitrun.engine.stage_kinds import kind_of
from habitrun.errors import PublishError, StoreError
from habitrun.planner.decision import Reason
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan, SubjectStatus
from habitrun.spec.recipe import Recipe, StageSpec
from habitrun.spec.subjects import SubjectRow
from habitrun.store.checkpoint import UnreadableResults
from habitrun.store.cohort import PARTIAL_COHORT, Cohort
from habitrun.store.runs import WORK

UNREADABLE = Reason.RESULT_UNREADABLE.text(why="")


def _shown(folder: Path, root: Path) -> str:
    """The published folder as the user would name it: relative to the study when inside it."""
    try:
        return str(folder.relative_to(root)) + "/"
    except ValueError:
        return str(folder) + "/"


def refusal(recipe: Recipe, cohort: Cohort, subjects: Sequence[SubjectRow], stage: StageSpec,
            plan: StagePlan) -> str | None:
    """Why the stage's kind refuses to run on its plan (``require_complete_cohort``); None: it runs."""
    check = CohortCheck(required=recipe.stage_policy(stage.name).require_complete_cohort, cohort=cohort,
                        subjects=subjects,
                        takes_subjects=any(not kind_of(recipe.stage(need)).one_result for need in stage.needs))
    return kind_of(stage).validate(stage, plan, check)


class Stages:
    """The run's stages, one at a time: each planned, counted, run by its kind and reported."""

    def __init__(self, ctx: RunContext, planner: StagePlanner, cohort: Cohort,
                 subjects: Sequence[SubjectRow]) -> None:
        self.ctx = ctx
        self.planner = planner
        self.cohort = cohort
        self.subjects = subjects
        self.recomputing: set[str] = set()  # stages recomputing unreadable stored results

    def run(self, stage: StageSpec) -> None:
        """Plan (unless planned ahead), count, run and report one stage."""
        ctx = self.ctx
        ctx.now.stage, ctx.now.backend = stage, None
        plan = self.planner.plan_for(stage)
        if self._refused(stage, plan):
            return
        to_run = self.planner.to_run(plan)
        unreadable = plan.unreadable()
        if unreadable:  # found by planning: run (or resume) says so before recomputing them with the rest
            sids = [sid for sid in to_run if sid in unreadable]
            if sids:
                self._warn_recomputing(stage.name, sids, unreadable[sids[0]].removeprefix(UNREADABLE))
        tally = ctx.tally
        counts = tally.counts[stage.name] = StageCounts(total=len(plan.keys))
        old_failures = self._open(stage, plan, to_run, counts)
        if to_run and not ctx.stop.is_set():
            self._run_subjects(stage, plan, to_run, counts)
        counts.not_run = len(to_run) - len(tally.finished.get(stage.name, ()))
        if ctx.recorder.error is not None:
            # Recording stopped (a full disk): count what is stored, not what was handed to it.
            ok, bad = ctx.recorder.stored_by_stage.get(stage.name, (0, 0))
            counts.done, counts.failed, counts.not_run = ok, old_failures + bad, len(to_run) - ok - bad
        ctx.events.emit(StageFinished(stage=stage.name, **counts.as_dict()))
        if kind_of(stage).one_result and plan.status.get(GROUP_SUBJECT) == SubjectStatus.DONE:
            key = plan.keys[GROUP_SUBJECT]
            tally.group_results[stage.name] = self.read_results(stage.name, [key]).get(key)
        if stage.publish is not None and ctx.recorder.error is None:
            self._publish(stage, plan)

    def _publish(self, stage: StageSpec, plan: StagePlan) -> None:
        """The stage's current result files into the study (engine/publish.py); a failure is a warning.

        A stopped stage removes nothing: what it did not get to stays as published before."""
        assert stage.publish is not None
        ctx = self.ctx
        ctx.recorder.flush()  # the results just booked are read back from the store
        try:
            report = publish_stage(stage.publish, stage=stage.name, plan=plan,
                                   read=lambda keys: self.read_results(stage.name, keys),
                                   safe_names={row.id: row.safe for row in self.subjects},
                                   study_root=ctx.study_root, work_root=ctx.inputs.run_root / WORK,
                                   run_id=ctx.run.run_id, prune=not ctx.stop.is_set())
        except PublishError as exc:
            ctx.tally.warnings.append(exc.message)
            ctx.events.emit(RunWarning(message=exc.message))
            return
        ctx.events.emit(StagePublished(stage=stage.name, folder=_shown(report.folder, ctx.study_root),
                                       files=report.files, written=len(report.written),
                                       removed=len(report.removed)))

    def _refused(self, stage: StageSpec, plan: StagePlan) -> bool:
        """``require_complete_cohort``: a collect or train stage on a partial cohort fails without running.

        Its plan is marked blocked so the stages after it are skipped; nothing is stored,
        so a run on the complete cohort later runs it."""
        ctx = self.ctx
        message = refusal(ctx.recipe, self.cohort, self.subjects, stage, plan)
        if message is None:
            return False
        plan.status[GROUP_SUBJECT] = SubjectStatus.BLOCKED
        plan.reasons[GROUP_SUBJECT] = [message]
        counts = ctx.tally.counts[stage.name] = StageCounts(total=len(plan.keys), failed=1)
        ctx.tally.refused.append(message)
        ctx.tally.failures.append(FailureLine(stage=stage.name, subject_id=GROUP_SUBJECT, error=message,
                                              kind=PARTIAL_COHORT, log_path=None))
        ctx.events.emit(StageStarted(stage=stage.name, kind=stage.kind, total=counts.total, cached=0, to_run=0,
                                     blocked=0, recorded_failures=0))
        ctx.events.emit(RunWarning(message=message))
        ctx.events.emit(StageFinished(stage=stage.name, **counts.as_dict()))
        return True

    def _open(self, stage: StageSpec, plan: StagePlan, to_run: list[str], counts: StageCounts) -> int:
        """Count what will not run, say the stage started; the number of recorded failures not retried."""
        events = self.ctx.events
        to_run_set = set(to_run)
        blocked = [sid for sid, st in plan.status.items() if st == SubjectStatus.BLOCKED]
        counts.cached = sum(1 for sid, st in plan.status.items()
                            if st == SubjectStatus.DONE and sid not in to_run_set)
        # Failures recorded by an earlier run and not retried count as failed in this run too.
        old_failures = sum(1 for sid, st in plan.status.items()
                           if st == SubjectStatus.FAILED and sid not in to_run_set)
        events.emit(StageStarted(stage=stage.name, kind=stage.kind, total=counts.total, cached=counts.cached,
                                 to_run=len(to_run), blocked=len(blocked), recorded_failures=old_failures))
        recorded = self.planner.recorded_failures(stage.name, plan, to_run_set)
        self.ctx.tally.failures.extend(recorded)
        counts.failed += len(recorded)
        if blocked:
            counts.skipped = len(blocked)
            events.emit_many([SubjectSkipped(stage=stage.name, subject=sid, reason="skipped: upstream failed")
                              for sid in blocked])
        return old_failures

    def _run_subjects(self, stage: StageSpec, plan: StagePlan, to_run: list[str], counts: StageCounts) -> None:
        kind = kind_of(stage)
        kind.run(self.ctx, stage, plan, to_run, kind.book(self.ctx, stage, plan, counts))

    def read_results(self, need: str, keys: list[str]) -> dict[str, Any]:
        """Stored results of a stage that ran (or was cached) in this run, checksums verified.

        A result that fails its check is never passed on: its subjects are recomputed in
        their own stage first (once), then read again.
        """
        try:
            return self.ctx.store.results(keys)
        except UnreadableResults as exc:
            self._recompute(need, exc)
            return self.ctx.store.results(keys)

    def _warn_recomputing(self, name: str, sids: list[str], why: str) -> None:
        """The warning (in the summary and the events) that unreadable stored results are computed again."""
        message = (f"stage {name!r}: the stored result of {len(sids)} subject(s) is unreadable ({why}): "
                   f"{', '.join(sids[:5])}{' ...' if len(sids) > 5 else ''}; recomputing")
        self.ctx.tally.warnings.append(message)
        self.ctx.events.emit(RunWarning(message=message))

    def _recompute(self, name: str, exc: UnreadableResults) -> None:
        plan = self.planner.plans.get(name)
        sids = [sid for stage, sid, _key, _why in exc.bad
                if stage == name and plan is not None and sid in plan.status]
        if plan is None or not sids or name in self.recomputing:
            raise exc
        self.recomputing.add(name)
        try:
            why = exc.bad[0][3]
            self._warn_recomputing(name, sids, why)
            for sid in sids:
                plan.status[sid] = SubjectStatus.STALE
                plan.reasons[sid] = [Reason.RESULT_UNREADABLE.text(why=why)]
            counts = self.ctx.tally.counts.setdefault(name, StageCounts(total=len(plan.keys)))
            counts.cached = max(0, counts.cached - len(sids))
            self._run_subjects(self.ctx.recipe.stage(name), plan, sids, counts)
            still = [sid for sid in sids if plan.status.get(sid) is not SubjectStatus.DONE]
            if still:
                raise StoreError(f"stage {name!r}: the unreadable stored result of {', '.join(still[:5])} "
                                 "could not be recomputed (see the failures above); the run stops here")
        finally:
            self.recomputing.discard(name)
