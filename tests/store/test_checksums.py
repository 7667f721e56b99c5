"""Every stored result carries a checksum: a damaged one is stale (plan, status), recomputed (run), never passed on."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from habitrun.store.checkpoint import CheckpointStore, Record, UnreadableResults
from tests.store.integrity_study import habitrun, write_study
from tests.store.test_workdirs import plan_json, stage_results, statuses


def _status_json(cwd: Path) -> dict:
    return json.loads(habitrun("status", "recipe.yaml", "--json", cwd=cwd).stdout)


@pytest.mark.timeout(120)
def test_a_spilled_result_overwritten_with_garbage_is_stale_and_recomputed(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study", big="s2")
    cwd = recipe.parent
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    files = list((cwd / ".habitrun" / "store").rglob("*.val"))
    assert len(files) == 1  # s2's result of feat, over 32 KB
    files[0].write_bytes(os.urandom(80))

    reason = habitrun("plan", "recipe.yaml", "--reason", cwd=cwd).stdout
    assert "stale (stored result unreadable: checksum mismatch): 1" in reason, reason
    assert statuses(plan_json(recipe), "feat") == {"s1": "done", "s2": "stale", "s3": "done"}
    status = habitrun("status", "recipe.yaml", cwd=cwd).stdout
    assert "feat s2: stored result unreadable: checksum mismatch" in status, status
    assert _status_json(cwd)["unreadable"] == [
        {"stage": "feat", "subject": "s2", "reason": "stored result unreadable: checksum mismatch"}
    ]

    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert stage_results(recipe, "feat")["s2"]["payload"] == "p" * 50_000
    assert all(s["to_run"] == 0 for s in plan_json(recipe).values())
    assert stage_results(recipe, "table")["*"]["s2"].startswith("bins=32 x=2")


@pytest.mark.timeout(120)
def test_a_corrupted_in_row_result_is_stale_and_recomputed(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    cwd = recipe.parent
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    con = sqlite3.connect(cwd / ".habitrun" / "store" / "cache.db")
    (value,) = con.execute("SELECT value FROM habitrun_record WHERE stage = 'feat' AND subject_id = 's3'").fetchone()
    damaged = bytearray(value)
    damaged[len(damaged) // 2] ^= 0x20  # one flipped bit: still a valid pickle, another value
    con.execute("UPDATE habitrun_record SET value = ? WHERE stage = 'feat' AND subject_id = 's3'", (bytes(damaged),))
    con.commit()
    con.close()
    # plan reads the index only, unless asked to check every result (run always does)
    assert statuses(plan_json(recipe), "feat") == {"s1": "done", "s2": "done", "s3": "done"}
    assert statuses(plan_json(recipe, "--verify"), "feat") == {"s1": "done", "s2": "done", "s3": "stale"}
    status = habitrun("status", "recipe.yaml", "--verify", cwd=cwd).stdout
    assert "feat s3: stored result unreadable: checksum mismatch" in status, status
    run = habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert "feat" in run.stdout and "cached" in run.stdout
    assert statuses(plan_json(recipe, "--verify"), "feat") == {"s1": "done", "s2": "done", "s3": "done"}
    assert stage_results(recipe, "feat")["s3"]["payload"] == "p" * 10


def test_reading_a_result_whose_stat_looks_unchanged_still_checks_it(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "store") as store:
        store.put([Record(stage="feat", key="k-big", subject_id="S1", ok=True, result="x" * 100_000), Record(stage="feat", key="k-small", subject_id="S2", ok=True, result=5)])
        (path,) = list((tmp_path / "store").rglob("*.val"))
        st = path.stat()
        path.write_bytes(b"y" * st.st_size)  # same size, and the old mtime put back
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert store.unreadable("feat") == {}  # planning trusts an unchanged stat...
        with pytest.raises(UnreadableResults, match="stage 'feat', subject 'S1': checksum mismatch") as err:
            store.results(["k-big", "k-small"])  # ...reading never does
        assert [b[:2] for b in err.value.bad] == [("feat", "S1")]
        path.unlink()
        assert store.unreadable("feat") == {"k-big": "its file is missing"}
        assert store.results(["k-small"]) == {"k-small": 5}
