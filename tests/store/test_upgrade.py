"""Stores written by an older habitrun: upgraded in place when opened, their work kept.

``data/store_v1`` was written by habitrun's format-1 store (every result in
diskcache's ``Cache`` table, one of them spilled to a file): a small success,
a large one, and a failure of stage ``prep``.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.errors import StoreError
from habitrun.store.checkpoint import CheckpointStore, Record
from habitrun.store.guard import STORE_VERSION
from tests.store.conftest import files_snapshot
from tests.store.test_guard import RECIPE  # one map stage 'a' doubling field x

V1 = Path(__file__).parent / "data" / "store_v1"


def _version(folder: Path) -> str:
    con = sqlite3.connect(folder / "cache.db")
    try:
        return con.execute("SELECT value FROM habitrun_meta WHERE name = 'version'").fetchone()[0]
    finally:
        con.close()


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    shutil.copytree(V1, folder)
    assert _version(folder) == "1"
    return folder


@pytest.mark.timeout(60)
def test_a_format_1_store_opens_upgraded_with_every_record_and_result(old_store: Path) -> None:
    with CheckpointStore.open(old_store) as store:
        states = store.states(["prep.k1", "prep.k2", "prep.k3"])
        assert states["prep.k1"].ok and states["prep.k2"].ok and not states["prep.k3"].ok
        assert states["prep.k3"].error == "ValueError: bad spacing" and states["prep.k3"].attempts == 2
        assert store.results(["prep.k1", "prep.k2", "prep.k3"]) == {
            "prep.k1": {"volume": 12.5, "label": "a"},
            "prep.k2": list(range(20000)),
        }
        assert store.stage_outcomes("prep") == ({"prep.k1", "prep.k2"}, {"prep.k3"})
        assert store.latest("prep")["S1"] == ("prep.k1", {"kind": "map", "row": "r1"})
        assert store.recipe_info() == ("demo", "ab" * 32)
    assert _version(old_store) == str(STORE_VERSION)
    con = sqlite3.connect(old_store / "cache.db")
    indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'habitrun_record'")}
    con.close()
    assert "habitrun_record_stage" in indexes and not indexes & {"habitrun_record_subject", "habitrun_record_outcome"}
    with CheckpointStore.open(old_store) as store:  # opening an upgraded store again changes nothing
        assert set(store.results(["prep.k1", "prep.k2"])) == {"prep.k1", "prep.k2"}


@pytest.mark.timeout(60)
def test_new_results_replace_old_ones_wherever_the_old_ones_lie(old_store: Path) -> None:
    with CheckpointStore.open(old_store) as store:
        store.put([
            Record(stage="prep", key="prep.k1", subject_id="S1", ok=True, result="new small"),
            Record(stage="prep", key="prep.k2", subject_id="S2", ok=True, result="now small too"),  # its old file must go
            Record(stage="prep", key="prep.k4", subject_id="S4", ok=True, result=4),
        ])
        assert store.results(["prep.k1", "prep.k2", "prep.k4"]) == {
            "prep.k1": "new small", "prep.k2": "now small too", "prep.k4": 4,
        }
        assert len(store._cache) == 0 and not list(old_store.rglob("*.val"))
        assert store._cache.check() == []


@pytest.mark.timeout(60)
def test_a_store_of_a_newer_format_is_refused_untouched(old_store: Path) -> None:
    con = sqlite3.connect(old_store / "cache.db")
    con.execute("UPDATE habitrun_meta SET value = '99' WHERE name = 'version'")
    con.commit()
    con.close()
    before = files_snapshot(old_store)
    with pytest.raises(StoreError, match="format version '99'.*newer habitrun wrote it"):
        CheckpointStore.open(old_store)
    assert files_snapshot(old_store) == before


@pytest.mark.timeout(120)
def test_run_on_a_format_1_store_keeps_its_records(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "subjects.csv").write_text("subject_id,x\nS1,1\nS2,2\n")
    (tmp_path / "ops.py").write_text("def double(subject):\n    return 2 * int(subject.fields['x'])\n")
    store_dir = tmp_path / ".habitrun" / "store"
    shutil.copytree(V1, store_dir)
    for _ in range(2):  # the second run finds the first's results, stored in the upgraded store
        done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "run", "recipe.yaml", "--quiet"],
                              capture_output=True, text=True, timeout=100, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    with CheckpointStore.open(store_dir) as store:
        assert store.count("prep") == 3 and store.count("a") == 2
        assert store.results(["prep.k2"]) == {"prep.k2": list(range(20000))}
        assert sorted(store.results(store.stage_keys("a")).values()) == [2, 4]


V2 = Path(__file__).parent / "data" / "store_v2"
STUDY_V2 = Path(__file__).parent / "data" / "study_v2"


@pytest.mark.timeout(60)
def test_a_format_2_store_is_upgraded_and_its_results_without_checksum_stay_valid(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    shutil.copytree(V2, folder)
    assert _version(folder) == "2"
    with CheckpointStore.open(folder) as store:
        assert store.results(["prep.k1", "prep.k2", "prep.k4"]) == {
            "prep.k1": {"volume": 12.5, "label": "a"}, "prep.k2": list(range(20000)), "prep.k4": 7}
        assert store.states(["prep.k3"])["prep.k3"].error == "ValueError: bad spacing"
        assert store.unreadable("prep") == {}
        store.verify_rows = True
        assert store.unreadable("prep") == {}  # no checksum to compare with: valid
        store.put([Record(stage="prep", key="prep.k5", subject_id="S5", ok=True, result="new")])
        assert store.results(["prep.k5"]) == {"prep.k5": "new"}
        # an old success replaced (no checksum before): counted as a different result, to be safe
        store.put([Record(stage="prep", key="prep.k4", subject_id="S4", ok=True, result=7)])
        assert set(store.changed("prep")) == {"prep.k4"}
        store.put([Record(stage="prep", key="prep.k4", subject_id="S4", ok=True, result=7)])  # the same again: no new change
        assert store.changed("prep")["prep.k4"][0] == "S4"
    assert _version(folder) == str(STORE_VERSION) == "3"
    con = sqlite3.connect(folder / "cache.db")
    digests = dict(con.execute("SELECT key, digest FROM habitrun_record"))
    con.close()
    assert digests["prep.k1"] is None and digests["prep.k5"] is not None


@pytest.mark.timeout(120)
def test_a_study_run_by_the_format_2_habitrun_plans_all_done_and_runs_nothing(tmp_path: Path) -> None:
    study = tmp_path / "study"
    shutil.copytree(STUDY_V2, study, ignore=shutil.ignore_patterns("store"))
    shutil.copytree(STUDY_V2 / "store", study / ".habitrun" / "store")
    db = study / ".habitrun" / "store" / "cache.db"
    before = db.read_bytes()

    def cli(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                              timeout=100, cwd=study)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        return done

    assert "nothing to run: every stage is done" in cli("plan", "recipe.yaml").stdout
    assert db.read_bytes() == before and _version(db.parent) == "2"  # plan neither upgraded nor wrote it
    def written() -> dict:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return dict(con.execute("SELECT key, written_at FROM habitrun_record"))
        finally:
            con.close()

    stored = written()
    ran = cli("run", "recipe.yaml", "--quiet").stdout
    # upgraded, nothing recomputed: every record kept its time (run moves them to today's keys)
    assert _version(db.parent) == "3" and sorted(written().values()) == sorted(stored.values())
    assert "nothing to run: every stage is done" in cli("plan", "recipe.yaml").stdout, ran
    with CheckpointStore.open(db.parent, create=False, read_only=True) as store:
        assert store.count() == 7 and store.changed("feat") == {}
