"""Something that is not a habitrun store where the store should be: refused, and left untouched."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import diskcache
import pytest

from habitrun.errors import StoreError
from habitrun.store.checkpoint import CheckpointStore, Record
from tests.store.conftest import files_snapshot


def corrupt_after_header(folder: Path) -> Path:
    folder.mkdir()
    db = folder / "cache.db"
    db.write_bytes(b"SQLite format 3\x00" + os.urandom(3000))
    return folder


def corrupt_wal_header(folder: Path) -> Path:
    # a damaged file whose header says write-ahead log (bytes 18 and 19 are 2): SQLite's read-only
    # mode would make -wal and -shm files beside it
    corrupt_after_header(folder)
    db = folder / "cache.db"
    data = bytearray(db.read_bytes())
    data[18:20] = b"\x02\x02"
    db.write_bytes(bytes(data))
    return folder


def random_bytes(folder: Path) -> Path:
    folder.mkdir()
    (folder / "cache.db").write_bytes(b"\x00\x01not a database at all" * 100)
    return folder


def foreign_diskcache(folder: Path) -> Path:
    cache = diskcache.Cache(str(folder))
    cache["someone"] = "else's data"
    cache.close()
    return folder


def other_sqlite(folder: Path) -> Path:
    folder.mkdir()
    con = sqlite3.connect(folder / "cache.db")
    con.execute("CREATE TABLE patients (id TEXT)")
    con.execute("INSERT INTO patients VALUES ('P1')")
    con.commit()
    con.close()
    return folder


def plain_file(folder: Path) -> Path:
    folder.write_text("this is a results file, not a folder\n")
    return folder


def folder_of_other_files(folder: Path) -> Path:
    folder.mkdir()
    (folder / "scan_001.nii").write_bytes(b"\x5c\x01" * 50)
    return folder


CASES = {
    "corrupt sqlite": (corrupt_after_header, "damaged"),
    "corrupt sqlite, wal header": (corrupt_wal_header, "damaged"),
    "not sqlite": (random_bytes, "not an SQLite database"),
    "foreign diskcache": (foreign_diskcache, "diskcache that habitrun did not write"),
    "other sqlite": (other_sqlite, "SQLite database of something else"),
    "plain file": (plain_file, "a file, not a folder"),
    "other files": (folder_of_other_files, "scan_001.nii"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_and_untouched(tmp_path: Path, case: str) -> None:
    make, fragment = CASES[case]
    target = make(tmp_path / "store")
    before = files_snapshot(target)
    for create in (True, False):
        with pytest.raises(StoreError) as info:
            CheckpointStore.open(target, create=create)
        message = str(info.value)
        assert str(target) in message and fragment in message
        assert "checkpoint_dir" in message  # what to do about it
    with pytest.raises(StoreError):
        CheckpointStore.exists(target)
    assert files_snapshot(target) == before


def test_a_crash_before_the_first_write_leaves_a_store_that_opens(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    (folder / "cache.db").write_bytes(b"")  # created by sqlite, killed before a byte was written
    with CheckpointStore.open(folder) as store:
        store.put([Record(stage="a", key="k", subject_id="S", ok=True, result=1)])
    with CheckpointStore.open(folder, create=False) as store:
        assert store.results(["k"]) == {"k": 1}


RECIPE = """\
habitrun: 1
name: guarded
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: a, operator: "ops:double"}
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["corrupt sqlite", "corrupt sqlite, wal header", "foreign diskcache", "plain file"])
def test_cli_plan_and_status_exit_2_and_leave_it(tmp_path: Path, case: str) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "subjects.csv").write_text("subject_id,x\nS1,1\nS2,2\n")
    (tmp_path / "ops.py").write_text("def double(subject):\n    return 2 * int(subject.fields['x'])\n")
    (tmp_path / ".habitrun").mkdir()
    target = CASES[case][0](tmp_path / ".habitrun" / "store")
    before = files_snapshot(target)
    for command in ("plan", "status"):
        done = subprocess.run(
            [sys.executable, "-m", "habitrun.cli.app", command, str(tmp_path / "recipe.yaml")],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
        if command == "status":
            assert done.returncode == 1 and "no run yet" in done.stdout  # status needs no store without a run
            assert "locked this study's store" not in done.stdout  # no habitrun command did
            continue
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        assert "not a habitrun checkpoint store" in done.stderr
    assert files_snapshot(target) == before
