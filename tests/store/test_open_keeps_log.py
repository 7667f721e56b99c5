"""Opening a store for writing never checkpoints its write-ahead log (each checkpoint is two fsyncs
and a new log two more): diskcache's set-up writes only to the log; the store's close moves it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.guard import DB_NAME
from habitrun.store.records import Record

PAGE = 4096


def _stat(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


@pytest.mark.timeout(60)
def test_a_new_store_is_written_to_its_log_only_until_it_closes(tmp_path: Path) -> None:
    store = CheckpointStore.open(tmp_path / "store")
    db = tmp_path / "store" / DB_NAME
    try:
        assert db.stat().st_size == PAGE  # the header page of the WAL switch; every table is in the log
        assert Path(f"{db}-wal").stat().st_size > 0
        store.put([Record(stage="a", key="k", subject_id="S1", ok=True, result=1)])
    finally:
        store.close()
    assert not Path(f"{db}-wal").exists()
    with CheckpointStore.open(tmp_path / "store", create=False, read_only=True) as reader:
        assert reader.results(["k"]) == {"k": 1}


@pytest.mark.timeout(60)
def test_reopening_a_store_leaves_its_file_untouched_until_it_closes(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "store") as store:
        store.put([Record(stage="a", key="k", subject_id="S1", ok=True, result=1)])
    db = tmp_path / "store" / DB_NAME
    closed = _stat(db)
    store = CheckpointStore.open(tmp_path / "store")
    try:
        assert _stat(db) == closed  # diskcache's set-up went to the log
        assert store.results(["k"]) == {"k": 1}
    finally:
        store.close()
    assert _stat(db) != closed  # checkpointed at the close


KILLED_AFTER_OPEN = """
import os, sys
from habitrun.store.checkpoint import CheckpointStore
store = CheckpointStore.open(sys.argv[1])
os._exit(0)  # as if killed: nothing closed, nothing checkpointed
"""


@pytest.mark.timeout(60)
def test_a_store_whose_creator_died_right_after_opening_it_opens(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_OPEN, str(folder)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert Path(f"{folder / DB_NAME}-wal").stat().st_size > 0
    assert CheckpointStore.exists(folder)
    with CheckpointStore.open(folder, create=False) as store:
        store.put([Record(stage="a", key="k", subject_id="S1", ok=True, result=2)])
        assert store.results(["k"]) == {"k": 2}
