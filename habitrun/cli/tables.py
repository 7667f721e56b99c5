"""Writing a table (columns and row dicts) as CSV, TSV, JSON lines or Parquet, chosen by suffix.

A path is written as its plain text in every format (never JSON-quoted). CSV
and TSV cells that are not plain values (lists, mappings) are written as
JSON text; an empty cell is a missing value. Parquet goes through pyarrow
(the ``tables`` extra); a column whose values pyarrow cannot hold as one
type is written as text (JSON for non-scalars).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any, TextIO

from habitrun.errors import MissingExtra, UsageError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".parquet": "parquet"}


def format_for(path: Path | None, allowed: Sequence[str] = tuple(FORMATS)) -> str:
    """The format a path's suffix asks for (stdout: CSV)."""
    if path is None:
        return "csv"
    suffix = path.suffix.lower()
    if suffix not in allowed:
        raise UsageError(f"cannot tell the format of {path}: give a file ending in {', '.join(allowed)}")
    return FORMATS[suffix]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _write_delimited(fh: TextIO, columns: Sequence[str], rows: Sequence[dict[str, Any]], delimiter: str) -> None:
    writer = csv.writer(fh, delimiter=delimiter, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])


def _write_jsonl(fh: TextIO, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    for row in rows:
        fh.write(json.dumps({c: row.get(c) for c in columns}, ensure_ascii=False, default=str) + "\n")


def _arrow_column(values: list[Any]) -> Any:
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.array([None if v is None else (v if isinstance(v, str) else json.dumps(v, default=str))
                         for v in values], type=pa.string())


def _write_parquet(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtra("writing Parquet", "pyarrow", "tables") from None
    table = pa.table({c: _arrow_column([row.get(c) for row in rows]) for c in columns})
    pq.write_table(table, path)


def write_table(path: Path | None, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Write to ``path`` (format by suffix), or CSV to stdout when ``path`` is None."""
    fmt = format_for(path)
    rows = [_plain_paths(row) for row in rows]
    if fmt == "parquet":
        assert path is not None
        _write_parquet(path, columns, rows)
        return
    buffer = io.StringIO()
    if fmt == "jsonl":
        _write_jsonl(buffer, columns, rows)
    else:
        _write_delimited(buffer, columns, rows, "\t" if fmt == "tsv" else ",")
    if path is None:
        sys.stdout.write(buffer.getvalue())
        sys.stdout.flush()
    else:
        _write_text(path, buffer.getvalue())


def _plain_paths(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each ``Path`` cell as its text (so Parquet and JSON lines hold the path, not a quoted one)."""
    if not any(isinstance(v, PurePath) for v in row.values()):
        return row
    return {k: str(v) if isinstance(v, PurePath) else v for k, v in row.items()}


def _write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_json(path: Path | None, value: Any) -> None:
    """A collect stage's result as JSON (values JSON cannot hold are written as text)."""
    text = json.dumps(value, indent=1, ensure_ascii=False, default=str) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        _write_text(path, text)
