"""A map stage's peak-memory predictions for a memory budget: the trace's history and the subjects' features.

Built once per stage before its subjects go to the backend (only when the
stage's policy sets ``memory_budget_mb``); the process backend's admission
learns on from this run's finished subjects. ``plan`` makes the same
predictions to show them (:func:`habitrun.planner.peak_history.spread_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from habitrun.planner.memory_model import PeakModel
from habitrun.planner.peak_history import stage_model, wants_forecast

OVER_NAMED = 5  # subjects named in the warning

if TYPE_CHECKING:
    from habitrun.engine.contract import SubjectTask
    from habitrun.planner.stageplan import StagePlan
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.spec.policy import RunPolicy
    from habitrun.spec.subjects import SubjectRow


class Forecaster:
    """What a stage's kind asks for a memory budget's predictions (the run context's ``forecast``): the
    recipe, store and subjects it needs are the runner's, so the stage kind never sees them."""

    def __init__(self, loaded: LoadedRecipe, store: Any, subjects: Any, rows: Mapping[str, SubjectRow]) -> None:
        self.loaded, self.store, self.subjects, self.rows = loaded, store, subjects, rows

    def __call__(self, stage: Any, plan: StagePlan, policy: RunPolicy, tasks: list[SubjectTask],
                 backend: Any) -> tuple[PeakModel | None, str | None]:
        """The stage's model when its policy sets a memory budget (else None: the backend admits by
        slots alone), and the warning for subjects predicted over the whole budget."""
        if not wants_forecast(policy, stage.kind):
            return None, None
        rows = self.rows

        def row_of(sid: str) -> Mapping[str, Any] | None:
            found = rows.get(sid)
            return None if found is None else found.fields

        model = stage_model(self.loaded, self.store, stage.name, plan.key_prefix,
                            {t.subject_id: t.fields for t in tasks}, policy.memory_hint, self.subjects, row_of)
        budget = getattr(backend, "memory_budget_mb", None)
        warning = None if budget is None else over_budget(stage.name, model, [t.subject_id for t in tasks], budget)
        return model, warning


def over_budget_text(stage: str, over: list[tuple[str, float]], budget_mb: float) -> str:
    """The warning for subjects predicted to peak above the whole budget (each then runs alone)."""
    named = ", ".join(f"{sid} ({mb:.0f} MB)" for sid, mb in over[:OVER_NAMED])
    more = f" and {len(over) - OVER_NAMED} more" if len(over) > OVER_NAMED else ""
    return (f"stage {stage!r}: {len(over)} subject(s) predicted to peak above the memory budget of "
            f"{budget_mb:.0f} MB: {named}{more}; each runs alone (nothing else beside it)")


def over_budget(stage: str, model: PeakModel, sids: list[str], budget_mb: float) -> str | None:
    """The warning for the subjects predicted above the whole budget; None when none is."""
    over = [(sid, p) for sid in sids if (p := model.predict(sid)) is not None and p > budget_mb]
    if not over:
        return None
    over.sort(key=lambda item: -item[1])
    return over_budget_text(stage, over, budget_mb)
