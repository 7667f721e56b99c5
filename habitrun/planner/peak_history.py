"""A stage's peak-memory model from the store's trace and each subject's cheap feature.

History counts only when it is of the same stage and code: a trace row is
used when its key starts with the stage's current key part (stage, operator,
code, params and upstream; see :mod:`habitrun.planner.keys`), so a code
change starts the learning again. A subject's feature is the value of the
manifest column the policy names (``memory_hint``), else the total size of
the files in its file columns (``subjects.files``, or the columns discovery
filled), which is known before it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from habitrun.planner.memory_model import PeakModel, quantile
from habitrun.planner.subject_files import cell_paths, file_columns
from habitrun.store.trace import COL

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.spec.policy import RunPolicy


def hint_value(fields: Mapping[str, Any], column: str) -> float | None:
    """The number in ``column`` of a manifest row (None: missing or not a number)."""
    try:
        value = float(fields.get(column))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if value == value and value >= 0 else None  # NaN is no number


def files_size(fields: Mapping[str, Any], columns: Iterable[str], root: Path) -> float | None:
    """Total bytes of the files a manifest row names (None: none of them is there)."""
    total, seen = 0, False
    for column in columns:
        for text in cell_paths(fields.get(column)):
            path = Path(text).expanduser()
            try:
                total += os.stat(path if path.is_absolute() else root / path).st_size
                seen = True
            except (OSError, ValueError):
                continue
    return float(total) if seen else None


def subject_features(loaded: LoadedRecipe, rows: Mapping[str, Mapping[str, Any]], hint: str | None,
                     subjects: Any = None) -> dict[str, float]:
    """subject -> its feature (a ``memory_hint`` value, else its input files' size), where known."""
    out: dict[str, float] = {}
    if hint:
        for sid, fields in rows.items():
            value = hint_value(fields, hint)
            if value is not None:
                out[sid] = value
        return out
    columns = list(file_columns(loaded, subjects))
    if not columns:
        return out
    for sid, fields in rows.items():
        value = files_size(fields, columns, loaded.root)
        if value is not None:
            out[sid] = value
    return out


def peak_model(trace_rows: Iterable[tuple], features: Mapping[str, float], key_prefix: str | None) -> PeakModel:
    """The model of one stage from its trace rows (oldest first) and its subjects' features.

    ``key_prefix``: the stage's current key part (a map stage's); rows of other code are left out.
    """
    model = PeakModel()
    for sid, value in features.items():
        model.set_feature(sid, value)
    head = None if not key_prefix else key_prefix + "."
    key_col, outcome_col, peak_col, sid_col = COL["key"], COL["outcome"], COL["peak_rss_mb"], COL["subject"]
    for row in trace_rows:
        peak = row[peak_col]
        if row[outcome_col] != "done" or peak is None:
            continue
        if head is not None and not str(row[key_col] or "").startswith(head):
            continue
        model.measured(row[sid_col], float(peak))
    return model


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
