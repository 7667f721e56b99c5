"""A map stage's peak-memory predictions for a memory budget: the trace's history and the subjects' features.

Built once per stage before its subjects go to the backend (only when the
stage's policy sets ``memory_budget_mb``); the process backend's admission
learns on from this run's finished subjects. ``plan`` makes the same
predictions to show them (:func:`spread_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from habitrun.engine.events import RunWarning
from habitrun.planner.memory_model import PeakModel, quantile
from habitrun.planner.peak_history import peak_model, subject_features
from habitrun.store.trace import COL

OVER_NAMED = 5  # subjects named in the warning

if TYPE_CHECKING:
    from habitrun.engine.contract import SubjectTask
    from habitrun.engine.runner import StudyRunner
    from habitrun.planner.stageplan import StagePlan
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.spec.policy import RunPolicy


def wants_forecast(policy: RunPolicy, kind: str) -> bool:
    """A memory budget applies: a map stage on the process backend."""
    return policy.memory_budget_mb is not None and policy.backend == "process" and kind == "map"


def stage_model(loaded: LoadedRecipe, store: Any, stage: str, key_prefix: str | None,
                rows: Mapping[str, Mapping[str, Any]], hint: str | None, subjects: Any = None,
                more_rows: Callable[[str], Mapping[str, Any] | None] | None = None) -> PeakModel:
    """The stage's model: its trace (same stage and code) with the features of ``rows``' subjects.

    ``more_rows``: the manifest row of a subject measured before and not in ``rows`` (None: unknown).
    """
    trace = store.trace(stage=stage) if store is not None else []
    fields = dict(rows)
    if more_rows is not None:
        sid_col = COL["subject"]
        for row in trace:
            sid = row[sid_col]
            if sid not in fields:
                found = more_rows(sid)
                if found is not None:
                    fields[sid] = found
    features = subject_features(loaded, fields, hint, subjects)
    return peak_model(trace, features, key_prefix)


def spread_of(model: PeakModel, sids: Iterable[str], budget_mb: float | None) -> dict[str, Any]:
    """Predicted peaks of ``sids``: max, p95, how many are known, and how many exceed the budget."""
    values = [v for v in (model.predict(sid) for sid in sids) if v is not None]
    if not values:
        return {"predicted": 0, "max_mb": None, "p95_mb": None, "over_budget": 0, "budget_mb": budget_mb}
    return {"predicted": len(values), "max_mb": round(max(values), 1), "p95_mb": round(quantile(values, 0.95), 1),
            "over_budget": sum(1 for v in values if budget_mb is not None and v > budget_mb),
            "budget_mb": None if budget_mb is None else round(budget_mb, 1)}


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
