"""A map stage's peak-memory predictions for a memory budget: the trace's history and the subjects' features.

Built once per stage before its subjects go to the backend (only when the
stage's policy sets ``memory_budget_mb``); the process backend's admission
learns on from this run's finished subjects. ``plan`` makes the same
predictions to show them (:func:`habitrun.planner.peak_history.spread_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from habitrun.engine.events import RunWarning
from habitrun.planner.memory_model import PeakModel
from habitrun.planner.peak_history import stage_model, wants_forecast

OVER_NAMED = 5  # subjects named in the warning

if TYPE_CHECKING:
    from habitrun.engine.contract import SubjectTask
    from habitrun.engine.runner import StudyRunner
    from habitrun.planner.stageplan import StagePlan
    from habitrun.spec.policy import RunPolicy


def forecast_for(runner: StudyRunner, stage: Any, plan: StagePlan, policy: RunPolicy,
                 tasks: list[SubjectTask]) -> PeakModel | None:
    """The stage's model when its policy sets a memory budget, else None (the backend admits by slots alone)."""
    if not wants_forecast(policy, stage.kind):
        return None
    rows = runner.inputs.rows

    def row_of(sid: str) -> Mapping[str, Any] | None:
        found = rows.get(sid)
        return None if found is None else found.fields

    model = stage_model(runner.loaded, runner.store, stage.name, plan.key_prefix,
                        {t.subject_id: t.fields for t in tasks}, policy.memory_hint, runner.subjects, row_of)
    budget = getattr(runner.current_backend, "memory_budget_mb", None)
    if budget is not None:
        warn_over_budget(runner, stage.name, model, [t.subject_id for t in tasks], budget)
    return model


def over_budget_text(stage: str, over: list[tuple[str, float]], budget_mb: float) -> str:
    """The warning for subjects predicted to peak above the whole budget (each then runs alone)."""
    named = ", ".join(f"{sid} ({mb:.0f} MB)" for sid, mb in over[:OVER_NAMED])
    more = f" and {len(over) - OVER_NAMED} more" if len(over) > OVER_NAMED else ""
    return (f"stage {stage!r}: {len(over)} subject(s) predicted to peak above the memory budget of "
            f"{budget_mb:.0f} MB: {named}{more}; each runs alone (nothing else beside it)")


def warn_over_budget(runner: StudyRunner, stage: str, model: PeakModel, sids: list[str], budget_mb: float) -> None:
    over = [(sid, p) for sid in sids if (p := model.predict(sid)) is not None and p > budget_mb]
    if over:
        over.sort(key=lambda item: -item[1])
        message = over_budget_text(stage, over, budget_mb)
        runner.warnings.append(message)
        runner.events.emit(RunWarning(message=message))
