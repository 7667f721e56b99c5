"""A stage's typical subject duration from the store's trace, to size SLURM array tasks.

As in :mod:`habitrun.planner.peak_history`, history counts only when it is of
the same stage and code: a trace row is used when its key starts with the
stage's current key part, so a code change starts the learning again. Only
successful attempts count (a failure's time says little of a subject's work).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING

from habitrun.store.trace import COL

if TYPE_CHECKING:
    from habitrun.store.checkpoint import CheckpointStore


def durations(trace_rows: Iterable[tuple], key_prefix: str | None) -> list[float]:
    """Seconds of each successful attempt among ``trace_rows`` whose key has ``key_prefix`` (falsy: any)."""
    head = None if not key_prefix else key_prefix + "."
    key_col, outcome_col = COL["key"], COL["outcome"]
    wall_col, start_col, end_col = COL["wall_sec"], COL["started_at"], COL["ended_at"]
    out: list[float] = []
    for row in trace_rows:
        if row[outcome_col] != "done":
            continue
        if head is not None and not str(row[key_col] or "").startswith(head):
            continue
        wall = row[wall_col]
        if wall is None and row[start_col] is not None and row[end_col] is not None:
            wall = row[end_col] - row[start_col]
        if wall is not None and wall >= 0:
            out.append(float(wall))
    return out


def typical_duration(store: CheckpointStore | None, stage: str, key_prefix: str) -> float | None:
    """Median seconds of the successful attempts of ``stage`` with its current code; None: no history."""
    if store is None:
        return None
    found = durations(store.trace(stage=stage), key_prefix)
    return statistics.median(found) if found else None
