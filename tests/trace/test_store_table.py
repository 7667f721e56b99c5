"""The trace table: written with the records, read back as written, absent from older stores without harm."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from habitrun.store.checkpoint import CheckpointStore, Record
from habitrun.store.guard import DB_NAME
from habitrun.store.trace import TRACE_COLUMNS, TRACE_TABLE


def _row(i: int, outcome: str = "done") -> tuple:
    values = dict.fromkeys(TRACE_COLUMNS) | {"run_id": "r1", "stage": "s", "subject": f"S{i}", "attempt": 1,
                                             "outcome": outcome, "wall_sec": 0.5, "peak_rss_mb": 12.5,
                                             "key": f"k{i}", "host": "h"}
    return tuple(values[c] for c in TRACE_COLUMNS)


def _tables(directory: Path) -> set[str]:
    con = sqlite3.connect(directory / DB_NAME)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()


def test_trace_rows_commit_with_their_records_and_read_back(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "store") as store:
        store.put([Record(stage="s", key="k0", subject_id="S0", ok=True, result={"a": 1})], [_row(0)])
        store.put([], [_row(1, "retried")])  # a retried attempt has no record of its own
        bad = Record(stage="s", key="k2", subject_id="S2", ok=True, result=lambda: 1)  # unpicklable: the whole batch is refused
        try:
            store.put([bad], [_row(2)])
        except Exception:  # noqa: BLE001 - UnstorableResult; checked below by what is stored
            pass
    with CheckpointStore.open(tmp_path / "store", create=False) as store:
        rows = store.trace()
        assert [r[TRACE_COLUMNS.index("subject")] for r in rows] == ["S0", "S1"]
        assert rows[0] == _row(0)
        assert store.trace(stage="other") == [] and len(store.trace(run_id="r1")) == 2
        assert store.trace(keys=["k1", "nope"]) == [_row(1, "retried")] and store.trace(keys=[]) == []


def test_a_store_without_the_table_is_read_without_adding_it(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with CheckpointStore.open(directory) as store:
        store.put([Record(stage="s", key="k0", subject_id="S0", ok=True, result=1)])
    con = sqlite3.connect(directory / DB_NAME)
    con.execute(f"DROP TABLE {TRACE_TABLE}")
    con.commit()
    con.close()
    with CheckpointStore.open(directory, create=False, read_only=True) as store:  # status, trace, report...
        assert store.trace() == []
    assert TRACE_TABLE not in _tables(directory)
    with CheckpointStore.open(directory) as store:  # a writer adds it
        store.put([], [_row(0)])
    assert TRACE_TABLE in _tables(directory)


def test_an_unstorable_result_is_traced_as_the_failure_it_became(tmp_path: Path) -> None:
    import threading

    from habitrun.engine.recorder import Recorder

    with CheckpointStore.open(tmp_path / "store") as store:
        rec = Recorder(store, lambda events: None)
        try:
            rec.submit([Record(stage="s", key="k0", subject_id="S0", ok=True, result=1), Record(stage="s", key="k1", subject_id="S1", ok=True, result=threading.Lock())],
                       [], [_row(0), _row(1)])
            rec.flush()
        finally:
            rec.close()
        rows = {r[TRACE_COLUMNS.index("subject")]: dict(zip(TRACE_COLUMNS, r, strict=True)) for r in store.trace()}
    assert rows["S0"]["outcome"] == "done"
    assert rows["S1"]["outcome"] == "failed" and rows["S1"]["kind"] == "unpicklable"
    assert "cannot be stored" in rows["S1"]["error"]
