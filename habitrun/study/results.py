"""A stage's current results as a table: one row per subject, results flattened into columns.

"Current" means what the recipe the :class:`~habitrun.study.facade.Study` reads
with would reuse (by default the latest run's, see :mod:`habitrun.study.which`):
each subject's record under its cache key. Every subject gets a row, done or
not. A mapping result becomes columns (nested keys joined with ``.``); anything
else is one ``result`` column. Only the subject id and the operator's result
columns come by default, so the table can feed a model; ``meta`` adds status,
failure kind, error, duration, CPU and peak memory. Paths come back absolute,
resolved against the study's folders as they are now. A collect or train stage's
one result is given as it is; through the Python API a table (a list of rows, or
a path to a .csv/.tsv/.parquet file) comes as a DataFrame. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from habitrun.engine.stage_kinds import kind_of
from habitrun.errors import MissingExtra, UsageError
from habitrun.planner.plan import GROUP_SUBJECT, Plan, StagePlan, SubjectStatus
from habitrun.spec.subjects import rows_by_id
from habitrun.store.trace import COL, latest_by_key

if TYPE_CHECKING:
    from habitrun.study.facade import Study

META = ("status", "kind", "error", "duration_sec", "cpu_sec", "peak_rss_mb")
FIXED = ("subject_id", *META)
_STATUS_WORD = {SubjectStatus.BLOCKED: "skipped", SubjectStatus.FORCED: "to_rerun"}
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")


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


def stage_of(plan: Plan, stage: str) -> StagePlan:
    if stage not in plan.stages:
        raise UsageError(f"the recipe has no stage {stage!r}; its stages are: {', '.join(plan.stages)}")
    return plan.stages[stage]


def group_result(study: Study, stage: str) -> Any:
    """A collect or train stage's stored result as it is (UsageError when it has none)."""
    store = study.store(required=True)
    assert store is not None
    with store:
        stage_plan = stage_of(study.plan(study.subjects(), store), stage)
        if not kind_of(stage_plan).one_result:
            raise UsageError(f"stage {stage!r} is a map stage: it has one result per subject, not one")
        key = stage_plan.keys[GROUP_SUBJECT]
        results = store.results([key])
        if key not in results:
            state = stage_plan.status.get(GROUP_SUBJECT)
            raise UsageError(f"stage {stage!r} has no current result (it is {state.value if state else 'not planned'})")
        return results[key]


def is_group_stage(study: Study, stage: str) -> bool:
    """Whether ``stage`` has one result for the whole cohort (UsageError: no such stage)."""
    stages = {s.name: s for s in study.loaded.recipe.stages}
    if stage not in stages:
        raise UsageError(f"the recipe has no stage {stage!r}; its stages are: {', '.join(stages)}")
    return kind_of(stages[stage]).one_result


def stage_table(study: Study, stage: str, *, manifest: bool = False,
                meta: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of a map stage: subject, [status, error, costs], [manifest fields], result columns."""
    subjects, store = study.subjects_and_store()
    if store is None:
        study.store(required=True)  # raises: no store yet, with the command that makes one
    assert store is not None
    with store:
        stage_plan = stage_of(study.plan(subjects, store), stage)
        if kind_of(stage_plan).one_result:
            raise UsageError(f"stage {stage!r} is a {stage_plan.kind} stage with one result: "
                             f"write it with -o result.json")
        keys = [stage_plan.keys[row.id] for row in subjects]
        states = store.states(keys)
        results = store.results([k for k in keys if (s := states.get(k)) is not None and s.ok])
        durations = store.durations(keys) if meta else {}
        traced = latest_by_key(store.trace(stage=stage, keys=keys)) if meta else {}
    field_names: list[str] = []
    if manifest:
        for row in subjects:
            field_names.extend(name for name in row.fields if name not in field_names)
        by_id = rows_by_id(subjects)  # a found subject's files by their absolute paths
    fixed = ["subject_id", *(META if meta else ())]
    fixed += [name for name in field_names if name not in fixed]
    result_columns: dict[str, None] = {}
    rows: list[dict[str, Any]] = []
    for row in subjects:
        key = stage_plan.keys[row.id]
        out: dict[str, Any] = {"subject_id": row.id}
        if meta:
            out.update(_meta(states.get(key), stage_plan.status.get(row.id), durations.get(key), traced.get(key)))
        if manifest:
            for name in field_names:
                if name not in out:
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


def _meta(state: Any, status: SubjectStatus | None, duration: float | None, trace: Any) -> dict[str, Any]:
    failed = state is not None and not state.ok
    return {
        "status": _STATUS_WORD.get(status, status.value) if status is not None else None,
        "kind": state.kind if failed else None,
        "error": state.error if failed else None,
        "duration_sec": _rounded(duration) if state is not None else None,
        "cpu_sec": trace[COL["cpu_sec"]] if trace else None,
        "peak_rss_mb": trace[COL["peak_rss_mb"]] if trace else None,
    }


def results(recipe: Any, stage: str, *, manifest: bool = False, meta: bool = False, run: str | None = None,
            overrides: tuple[str, ...] = ()) -> Any:
    """A stage's current results for a notebook: a map stage's as a DataFrame indexed by subject id
    (result columns; ``meta`` adds status, error and costs), a collect or train stage's as it is.

    ``recipe`` is a path to the recipe (or a LoadedRecipe, read as it is); ``run`` a run id (default: the latest run) and
    ``overrides`` ``key=value`` texts choose which results, as for `habitrun results`.
    Needs pandas: ``pip install 'habitrun[tables]'``.
    """
    try:
        import pandas as pd
    except ImportError:
        raise MissingExtra("habitrun.results()", "pandas", "tables") from None
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.study.facade import Study
    from habitrun.study.which import About, selecting

    if isinstance(recipe, LoadedRecipe):  # a recipe loaded already: read as it is
        study = Study(recipe, About(None, selecting(recipe.overrides), "file"))
    else:
        study = Study.at_run(recipe, overrides, run)
    if is_group_stage(study, stage):
        return as_frame(group_result(study, stage), pd)
    columns, rows = stage_table(study, stage, manifest=manifest, meta=meta)
    frame = pd.DataFrame.from_records(rows, columns=columns)
    return frame.set_index("subject_id")


def as_frame(value: Any, pd: Any) -> Any:
    """A table as a DataFrame (a DataFrame, a list of mappings, a path to a .csv/.tsv/.parquet file); else ``value``."""
    if isinstance(value, pd.DataFrame):
        return value
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return pd.DataFrame.from_records(value)
    if isinstance(value, (str, PurePath)) and Path(value).suffix.lower() in TABLE_SUFFIXES and Path(value).is_file():
        if Path(value).suffix.lower() == ".parquet":
            return pd.read_parquet(value)
        return pd.read_csv(value, sep="\t" if Path(value).suffix.lower() == ".tsv" else ",")
    return value


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)
