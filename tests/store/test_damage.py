"""A damaged or emptied store file: said so by plan/status/run (exit 2 where they cannot go on), intact records kept."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.store.integrity_study import habitrun, write_study
from tests.store.test_workdirs import plan_json


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _written(db: Path) -> dict[tuple[str, str], float]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {(st, sid): at for st, sid, at in con.execute("SELECT stage, subject_id, written_at FROM habitrun_record")}
    finally:
        con.close()


@pytest.fixture(scope="module")
def done_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 300-subject study (copied by each test)."""
    recipe = write_study(tmp_path_factory.mktemp("damage") / "study", n=300)
    habitrun("run", "recipe.yaml", "-q", cwd=recipe.parent)
    return recipe.parent


@pytest.mark.timeout(120)
def test_damage_in_the_middle_of_the_file_is_reported_and_every_intact_record_kept(done_study: Path,
                                                                                    tmp_path: Path) -> None:
    cwd = tmp_path / "study"
    shutil.copytree(done_study, cwd)
    db = cwd / ".habitrun" / "store" / "cache.db"
    before = _written(db)
    data = db.read_bytes()
    page = int.from_bytes(data[16:18], "big") or 65536  # SQLite's page size, from the file header
    # 4 KB of random bytes over the page of records nearest the middle of the file (the middle
    # itself may hold a trace or index page, whose loss costs no record: aim where records are)
    marks = [i for i in range(len(data)) if data.startswith(b'{"v":2,"kind":"map"', i)]
    target = min(marks, key=lambda i: abs(i - len(data) // 2)) // page * page
    with open(db, "r+b") as fh:
        fh.seek(target)
        fh.write(random.Random(17).randbytes(4096))
    damaged_sha = _sha(db)

    plan = habitrun("plan", "recipe.yaml", "--reason", cwd=cwd, code=2)
    assert "store damaged:" in plan.stderr and "record(s) unreadable" in plan.stderr, plan.stderr
    assert "intact and used" in plan.stderr
    data = json.loads(habitrun("plan", "recipe.yaml", "--json", cwd=cwd, code=2).stdout)
    stale = {(s["name"], sid) for s in data["stages"] for sid, v in s["subjects"].items() if v["status"] == "stale"}
    assert stale and len(stale) < len(before)
    assert all("damaged" in data["stages"][[s["name"] for s in data["stages"]].index(st)]["subjects"][sid]["reasons"][0]
               for st, sid in stale)
    status = habitrun("status", "recipe.yaml", cwd=cwd, code=2)
    assert "store damaged:" in status.stderr
    assert _sha(db) == damaged_sha  # read-only commands did not touch it

    run = habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert "is damaged" in run.stdout + run.stderr
    aside = list(db.parent.glob("cache.db.damaged-*"))
    assert [p for p in aside if not p.name.endswith(("-wal", "-shm"))] and _sha(
        next(p for p in aside if not p.name.endswith(("-wal", "-shm")))) == damaged_sha
    assert all(s["to_run"] == 0 for s in plan_json(cwd / "recipe.yaml").values())
    after = _written(db)
    rerun = {k for k in before if after[k] != before[k]}
    assert rerun == stale  # exactly the unreadable ones ran again: every intact record was kept as it was
    habitrun("plan", "recipe.yaml", cwd=cwd)  # sound again: exit 0


@pytest.mark.timeout(120)
def test_an_empty_store_file_is_said_to_be_empty(done_study: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "study"
    shutil.copytree(done_study, cwd)
    db = cwd / ".habitrun" / "store" / "cache.db"
    db.write_bytes(b"")
    plan = habitrun("plan", "recipe.yaml", cwd=cwd, code=2)
    assert "is empty (0 bytes)" in plan.stderr, plan.stdout + plan.stderr
    assert "is empty (0 bytes)" in habitrun("status", "recipe.yaml", cwd=cwd, code=2).stderr
    run = habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert "is empty (0 bytes)" in run.stdout + run.stderr
    assert all(s["to_run"] == 0 for s in plan_json(cwd / "recipe.yaml").values())


@pytest.mark.timeout(120)
def test_a_truncated_store_file_keeps_what_it_still_holds(done_study: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "study"
    shutil.copytree(done_study, cwd)
    db = cwd / ".habitrun" / "store" / "cache.db"
    before = _written(db)
    with open(db, "r+b") as fh:
        fh.truncate(db.stat().st_size * 6 // 10 // 4096 * 4096)
    truncated_sha = _sha(db)
    plan = habitrun("plan", "recipe.yaml", cwd=cwd, code=2)
    assert "the file is truncated" in plan.stderr and "intact and used" in plan.stderr, plan.stderr
    assert "to run" in plan.stdout and _sha(db) == truncated_sha
    run = habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert "the file is truncated" in run.stdout + run.stderr
    aside = [p for p in db.parent.glob("cache.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and _sha(aside[0]) == truncated_sha  # kept, never deleted
    after = _written(db)
    kept = {k for k in before if after.get(k) == before[k]}
    assert kept and len(kept) < len(before)  # what the file still held was used, not recomputed
    assert all(s["to_run"] == 0 for s in plan_json(cwd / "recipe.yaml").values())
