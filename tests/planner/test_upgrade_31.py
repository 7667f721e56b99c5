"""A store written before issue 31 (data/study_v3, by main e97702d) plans as done with today's keys.

Its keys took the code by ``ast.dump`` (which differs between Pythons) and a found subject's
files by absolute path; today's take our own walk of the syntax tree and paths relative to the
study or to a declared data root. `plan` finds each result under the key the older release
gave the same inputs (at the place it was written: the fixture must sit at its own absolute
path) and counts it done; `run` moves them to today's keys, and from then on the study can be
copied or moved with nothing to rerun.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "data" / "study_v3"
PLACE = Path("/tmp/habitrun-issue31-fixture")  # where main wrote it: its absolute paths are in its keys
pytestmark = pytest.mark.timeout(120)


def habitrun(folder: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=folder)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def keys(store: Path) -> dict[str, set[str]]:
    con = sqlite3.connect(store / "cache.db")
    try:
        out: dict[str, set[str]] = {}
        for stage, key in con.execute("SELECT stage, key FROM habitrun_record"):
            out.setdefault(stage, set()).add(key)
        return out
    finally:
        con.close()


@pytest.fixture
def placed() -> Iterator[Path]:
    """The fixture at its own place, one test at a time (the place is fixed), removed after."""
    with open("/tmp/habitrun-issue31-fixture.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(PLACE, ignore_errors=True)
        shutil.copytree(FIXTURE, PLACE, symlinks=True)
        try:
            yield PLACE / "study"
        finally:
            shutil.rmtree(PLACE, ignore_errors=True)


# The fixture's code digests are e97702d's ``ast.dump`` on Python 3.11, which 3.12 and 3.13 dump
# differently (what this issue fixed): there the older release itself would have rerun everything, and
# no key of it can be rebuilt, so the upgrade is checked where the fixture was made (and on 3.10, which
# dumps the same).
@pytest.mark.skipif(sys.version_info[:2] >= (3, 12),
                    reason="the fixture's ast.dump code digests were made on Python 3.11; 3.12+ dump differently")
@pytest.mark.parametrize(("recipe", "store", "count"), [("recipe.yaml", ".habitrun/store", 7),
                                                         ("inside.yaml", ".habitrun-inside/store", 5)])
def test_the_older_store_plans_done_runs_nothing_and_then_survives_a_copy(
        placed: Path, tmp_path: Path, recipe: str, store: str, count: int) -> None:
    before = keys(placed / store)
    assert sum(map(len, before.values())) == count
    plan = json.loads(habitrun(placed, "plan", recipe, "--json").stdout)
    assert plan["counts"]["done"] == count and plan["counts"]["stale"] == plan["counts"]["pending"] == 0
    assert keys(placed / store) == before  # plan writes no record

    done = habitrun(placed, "run", recipe)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"nothing to run: {count} subject-stage(s) already stored as done" in done.stdout
    after = keys(placed / store)
    assert after != before and {s: len(k) for s, k in after.items()} == {s: len(k) for s, k in before.items()}
    assert "nothing to run" in habitrun(placed, "plan", recipe).stdout

    copy = tmp_path / "copied"
    shutil.copytree(placed, copy, symlinks=True)
    moved = habitrun(copy, "plan", recipe, "--json")
    assert json.loads(moved.stdout)["counts"]["done"] == count, moved.stdout
