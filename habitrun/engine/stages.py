"""Running one stage of the run: its counts before and after, its subjects, its stored results read back.

A stage starts by counting what is cached, blocked (an upstream subject
failed) and recorded as failed by an earlier run; its subjects then run on
the backend (map, collect) or the launcher (train), each outcome booked by
the stage's ledger. A stored result that fails its check when a later stage
reads it is recomputed in its own stage first (once), then read again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from habitrun.engine.events import (
    RunWarning,
    StageFinished,
    StagePublished,
    StageStarted,
    SubjectSkipped,
)
from habitrun.engine.ledger import StageLedger
from habitrun.engine.map_stage import run_on_backend
from habitrun.engine.publish import publish_stage
from habitrun.engine.run_summary import FailureLine, StageCounts
from habitrun.engine.train_stage import run_train
from habitrun.errors import PublishError, StoreError
from habitrun.planner.decision import Reason
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan, SubjectStatus
from habitrun.spec.recipe import StageSpec
from habitrun.spec.subjects import subject_ids
from habitrun.store.checkpoint import UnreadableResults
from habitrun.store.cohort import PARTIAL_COHORT, missing_from, refusal_text
from habitrun.store.runs import WORK

if TYPE_CHECKING:
    from habitrun.engine.runner import StudyRunner


def run_stage(runner: StudyRunner, stage: StageSpec) -> None:
    """Plan (unless planned ahead), count, run and report one stage."""
    runner.current_stage, runner.current_backend = stage, None
    plan = runner.planner.plan_for(stage)
    if _refused(runner, stage, plan):
        return
    to_run = runner.planner.to_run(plan)
    unreadable = plan.unreadable()
    if unreadable:  # found by planning: run (or resume) says so before recomputing them with the rest
        sids = [sid for sid in to_run if sid in unreadable]
        if sids:
            _warn_recomputing(runner, stage.name, sids, unreadable[sids[0]].removeprefix(UNREADABLE))
    counts = runner.counts[stage.name] = StageCounts(total=len(plan.keys))
    old_failures = _open(runner, stage, plan, to_run, counts)
    if to_run and not runner.stop.is_set():
        _run_subjects(runner, stage, plan, to_run, counts)
    counts.not_run = len(to_run) - len(runner.finished.get(stage.name, ()))
    if runner.recorder.error is not None:
        # Recording stopped (a full disk): count what is stored, not what was handed to it.
        ok, bad = runner.recorder.stored_by_stage.get(stage.name, (0, 0))
        counts.done, counts.failed, counts.not_run = ok, old_failures + bad, len(to_run) - ok - bad
    runner.events.emit(StageFinished(stage=stage.name, **counts.as_dict()))
    if stage.kind != "map" and plan.status.get(GROUP_SUBJECT) == SubjectStatus.DONE:
        key = plan.keys[GROUP_SUBJECT]
        runner.group_results[stage.name] = read_results(runner, stage.name, [key]).get(key)
    if stage.publish is not None and runner.recorder.error is None:
        _publish(runner, stage, plan)


def _publish(runner: StudyRunner, stage: StageSpec, plan: StagePlan) -> None:
    """The stage's current result files into the study (engine/publish.py); a failure is a warning.

    A stopped stage removes nothing: what it did not get to stays as published before."""
    assert stage.publish is not None
    runner.recorder.flush()  # the results just booked are read back from the store
    try:
        report = publish_stage(stage.publish, stage=stage.name, plan=plan,
                               read=lambda keys: read_results(runner, stage.name, keys),
                               safe_names=dict(zip(runner.subjects.ids, runner.subjects.safe_names, strict=True)),
                               study_root=runner.loaded.root, work_root=runner.run_root / WORK,
                               run_id=runner.run.run_id,
                               prune=not runner.stop.is_set())
    except PublishError as exc:
        runner.warnings.append(exc.message)
        runner.events.emit(RunWarning(message=exc.message))
        return
    runner.events.emit(StagePublished(stage=stage.name, folder=_shown(report.folder, runner.loaded.root),
                                      files=report.files, written=len(report.written),
                                      removed=len(report.removed)))


def _shown(folder: Path, root: Path) -> str:
    """The published folder as the user would name it: relative to the study when inside it."""
    try:
        return str(folder.relative_to(root)) + "/"
    except ValueError:
        return str(folder) + "/"


def refusal(runner: StudyRunner, stage: StageSpec, plan: StagePlan) -> str | None:
    """Why ``require_complete_cohort`` refuses this collect or train stage (cached or not); None: it runs."""
    if stage.kind == "map" or not runner.recipe.stage_policy(stage.name).require_complete_cohort:
        return None
    if plan.status.get(GROUP_SUBJECT) == SubjectStatus.BLOCKED:
        return None  # already skipped: a group stage it needs is unavailable
    takes_subjects = any(runner.recipe.stage(need).kind == "map" for need in stage.needs)
    missing = missing_from(runner.cohort, subject_ids(runner.subjects), plan.members if takes_subjects else None)
    return refusal_text(stage.name, missing) if missing else None


def _refused(runner: StudyRunner, stage: StageSpec, plan: StagePlan) -> bool:
    """``require_complete_cohort``: a collect or train stage on a partial cohort fails without running.

    Its plan is marked blocked so the stages after it are skipped; nothing is stored,
    so a run on the complete cohort later runs it."""
    message = refusal(runner, stage, plan)
    if message is None:
        return False
    plan.status[GROUP_SUBJECT] = SubjectStatus.BLOCKED
    plan.reasons[GROUP_SUBJECT] = [message]
    counts = runner.counts[stage.name] = StageCounts(total=len(plan.keys), failed=1)
    runner.refused.append(message)
    runner.failures.append(FailureLine(stage=stage.name, subject_id=GROUP_SUBJECT, error=message,
                                       kind=PARTIAL_COHORT, log_path=None))
    runner.events.emit(StageStarted(stage=stage.name, kind=stage.kind, total=counts.total, cached=0, to_run=0,
                                    blocked=0, recorded_failures=0))
    runner.events.emit(RunWarning(message=message))
    runner.events.emit(StageFinished(stage=stage.name, **counts.as_dict()))
    return True


def _open(runner: StudyRunner, stage: StageSpec, plan: StagePlan, to_run: list[str], counts: StageCounts) -> int:
    """Count what will not run, say the stage started; the number of recorded failures not retried."""
    to_run_set = set(to_run)
    blocked = [sid for sid, st in plan.status.items() if st == SubjectStatus.BLOCKED]
    counts.cached = sum(1 for sid, st in plan.status.items() if st == SubjectStatus.DONE and sid not in to_run_set)
    # Failures recorded by an earlier run and not retried count as failed in this run too.
    old_failures = sum(1 for sid, st in plan.status.items() if st == SubjectStatus.FAILED and sid not in to_run_set)
    runner.events.emit(StageStarted(stage=stage.name, kind=stage.kind, total=counts.total, cached=counts.cached,
                                    to_run=len(to_run), blocked=len(blocked), recorded_failures=old_failures))
    recorded = runner.planner.recorded_failures(stage.name, plan, to_run_set)
    runner.failures.extend(recorded)
    counts.failed += len(recorded)
    if blocked:
        counts.skipped = len(blocked)
        runner.events.emit_many([SubjectSkipped(stage=stage.name, subject=sid, reason="skipped: upstream failed")
                                 for sid in blocked])
    return old_failures


def _run_subjects(runner: StudyRunner, stage: StageSpec, plan: StagePlan, to_run: list[str],
                  counts: StageCounts) -> None:
    policy = runner.recipe.stage_policy(stage.name)
    ledger = StageLedger(stage=stage.name, plan=plan, counts=counts, run_id=runner.run.run_id,
                         recorder=runner.recorder, failures=runner.failures,
                         finished=runner.finished.setdefault(stage.name, set()),
                         retried=runner.retried.setdefault(stage.name, set()), measured=stage.kind != "train")
    if stage.kind == "train":
        run_train(runner, stage, plan, policy, ledger)
    else:
        run_on_backend(runner, stage, plan, policy, to_run, ledger)


def read_results(runner: StudyRunner, need: str, keys: list[str]) -> dict[str, Any]:
    """Stored results of a stage that ran (or was cached) in this run, checksums verified.

    A result that fails its check is never passed on: its subjects are recomputed in
    their own stage first (once), then read again.
    """
    try:
        return runner.store.results(keys)
    except UnreadableResults as exc:
        _recompute(runner, need, exc)
        return runner.store.results(keys)


UNREADABLE = Reason.RESULT_UNREADABLE.text(why="")


def _warn_recomputing(runner: StudyRunner, name: str, sids: list[str], why: str) -> None:
    """The warning (in the summary and the events) that unreadable stored results are computed again."""
    message = (f"stage {name!r}: the stored result of {len(sids)} subject(s) is unreadable ({why}): "
               f"{', '.join(sids[:5])}{' ...' if len(sids) > 5 else ''}; recomputing")
    runner.warnings.append(message)
    runner.events.emit(RunWarning(message=message))


def _recompute(runner: StudyRunner, name: str, exc: UnreadableResults) -> None:
    plan = runner.planner.plans.get(name)
    sids = [sid for stage, sid, _key, _why in exc.bad if stage == name and plan is not None and sid in plan.status]
    if plan is None or not sids or name in runner.recomputing:
        raise exc
    runner.recomputing.add(name)
    try:
        why = exc.bad[0][3]
        _warn_recomputing(runner, name, sids, why)
        for sid in sids:
            plan.status[sid] = SubjectStatus.STALE
            plan.reasons[sid] = [Reason.RESULT_UNREADABLE.text(why=why)]
        counts = runner.counts.setdefault(name, StageCounts(total=len(plan.keys)))
        counts.cached = max(0, counts.cached - len(sids))
        _run_subjects(runner, runner.recipe.stage(name), plan, sids, counts)
        still = [sid for sid in sids if plan.status.get(sid) is not SubjectStatus.DONE]
        if still:
            raise StoreError(f"stage {name!r}: the unreadable stored result of {', '.join(still[:5])} "
                             "could not be recomputed (see the failures above); the run stops here")
    finally:
        runner.recomputing.discard(name)
