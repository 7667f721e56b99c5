"""`plan` and `status` only read: the store file is byte for byte the same after them, in any format."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from habitrun.errors import StoreError
from habitrun.store.checkpoint import CheckpointStore, Record
from tests.store.integrity_study import habitrun, write_study

DATA = Path(__file__).parent / "data"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(db: Path) -> str:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT value FROM habitrun_meta WHERE name = 'version'").fetchone()[0]
    finally:
        con.close()


def _chmod_read_only(root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in files + dirs:
            path = Path(folder) / name
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.mark.timeout(120)
def test_plan_and_status_leave_a_read_only_copy_unchanged(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study", big="s1")
    habitrun("run", "recipe.yaml", "-q", cwd=recipe.parent)
    copy = tmp_path / "copy"
    shutil.copytree(recipe.parent, copy)
    db = copy / ".habitrun" / "store" / "cache.db"
    _chmod_read_only(copy / ".habitrun" / "store")  # root ignores it: the checksum below is the proof
    before = _sha(db)
    for args in (("plan", "recipe.yaml"), ("plan", "recipe.yaml", "--json", "--verify"), ("status", "recipe.yaml"),
                 ("status", "recipe.yaml", "--json", "--verify"), ("gc", "recipe.yaml")):
        habitrun(*args, cwd=copy)
        assert _sha(db) == before, args


def test_a_read_only_store_refuses_to_write_at_the_sqlite_level(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "store") as store:
        store.put([Record(stage="a", key="k1", subject_id="S1", ok=True, result=1)])
    with CheckpointStore.open(tmp_path / "store", create=False, read_only=True) as store:
        assert store.read_only and store.results(["k1"]) == {"k1": 1}
        with pytest.raises(StoreError, match="read-only"):
            store.put([Record(stage="a", key="k2", subject_id="S2", ok=True, result=2)])
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store._con.execute("INSERT INTO habitrun_meta VALUES ('x', 'y')")


@pytest.mark.parametrize("fixture,version", [("store_v1", "1"), ("store_v2", "2")])
def test_older_formats_are_read_without_being_upgraded(tmp_path: Path, fixture: str, version: str) -> None:
    folder = tmp_path / "store"
    shutil.copytree(DATA / fixture, folder)
    before = _sha(folder / "cache.db")
    with CheckpointStore.open(folder, create=False, read_only=True) as store:
        assert store.results(["prep.k1", "prep.k2"]) == {
            "prep.k1": {"volume": 12.5, "label": "a"}, "prep.k2": list(range(20000))}
        assert store.stage_outcomes("prep") == ({"prep.k1", "prep.k2"} | ({"prep.k4"} if version == "2" else set()),
                                                {"prep.k3"})
        assert store.unreadable("prep") == {} and store.changed("prep") == {}
    assert _sha(folder / "cache.db") == before and _version(folder / "cache.db") == version


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.mark.timeout(120)
def test_plan_and_status_on_a_read_only_file_system(tmp_path: Path) -> None:
    """Where nothing can be written (no -wal/-shm either), plan and status still read the store."""
    recipe = write_study(tmp_path / "study", big="s1")
    habitrun("run", "recipe.yaml", "-q", cwd=recipe.parent)
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if _mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): read-only file system not tested")
    try:
        shutil.copytree(recipe.parent, mnt / "study")
        store = mnt / "study" / ".habitrun" / "store"
        assert not list(store.glob("cache.db-*"))  # the run closed its log
        remount = _mount("-o", "remount,ro", str(mnt))
        assert remount.returncode == 0, remount.stderr
        plan = habitrun("plan", "recipe.yaml", "--verify", cwd=mnt / "study")
        assert "nothing to run: every stage is done" in plan.stdout, plan.stdout + plan.stderr
        status = habitrun("status", "recipe.yaml", cwd=mnt / "study")
        assert "no failed subjects" in status.stdout and "damaged" not in status.stderr
    finally:
        _mount("-o", "remount,rw", str(mnt))
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)
