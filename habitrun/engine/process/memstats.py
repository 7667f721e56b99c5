"""What memory admission did in one stage: waits, runs alone, recycled workers, prediction errors.

Kept by the process backend per stage and handed to the run's provenance
(``describe``), where ``status`` and the report read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from habitrun.planner.memory_model import median

NAMED = 10  # subjects named at most per list


@dataclass
class StageMemory:
    """Counters of one stage's admission (all runs of it on one backend)."""

    predicted_max_mb: float | None = None  # the largest prediction when the stage started
    waits: int = 0  # subjects that waited for memory with a worker free
    wait_sec: float = 0.0
    wait_max_sec: float = 0.0
    ran_alone: int = 0
    oom_retried_alone: int = 0
    recycled: int = 0
    over_budget: list[str] = field(default_factory=list)
    errors: list[tuple[float, float]] = field(default_factory=list)  # (predicted, measured) MB
    alone_ids: set[str] = field(default_factory=set)

    def alone(self, sid: str, *, over: bool) -> None:
        """``sid`` started alone (``over``: predicted above the whole budget)."""
        if sid not in self.alone_ids:
            self.alone_ids.add(sid)
            self.ran_alone += 1
        if over and sid not in self.over_budget:
            self.over_budget.append(sid)

    def waited(self, seconds: float) -> None:
        self.waits += 1
        self.wait_sec += seconds
        self.wait_max_sec = max(self.wait_max_sec, seconds)

    def error(self, predicted: float, measured: float) -> None:
        self.errors.append((predicted, measured))

    def summary(self) -> dict[str, Any]:
        """JSON-safe: counts, waits, and the median absolute (and relative) prediction error."""
        abs_err = [abs(p - m) for p, m in self.errors]
        rel_err = [abs(p - m) / m for p, m in self.errors if m > 0]
        return {
            "predicted_max_mb": None if self.predicted_max_mb is None else round(self.predicted_max_mb, 1),
            "waits": self.waits,
            "wait_sec": round(self.wait_sec, 3),
            "wait_max_sec": round(self.wait_max_sec, 3),
            "ran_alone": self.ran_alone,
            "oom_retried_alone": self.oom_retried_alone,
            "recycled_workers": self.recycled,
            "over_budget": self.over_budget[:NAMED],
            "predicted_subjects": len(self.errors),
            "median_abs_error_mb": round(median(abs_err), 1) if abs_err else None,
            "median_rel_error": round(median(rel_err), 3) if rel_err else None,
            "under_predicted": sum(1 for p, m in self.errors if m > p),
        }
