"""What the report says about the results themselves: table previews, distributions and their outliers.

A run's charts say what the subjects cost; a researcher also needs to see what they produced before
trusting the table: a collect stage's table (first rows, a summary per column) and, per map stage,
the distribution of every numeric result column with the subjects far from the rest named (a broken
scan whose features have near-zero spread stands out). Outliers are found with the median and the
median absolute deviation (the modified z-score of Iglewicz and Hoaglin, |z| > 3.5): robust to the
outliers themselves, unlike a mean and standard deviation. Everything here is plain computation on
values already read; page.py lays it out and ``sections.py`` draws it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from habitrun.store.resultfiles import files_named

PREVIEW_ROWS = 10  # rows of a table shown
MAX_TABLE_ROWS = 200_000  # rows of a table file read for its column summaries
MAX_TABLES = 4  # tables previewed per collect stage
MAX_COLUMNS = 40  # numeric columns of a map stage drawn
MAX_SUMMARY_COLUMNS = 60  # columns of a table summarised
MAX_OUTLIERS = 8  # subjects named per column
OUTLIER_Z = 3.5  # modified z-score beyond which a value is an outlier
BINS = 24
TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}


@dataclass
class ColumnSummary:
    """One table column: how many values, how many missing, and its spread or its commonest values."""

    name: str
    count: int
    missing: int
    numeric: bool
    mean: float | None = None
    sd: float | None = None
    low: float | None = None
    median: float | None = None
    high: float | None = None
    distinct: int = 0
    top: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class TablePreview:
    """A table a collect stage produced: its first rows and a summary of every column."""

    stage: str
    name: str
    columns: list[str]
    rows: list[list[str]]
    total_rows: int
    summaries: list[ColumnSummary]
    truncated: bool = False  # more rows than were read


@dataclass
class Distribution:
    """One numeric result column of a map stage across its subjects."""

    stage: str
    column: str
    values: int
    missing: int
    low: float
    high: float
    median: float
    mad: float
    mean: float
    sd: float
    counts: list[int]
    outliers: list[tuple[str, float, float]]  # (subject, value, modified z), farthest first
    more_outliers: int = 0

    @property
    def constant(self) -> bool:
        return self.high == self.low


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _parsed(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def flat_numbers(result: Any, prefix: str = "", depth: int = 2) -> dict[str, float]:
    """The numbers a result holds by column name (nested dicts joined with ``.``, two levels deep)."""
    out: dict[str, float] = {}
    if not isinstance(result, Mapping):
        number = _number(result)
        if number is not None:
            out[prefix or "result"] = number
        return out
    for key, value in result.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            if depth > 1:
                out.update(flat_numbers(value, name, depth - 1))
            continue
        number = _number(value)
        if number is not None:
            out[name] = number
    return out


def distributions(stage: str, results: Mapping[str, Any]) -> list[Distribution]:
    """Every numeric column of a map stage's results (subject → result) held by at least half the
    subjects, the most common first, at most MAX_COLUMNS."""
    by_column: dict[str, list[tuple[str, float]]] = {}
    for sid, result in results.items():
        for name, number in flat_numbers(result).items():
            by_column.setdefault(name, []).append((sid, number))
    total = len(results)
    kept = sorted((name for name, pairs in by_column.items() if 2 * len(pairs) >= total),
                  key=lambda name: (-len(by_column[name]), name))[:MAX_COLUMNS]
    return [distribution(stage, name, by_column[name], total) for name in kept]


def distribution(stage: str, column: str, pairs: Sequence[tuple[str, float]], total: int) -> Distribution:
    """One column's spread, histogram and outliers (modified z-score > OUTLIER_Z; with no spread in
    the middle half, values that differ from the median at all)."""
    values = sorted(v for _, v in pairs)
    n = len(values)
    median = _median(values)
    mad = _median(sorted(abs(v - median) for v in values))
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    low, high = values[0], values[-1]
    counts = [0] * BINS
    span = high - low
    for v in values:
        counts[min(BINS - 1, int((v - low) / span * BINS)) if span > 0 else 0] += 1
    scored: list[tuple[str, float, float]] = []
    for sid, v in pairs:
        if mad > 0:
            z = 0.6745 * (v - median) / mad
        elif v != median:
            z = math.copysign(math.inf, v - median)
        else:
            continue
        if abs(z) > OUTLIER_Z:
            scored.append((sid, v, z))
    scored.sort(key=lambda item: (-abs(item[2]), item[0]))
    return Distribution(stage=stage, column=column, values=n, missing=total - n, low=low, high=high,
                        median=median, mad=mad, mean=mean, sd=sd, counts=counts, outliers=scored[:MAX_OUTLIERS],
                        more_outliers=max(0, len(scored) - MAX_OUTLIERS))


def _median(values: Sequence[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def summarize(name: str, cells: Iterable[str]) -> ColumnSummary:
    """A column's summary from its cells as text: numeric when every non-empty cell is a number."""
    texts = list(cells)
    present = [t for t in texts if t.strip() != ""]
    numbers = [_parsed(t) for t in present]
    summary = ColumnSummary(name=name, count=len(present), missing=len(texts) - len(present),
                            numeric=bool(present) and all(n is not None for n in numbers))
    if summary.numeric:
        values = sorted(n for n in numbers if n is not None)
        summary.mean = sum(values) / len(values)
        summary.sd = (math.sqrt(sum((v - summary.mean) ** 2 for v in values) / (len(values) - 1))
                      if len(values) > 1 else 0.0)
        summary.low, summary.median, summary.high = values[0], _median(values), values[-1]
    counts: dict[str, int] = {}
    for t in present:
        counts[t] = counts.get(t, 0) + 1
    summary.distinct = len(counts)
    if not summary.numeric:
        summary.top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return summary


def preview(stage: str, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
            truncated: bool = False) -> TablePreview:
    """A table's first rows and column summaries (every row read counts in the summaries)."""
    text_rows = [["" if cell is None else str(cell) for cell in row] for row in rows]
    shown = list(columns)[:MAX_SUMMARY_COLUMNS]
    summaries = [summarize(col, (row[i] if i < len(row) else "" for row in text_rows)) for i, col in enumerate(shown)]
    return TablePreview(stage=stage, name=name, columns=list(columns), rows=text_rows[:PREVIEW_ROWS],
                        total_rows=len(text_rows), summaries=summaries, truncated=truncated)


def tables_of(stage: str, result: Any, work_root: Path) -> list[TablePreview]:
    """The tables a collect stage's result is or names: a DataFrame, a list of flat dicts, or CSV/TSV
    files inside the run's work folders (named by a Path or an absolute path string, as the demo's)."""
    frame = _frame_table(stage, result)
    if frame is not None:
        return [frame]
    if isinstance(result, list) and result and all(isinstance(r, Mapping) for r in result):
        columns = list(dict.fromkeys(k for r in result for k in r))
        return [preview(stage, stage, columns, [[r.get(c) for c in columns] for r in result[:MAX_TABLE_ROWS]],
                        truncated=len(result) > MAX_TABLE_ROWS)]
    found: list[TablePreview] = []
    for path in dict.fromkeys(files_named(result, work_root)):
        if path.suffix.lower() not in TABLE_SUFFIXES:
            continue
        table = _read_table(stage, path)
        if table is not None:
            found.append(table)
        if len(found) >= MAX_TABLES:
            break
    return found


def _frame_table(stage: str, result: Any) -> TablePreview | None:
    """A pandas DataFrame (anything with ``columns`` and ``itertuples``), read without importing pandas."""
    columns = getattr(result, "columns", None)
    rows_of = getattr(result, "itertuples", None)
    if columns is None or not callable(rows_of):
        return None
    rows = []
    for i, row in enumerate(rows_of(index=False, name=None)):
        if i >= MAX_TABLE_ROWS:
            break
        rows.append(list(row))
    return preview(stage, f"{stage} (DataFrame)", [str(c) for c in columns], rows,
                   truncated=len(result) > MAX_TABLE_ROWS)


def _read_table(stage: str, path: Path) -> TablePreview | None:
    delimiter = TABLE_SUFFIXES[path.suffix.lower()]
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                return None
            rows: list[list[str]] = []
            truncated = False
            for row in reader:
                if len(rows) >= MAX_TABLE_ROWS:
                    truncated = True
                    break
                rows.append(row)
    except (OSError, csv.Error):
        return None
    return preview(stage, path.name, header, rows, truncated=truncated)


@dataclass
class Science:
    """The results part of a report: collect tables, map distributions, params, environment, changes."""

    tables: list[TablePreview] = field(default_factory=list)
    distributions: dict[str, list[Distribution]] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    environment: dict[str, Any] | None = None
    previous_run: str | None = None
    changes: list[str] = field(default_factory=list)
    note: str | None = None  # why results could not be read, when they could not


def from_results(stages: Sequence[tuple[str, bool]], current: Mapping[str, Any], work_root: Path) -> Science:
    """``stages``: (name, is a map stage) in order; ``current``: each stage's current results (a map
    stage's {subject: result} of its done subjects; a collect or train stage's one result)."""
    science = Science()
    for name, is_map in stages:
        if name not in current:
            continue
        if is_map:
            science.distributions[name] = distributions(name, current[name])
        else:
            science.tables.extend(tables_of(name, current[name], work_root))
    return science
