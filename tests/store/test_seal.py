"""The seal of a cleanly closed store (habitrun/store/seal.py): it lets an open skip the full
check only while the file is exactly as the writer left it; any other change is checked in full."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from habitrun.store import CheckpointStore, Record
from habitrun.store.seal import is_sealed, seal_path
from tests.store.integrity_study import habitrun, write_study


def _store_with_records(directory: Path, n: int = 50) -> Path:
    store = CheckpointStore.open(directory)
    store.put([Record(stage="s", key=f"k{i:04d}", subject_id=f"S{i}", ok=True, result=i, components="{}")
               for i in range(n)])
    store.close()
    return directory / "cache.db"


def test_a_clean_close_seals_and_a_writer_opening_breaks_the_seal(tmp_path: Path) -> None:
    db = _store_with_records(tmp_path / "store")
    assert is_sealed(db)
    reader = CheckpointStore.open(tmp_path / "store", create=False, read_only=True)
    assert reader.count() == 50 and reader.damage is None
    reader.close()
    assert is_sealed(db)  # a reader leaves the file as it was (an empty log beside it is fine)
    writer = CheckpointStore.open(tmp_path / "store")
    assert not seal_path(db).exists()  # gone before the writer writes a byte
    writer.close()
    assert is_sealed(db)


def test_a_writer_that_dies_leaves_no_seal(tmp_path: Path) -> None:
    db = _store_with_records(tmp_path / "store")
    code = textwrap.dedent(f"""
        import os
        from habitrun.store import CheckpointStore, Record
        store = CheckpointStore.open({str(tmp_path / "store")!r})
        store.put([Record(stage="s", key="late", subject_id="L", ok=True, result=1, components="{{}}")])
        os._exit(0)  # killed before it closes: its writes may sit in the log
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert not is_sealed(db)
    store = CheckpointStore.open(tmp_path / "store", create=False, read_only=True)
    assert store.count() == 51
    store.close()


def test_frames_in_the_log_are_never_sealed_over(tmp_path: Path) -> None:
    db = _store_with_records(tmp_path / "store")
    stamp = db.stat()
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("UPDATE habitrun_record SET attempts = 2 WHERE key = 'k0001'")  # into the log only
    assert db.stat().st_mtime_ns == stamp.st_mtime_ns and os.stat(f"{db}-wal").st_size > 0
    assert not is_sealed(db)
    con.close()


@pytest.mark.timeout(120)
def test_damage_after_a_clean_close_is_found_even_with_its_mtime_put_back(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study", n=60)
    habitrun("run", "recipe.yaml", "-q", cwd=recipe.parent)
    db = recipe.parent / ".habitrun" / "store" / "cache.db"
    assert is_sealed(db)
    habitrun("plan", "recipe.yaml", cwd=recipe.parent)  # sealed and sound: exit 0
    before = db.stat()
    data = db.read_bytes()
    page = int.from_bytes(data[16:18], "big") or 65536
    target = data.index(b'{"v":2,"kind":"map"') // page * page
    with open(db, "r+b") as fh:  # the same size, the same inode
        fh.seek(target)
        fh.write(bytes(page))
    os.utime(db, ns=(before.st_atime_ns, before.st_mtime_ns))  # the mtime put back: the ctime cannot be
    assert not is_sealed(db)
    plan = habitrun("plan", "recipe.yaml", cwd=recipe.parent, code=2)
    assert "store damaged:" in plan.stderr, plan.stderr


def test_a_copy_of_a_sealed_store_is_checked_in_full(tmp_path: Path) -> None:
    db = _store_with_records(tmp_path / "store")
    shutil.copytree(tmp_path / "store", tmp_path / "copy")  # the seal comes along, the inode does not
    assert is_sealed(db) and not is_sealed(tmp_path / "copy" / "cache.db")


def test_a_reader_holding_an_old_snapshot_neither_delays_the_close_nor_is_sealed_over(tmp_path: Path) -> None:
    db = _store_with_records(tmp_path / "store")
    writer = CheckpointStore.open(tmp_path / "store")
    reader = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM habitrun_record").fetchone() == (50,)  # its snapshot
        writer.put([Record(stage="s", key="new", subject_id="N", ok=True, result=1, components="{}")])
        started = time.monotonic()
        writer.close()
        assert time.monotonic() - started < 10  # not the store's 60 s busy timeout
        assert not is_sealed(db)  # the log could not be emptied: the next open checks in full
    finally:
        reader.close()
