"""Everything the report shows about one run, read without writing anything."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from habitrun.spec.loader import LoadedRecipe
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.cohort import Cohort
from habitrun.store.runs import RunFolder
from habitrun.store.trace import COL, stage_stats

MAX_FAILURES = 500  # failures listed in full; the rest are counted
LOG_TAIL_LINES = 8
LOG_TAIL_BYTES = 8192


@dataclass
class StageInfo:
    name: str
    kind: str
    counts: dict[str, int]
    timeout_sec: float | None
    memory_limit_mb: float | None


@dataclass
class ReportData:
    recipe_name: str
    run_id: str
    outcome: str
    provenance: dict[str, Any]
    stages: list[StageInfo]
    rows: list[tuple]
    stats: dict[str, dict[str, Any]]
    failures: list[dict[str, Any]] = field(default_factory=list)
    more_failures: int = 0
    cohort: Cohort | None = None  # who the run left out before it started, and why
    members: dict[str, int] = field(default_factory=dict)  # collect/train stage -> subjects it took
    refused: list[str] = field(default_factory=list)  # stages refused on a partial cohort


def log_tail(path: str | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of a log file (none when it is missing or unreadable)."""
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    if size > LOG_TAIL_BYTES and text:
        text = text[1:]  # the first line read may be cut
    return text[-lines:]


def _counts_from_rows(rows: list[tuple], stage: str) -> dict[str, int]:
    last: dict[str, str] = {}
    for row in rows:
        if row[COL["stage"]] == stage:
            last[row[COL["subject"]]] = row[COL["outcome"]]
    values = list(last.values())
    return {"done": values.count("done"), "failed": values.count("failed")}


def gather(loaded: LoadedRecipe, run: RunFolder, store: CheckpointStore | None) -> ReportData:
    """Read the run's provenance and trace rows, and the failed subjects' log tails."""
    info = run.read_provenance()
    rows = store.trace(run_id=run.run_id) if store is not None else []
    summary = info.get("summary") or {}
    stage_counts = summary.get("stages") or {}
    stages = []
    for spec in loaded.recipe.ordered_stages():
        policy = loaded.recipe.stage_policy(spec.name)
        counts = stage_counts.get(spec.name) or _counts_from_rows(rows, spec.name)
        stages.append(StageInfo(spec.name, spec.kind, dict(counts), policy.subject_timeout_sec,
                                policy.worker_memory_limit_mb))
    outcome = str(info.get("outcome") or "did not finish")
    data = ReportData(loaded.recipe.name, run.run_id, outcome, info, stages, rows, stage_stats(rows))
    data.cohort = Cohort.read(run.path)
    data.members = {str(k): int(v) for k, v in (summary.get("members") or {}).items()}
    data.refused = [str(m) for m in summary.get("cohort_refused") or ()]
    failed = [row for row in rows if row[COL["outcome"]] == "failed"]
    data.more_failures = max(0, len(failed) - MAX_FAILURES)
    for row in failed[:MAX_FAILURES]:
        data.failures.append({
            "stage": row[COL["stage"]], "subject": row[COL["subject"]], "attempt": row[COL["attempt"]],
            "kind": row[COL["kind"]], "error": row[COL["error"]], "log": row[COL["log"]],
            "wall_sec": row[COL["wall_sec"]], "tail": log_tail(row[COL["log"]]),
        })
    return data
