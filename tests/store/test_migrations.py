"""Each migration step on a store the older habitrun wrote (data/store_v1, data/store_v2).

A step applied alone must give what the next format's habitrun wrote (format 2: the
``store_v2`` fixture; format 3: a store created today), keep every row, and leave the
store readable; ``test_upgrade.py`` covers opening an old store, which runs every step.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.guard import STORE_VERSION
from habitrun.store.migrations import MIGRATIONS, read_only_shim, read_version, upgrade
from habitrun.store.records import NAMES, RECORDS
from habitrun.store.schema import SCHEMA, mark_new_store

DATA = Path(__file__).parent / "data"
OLD_COLUMNS = "key, stage, subject_id, ok, attempts, error, kind, log_path, run_id, components, duration, written_at"


def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    return folder


def _shape(db: Path) -> tuple[list[tuple], set[str], set[str]]:
    """(records columns, records indexes, triggers) of a store file."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        columns = [row[1:] for row in con.execute(f"PRAGMA table_info({RECORDS})")]
        objects = con.execute("SELECT type, name FROM sqlite_master WHERE tbl_name = ?", (RECORDS,)).fetchall()
    finally:
        con.close()
    return columns, {n for t, n in objects if t == "index"}, {n for t, n in objects if t == "trigger"}


def _step(db: Path, to: int) -> list[tuple]:
    """Apply the steps up to format ``to`` as opening does (schema, then upgrade, one transaction);
    return the rows' format-1 columns before."""
    con = sqlite3.connect(db, isolation_level=None)
    try:
        before = con.execute(f"SELECT {OLD_COLUMNS} FROM {RECORDS} ORDER BY key").fetchall()
        con.execute("BEGIN IMMEDIATE")
        for statement in SCHEMA:
            con.execute(statement)
        upgrade(con, to=to)
        con.execute("COMMIT")
        assert read_version(con) == to
        assert con.execute(f"SELECT {OLD_COLUMNS} FROM {RECORDS} ORDER BY key").fetchall() == before
    finally:
        con.close()
    return before


def test_the_steps_are_one_per_format_in_order() -> None:
    assert [m.to for m in MIGRATIONS] == list(range(2, STORE_VERSION + 1))


@pytest.mark.timeout(60)
def test_step_1_to_2_gives_what_the_format_2_habitrun_wrote(tmp_path: Path) -> None:
    folder = _copy("store_v1", tmp_path)
    _step(folder / "cache.db", 2)
    columns, indexes, _ = _shape(folder / "cache.db")
    v2_columns, v2_indexes, _ = _shape(_copy("store_v2", tmp_path) / "cache.db")  # (a reader may add -shm)
    assert columns == v2_columns and indexes == v2_indexes  # the two old indexes dropped, one in their place
    with CheckpointStore.open(folder, create=False, read_only=True) as store:  # a format-2 store, read as one
        assert store.format_version == 2
        assert store.results(["prep.k1", "prep.k2", "prep.k3"]) == {
            "prep.k1": {"volume": 12.5, "label": "a"}, "prep.k2": list(range(20000))}
        assert store.states(["prep.k3"])["prep.k3"].attempts == 2


@pytest.mark.timeout(60)
def test_step_2_to_3_gives_what_a_store_created_today_has(tmp_path: Path) -> None:
    folder = _copy("store_v2", tmp_path)
    _step(folder / "cache.db", 3)
    mark_new_store(tmp_path / "new").close()
    assert _shape(folder / "cache.db") == _shape(tmp_path / "new" / "cache.db")
    con = sqlite3.connect(folder / "cache.db")
    try:
        assert con.execute(f"SELECT count(*) FROM {RECORDS} WHERE digest IS NOT NULL OR outside IS NOT NULL"
                           ).fetchone() == (0,)  # no checksum before format 3: none invented
    finally:
        con.close()
    with CheckpointStore.open(folder, create=False, read_only=True) as store:
        assert store.format_version == 3 and store.changed("prep") == {}
        assert store.results(["prep.k4"]) == {"prep.k4": 7}


@pytest.mark.timeout(60)
def test_every_step_from_format_1_gives_what_a_store_created_today_has(tmp_path: Path) -> None:
    folder = _copy("store_v1", tmp_path)
    _step(folder / "cache.db", STORE_VERSION)
    mark_new_store(tmp_path / "new").close()
    assert _shape(folder / "cache.db") == _shape(tmp_path / "new" / "cache.db")


@pytest.mark.parametrize("name", ["store_v1", "store_v2"])
def test_a_reader_of_an_older_format_sees_every_column(name: str) -> None:
    con = sqlite3.connect(f"file:{DATA / name / 'cache.db'}?immutable=1", uri=True)
    try:
        for statement in read_only_shim(read_version(con)):
            con.execute(statement)
        cursor = con.execute(f"SELECT * FROM {RECORDS} LIMIT 1")
        assert tuple(d[0] for d in cursor.description) == NAMES
        assert con.execute("SELECT count(*) FROM habitrun_changed").fetchone() == (0,)
    finally:
        con.close()
