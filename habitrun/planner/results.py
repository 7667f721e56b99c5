"""A stage's current results as a table: one row per subject, results flattened into columns.

"Current" means what the recipe as it is now would reuse: each subject's
record under its present cache key (plan_study decides the keys). Every
subject of the manifest gets a row, done or not, so failed subjects show
their error and pending ones their status. A mapping result becomes columns
(nested keys joined with ``.``); anything else is one ``result`` column.
Nothing is written to the store.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from habitrun.errors import MissingExtra, StoreError, UsageError
from habitrun.planner.plan import GROUP_SUBJECT, Plan, StagePlan, SubjectStatus, plan_study
from habitrun.spec.roots import declared_roots
from habitrun.spec.subjects import load_subjects, rows_by_id
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.trace import COL, latest_by_key

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

FIXED = ("subject_id", "status", "kind", "error", "duration_sec", "cpu_sec", "peak_rss_mb")
_STATUS_WORD = {SubjectStatus.BLOCKED: "skipped", SubjectStatus.FORCED: "to_rerun"}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a.b": 1, "c": 2}`` (an empty mapping stays a value)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping) and item:
            out.update(flatten(item, name + "."))
        else:
            out[name] = item
    return out


def open_store(loaded: LoadedRecipe) -> CheckpointStore:
    """The recipe's existing store (StoreError when nothing has run yet); never creates one."""
    store_dir = loaded.store_dir()
    if not CheckpointStore.exists(store_dir):
        raise StoreError(f"no checkpoint store at {store_dir} yet: run the study first "
                         f"({shlex.join(['habitrun', 'run', str(loaded.path)])})")
    store = CheckpointStore.open(store_dir, create=False, read_only=True)
    store.set_roots(loaded.run_root(), loaded.root, declared_roots(loaded).data)  # stored paths read as absolute
    return store


def stage_of(plan: Plan, stage: str) -> StagePlan:
    if stage not in plan.stages:
        raise UsageError(f"the recipe has no stage {stage!r}; its stages are: {', '.join(plan.stages)}")
    return plan.stages[stage]


def group_result(loaded: LoadedRecipe, stage: str) -> Any:
    """A collect or train stage's stored result as it is (UsageError when it has none)."""
    with open_store(loaded) as store:
        stage_plan = stage_of(plan_study(loaded, load_subjects(loaded), store), stage)
        if not stage_plan.is_group:
            raise UsageError(f"stage {stage!r} is a map stage: it has one result per subject, not one")
        key = stage_plan.keys[GROUP_SUBJECT]
        results = store.results([key])
        if key not in results:
            state = stage_plan.status.get(GROUP_SUBJECT)
            raise UsageError(f"stage {stage!r} has no current result (it is {state.value if state else 'not planned'})")
        return results[key]


def stage_table(loaded: LoadedRecipe, stage: str, *, manifest: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of a map stage: subject, [manifest fields], status, error, costs, result columns."""
    subjects = load_subjects(loaded)
    with open_store(loaded) as store:
        stage_plan = stage_of(plan_study(loaded, subjects, store), stage)
        if stage_plan.is_group:
            raise UsageError(f"stage {stage!r} is a {stage_plan.kind} stage with one result: "
                             f"write it with -o result.json")
        keys = [stage_plan.keys[row.id] for row in subjects]
        states = store.states(keys)
        results = store.results([k for k in keys if (s := states.get(k)) is not None and s.ok])
        durations = store.durations(keys)
        traced = latest_by_key(store.trace(stage=stage, keys=keys))
    field_names: list[str] = []
    if manifest:
        for row in subjects:
            field_names.extend(name for name in row.fields if name not in field_names)
        by_id = rows_by_id(subjects)  # a found subject's files by their absolute paths
    fixed = list(FIXED) + [name for name in field_names if name not in FIXED]
    result_columns: dict[str, None] = {}
    rows: list[dict[str, Any]] = []
    for row in subjects:
        key = stage_plan.keys[row.id]
        state = states.get(key)
        status = stage_plan.status.get(row.id)
        trace = traced.get(key)
        out: dict[str, Any] = {
            "subject_id": row.id,
            "status": _STATUS_WORD.get(status, status.value) if status is not None else None,
            "kind": state.kind if state is not None and not state.ok else None,
            "error": state.error if state is not None and not state.ok else None,
            "duration_sec": _rounded(durations.get(key)) if state is not None else None,
            "cpu_sec": trace[COL["cpu_sec"]] if trace else None,
            "peak_rss_mb": trace[COL["peak_rss_mb"]] if trace else None,
        }
        if manifest:
            for name in field_names:
                if name not in FIXED:
                    out[name] = by_id[row.id].fields.get(name)
        if key in results:
            value = results[key]
            flat = flatten(value) if isinstance(value, Mapping) else {"result": value}
            for name, item in flat.items():
                column = f"result.{name}" if name in out or name in fixed else name
                out[column] = item
                result_columns[column] = None
        rows.append(out)
    return fixed + list(result_columns), rows


def results(recipe: Any, stage: str, *, manifest: bool = False) -> Any:
    """A map stage's current results as a pandas DataFrame indexed by subject id (for notebooks).

    ``recipe`` is a path to the recipe (or a LoadedRecipe). Needs pandas:
    ``pip install 'habitrun[tables]'``.
    """
    try:
        import pandas as pd
    except ImportError:
        raise MissingExtra("habitrun.results()", "pandas", "tables") from None
    from habitrun.spec.loader import LoadedRecipe, load_recipe

    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    columns, rows = stage_table(loaded, stage, manifest=manifest)
    frame = pd.DataFrame.from_records(rows, columns=columns)
    return frame.set_index("subject_id")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)
