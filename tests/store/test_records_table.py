"""The records table written once (store/records.py): everything built from it, or written beside it, agrees."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.records import (
    COLUMNS,
    NAMES,
    RECORDS,
    STATE_COLUMNS,
    UPSERT,
    Record,
    StoredState,
    row_of,
    state_of,
)


def _table_info(con: sqlite3.Connection, table: str = RECORDS) -> list[tuple]:
    return [row[1:] for row in con.execute(f"PRAGMA table_info({table})")]  # (name, type, notnull, default, pk)


def test_a_new_store_has_the_columns_of_the_table_in_its_order(tmp_path: Path) -> None:
    CheckpointStore.open(tmp_path / "s").close()
    con = sqlite3.connect(tmp_path / "s" / "cache.db")
    try:
        info = _table_info(con)
    finally:
        con.close()
    assert [row[0] for row in info] == list(NAMES)
    assert [row[1] for row in info] == [c.sql.split()[0] for c in COLUMNS]
    assert [bool(row[2]) for row in info] == ["NOT NULL" in c.sql for c in COLUMNS]


def test_record_and_stored_state_fields_come_from_the_table() -> None:
    assert [f.name for f in dataclasses.fields(Record)] == [c.field for c in COLUMNS if c.field] + ["result"]
    assert [f.name for f in dataclasses.fields(StoredState)] == STATE_COLUMNS.split(", ")
    with pytest.raises(TypeError):  # keyword-built: a misplaced positional argument cannot slip in
        Record("a", "k", "S", True)
    with pytest.raises(TypeError):
        Record(stage="a", key="k", ok=True)  # subject_id is required


def test_a_record_becomes_one_value_per_column() -> None:
    failure = Record(stage="a", key="k", subject_id="S", ok=False, error="E", kind="exception", attempts=2,
                     components={"b": 1, "a": [1]}, run_id="r", log_path="/l", duration_sec=1)
    row = dict(zip(NAMES, row_of(failure, 5.0, None, None, None, None), strict=True))
    assert row == {"key": "k", "stage": "a", "subject_id": "S", "ok": 0, "attempts": 2, "error": "E",
                   "kind": "exception", "log_path": "/l", "run_id": "r", "components": '{"b":1,"a":[1]}',
                   "duration": 1.0, "written_at": 5.0, "mode": None, "value": None, "digest": None, "outside": None}
    success = Record(stage="a", key="k", subject_id="S", ok=True, error="ignored", kind="ignored", components="{}")
    row = dict(zip(NAMES, row_of(success, 6.0, 1, 7, b"d", "/x"), strict=True))
    assert (row["ok"], row["error"], row["kind"], row["components"]) == (1, None, None, "{}")  # a success has no error
    assert (row["mode"], row["value"], row["digest"], row["outside"]) == (1, 7, b"d", "/x")
    assert state_of(tuple(row[n] for n in STATE_COLUMNS.split(", "))) == StoredState(
        key="k", stage="a", subject_id="S", ok=True, attempts=1, error=None, kind=None, log_path=None, run_id=None)


def test_the_upsert_writes_every_column_and_a_column_added_later_allows_null() -> None:
    assert all(f"excluded.{n}" in UPSERT for n in NAMES if n != "key") and UPSERT.count("?") == len(NAMES)
    # ALTER TABLE ... ADD COLUMN cannot add a NOT NULL column without a default to a filled table
    assert all("NOT NULL" not in c.sql and "PRIMARY" not in c.sql for c in COLUMNS if c.since > 1)
