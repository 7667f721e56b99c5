"""A study run by the habitrun before issue 10 (data/study_v2) plans as done with today's keys.

The fixture's store was written by habitrun at main fa87924 (see data/study_v2/README).
Its keys were computed with the code fingerprint of that release (the operator
module's bytes); today's keys use the study modules' syntax trees. `plan` finds
each result under the key the older release gave the same inputs and counts it
done; `run` moves it to today's key, so nothing reruns and later plans are fast.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "data" / "study_v2"
pytestmark = pytest.mark.timeout(120)


def habitrun(folder: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=folder)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def keys(folder: Path) -> dict[str, set[str]]:
    con = sqlite3.connect(folder / "state" / "store" / "cache.db")
    try:
        out: dict[str, set[str]] = {}
        for stage, key in con.execute("SELECT stage, key FROM habitrun_record"):
            out.setdefault(stage, set()).add(key)
        return out
    finally:
        con.close()


@pytest.fixture
def study(tmp_path: Path) -> Path:
    folder = tmp_path / "moved-here"
    shutil.copytree(FIXTURE, folder)
    return folder


def test_a_store_of_the_previous_release_plans_all_done_and_run_reruns_nothing(study: Path) -> None:
    before = keys(study)
    assert sum(len(k) for k in before.values()) == 7
    plan = json.loads(habitrun(study, "plan", "recipe.yaml", "--json").stdout)
    assert plan["counts"]["done"] == 7 and plan["counts"]["stale"] == plan["counts"]["pending"] == 0
    assert keys(study) == before  # plan writes no record

    done = habitrun(study, "run", "recipe.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to run: 7 subject-stage(s) already stored as done" in done.stdout
    after = keys(study)
    assert {s: len(k) for s, k in after.items()} == {"load": 3, "scale": 3, "table": 1}
    assert after != before  # moved to today's keys, nothing added
    current = json.loads(habitrun(study, "plan", "recipe.yaml", "--json").stdout)
    assert current["counts"]["done"] == 7
    for stage in current["stages"]:
        assert {info["key"] for info in stage["subjects"].values()} == after[stage["name"]]


def test_after_the_upgrade_a_helper_edit_is_found_with_its_reason(study: Path) -> None:
    assert habitrun(study, "run", "recipe.yaml").returncode == 0
    util = study / "study_ops" / "util.py"
    util.write_text(util.read_text().replace("value * factor", "value * factor + 1"))
    plan = json.loads(habitrun(study, "plan", "recipe.yaml", "--json").stdout)
    by_stage = {s["name"]: s for s in plan["stages"]}
    assert by_stage["load"]["counts"]["stale"] == 3 and by_stage["scale"]["counts"]["stale"] == 3
    assert by_stage["load"]["subjects"]["s1"]["reasons"] == ["code: study_ops/util.py changed"]
    done = habitrun(study, "run", "recipe.yaml")
    assert "[scale] finished: 3 done, 0 cached" in done.stdout and "[table] finished: 1 done, 0 cached" in done.stdout


def test_a_failure_under_the_older_key_stays_a_failure_and_is_retried_on_request(study: Path) -> None:
    # the older release recorded load s2 as failed: it is not done (a downstream stage would read a
    # result that is not there), its dependants are blocked, and --retry-failed runs it
    con = sqlite3.connect(study / "state" / "store" / "cache.db")
    with con:
        con.execute("UPDATE habitrun_record SET ok = 0, error = 'ValueError: broken', kind = 'exception',"
                    " value = NULL WHERE stage = 'load' AND subject_id = 's2'")
    con.close()
    plan = json.loads(habitrun(study, "plan", "recipe.yaml", "--json").stdout)
    by_stage = {s["name"]: s for s in plan["stages"]}
    assert by_stage["load"]["subjects"]["s2"]["status"] == "failed"
    assert by_stage["load"]["counts"]["done"] == 2
    assert by_stage["scale"]["subjects"]["s2"]["status"] == "blocked"
    assert by_stage["scale"]["subjects"]["s2"]["reasons"] == ["upstream 'load' failed"]

    kept = habitrun(study, "run", "recipe.yaml")
    assert kept.returncode == 1, kept.stdout + kept.stderr
    assert "load s2: recorded failure: exception: ValueError: broken" in kept.stdout
    assert 'table: {"s1": 3, "s3": 9}' in kept.stdout

    retried = habitrun(study, "run", "recipe.yaml", "--retry-failed")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "[load] finished: 1 done, 2 cached, 0 failed" in retried.stdout
    assert 'table: {"s1": 3, "s2": 6, "s3": 9}' in retried.stdout
