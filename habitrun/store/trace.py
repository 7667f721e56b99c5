"""The trace: one row per subject attempt (what it cost and how it ended), kept in the store.

Rows are written by :meth:`CheckpointStore.put` in the same transaction as
the records of their batch, so the trace costs one ``executemany`` per
commit and is exactly as durable as the results. The table is additive: a
store from before it gets it, empty, when opened for writing, and a reader
of a store without it sees no rows (never an error), so the store format
version did not change. Columns that could not be measured are NULL.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple

TRACE_TABLE = "habitrun_trace"

class TraceRow(NamedTuple):
    """One subject attempt, a row of the trace table: its fields are the table's columns, in order
    (the one place that order is written). Times are Unix seconds (wall clock); memory in MB; read/write
    bytes are what passed through read()/write() calls. Columns that could not be measured are None."""

    run_id: str | None
    stage: str
    subject: str
    attempt: int | None
    outcome: str | None  # done | failed | retried (failed, and run again in a later round)
    kind: str | None  # a FailureKind value when not done
    error: str | None
    queued_at: float | None
    started_at: float | None
    ended_at: float | None
    wall_sec: float | None
    cpu_sec: float | None  # user + system, the subject's child processes included
    peak_rss_mb: float | None  # the subject's own peak, plus its largest child's when known
    child_peak_rss_mb: float | None
    read_bytes: int | None
    write_bytes: int | None
    pid: int | None
    host: str | None
    gpu: str | None
    key: str | None
    log: str | None


_SQL_TYPES = {"stage": "TEXT NOT NULL", "subject": "TEXT NOT NULL", "attempt": "INTEGER", "read_bytes": "INTEGER",
              "write_bytes": "INTEGER", "pid": "INTEGER", "queued_at": "REAL", "started_at": "REAL",
              "ended_at": "REAL", "wall_sec": "REAL", "cpu_sec": "REAL", "peak_rss_mb": "REAL",
              "child_peak_rss_mb": "REAL"}  # every other column: TEXT
# Name and SQL type of each column, in row order.
TRACE_FIELDS: tuple[tuple[str, str], ...] = tuple((name, _SQL_TYPES.get(name, "TEXT")) for name in TraceRow._fields)
TRACE_COLUMNS: tuple[str, ...] = tuple(name for name, _ in TRACE_FIELDS)
COL = {name: i for i, name in enumerate(TRACE_COLUMNS)}

TRACE_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TRACE_TABLE} (" + ", ".join(f"{n} {t}" for n, t in TRACE_FIELDS) + ")",
)
TRACE_INSERT = (f"INSERT INTO {TRACE_TABLE} ({', '.join(TRACE_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(TRACE_COLUMNS))})")


def read_trace(con: Any, *, run_id: str | None = None, stage: str | None = None,
               keys: str | None = None) -> list[tuple]:
    """Trace rows in the order they were written, optionally of one run, one stage and/or
    the cache keys in ``keys`` (a JSON list: one query however many)."""
    where: list[str] = []
    params: list[Any] = []
    if keys is not None:
        where.append("key IN (SELECT value FROM json_each(?))")
        params.append(keys)
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if stage is not None:
        where.append("stage = ?")
        params.append(stage)
    sql = f"SELECT {', '.join(TRACE_COLUMNS)} FROM {TRACE_TABLE}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    try:
        return con.execute(sql + " ORDER BY rowid", tuple(params)).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []  # a store written before the trace existed
        raise


def latest_by_key(rows: Sequence[tuple]) -> dict[str, tuple]:
    """cache key -> its newest trace row (the attempt whose outcome is stored)."""
    key = COL["key"]
    return {row[key]: row for row in rows}


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (not empty)."""
    index = min(len(sorted_values) - 1, max(0, int(round(fraction * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """median, p95 and max of the measured values (None when nothing was measured)."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return {"median": None, "p95": None, "max": None}
    return {"median": percentile(known, 0.5), "p95": percentile(known, 0.95), "max": known[-1]}


def stage_stats(rows: Sequence[tuple], slowest: int = 5) -> dict[str, dict[str, Any]]:
    """Per stage: attempts, duration and peak-memory spreads, and the slowest subjects."""
    by_stage: dict[str, list[tuple]] = {}
    stage_col = COL["stage"]
    for row in rows:
        group = by_stage.get(row[stage_col])
        if group is None:
            by_stage[row[stage_col]] = group = []
        group.append(row)
    wall, peak, sid, outcome = COL["wall_sec"], COL["peak_rss_mb"], COL["subject"], COL["outcome"]
    out: dict[str, dict[str, Any]] = {}
    for stage, stage_rows in by_stage.items():
        walls = [r[wall] for r in stage_rows]
        known = [i for i, w in enumerate(walls) if w is not None]
        top = [stage_rows[i] for i in heapq.nlargest(slowest, known, key=walls.__getitem__)]
        out[stage] = {
            "attempts": len(stage_rows),
            "duration_sec": spread(walls),
            "peak_rss_mb": spread([r[peak] for r in stage_rows]),
            "slowest": [{"subject": r[sid], "duration_sec": r[wall], "peak_rss_mb": r[peak], "outcome": r[outcome]}
                        for r in top],
        }
    return out
