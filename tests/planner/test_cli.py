"""`habitrun plan` and `habitrun status` as a user runs them: real processes, real runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.spec.loader import load_recipe
from habitrun.store.lock import default_lock_path
from habitrun.store.runs import RunFolder
from tests.planner.study import write_study


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


@pytest.fixture
def study(tmp_path: Path) -> Path:
    recipe = write_study(tmp_path)
    (tmp_path / "ops_a.py").write_text(
        "def load(subject, scale):\n"
        "    if subject.id == 'S2':\n"
        "        raise ValueError('S2 has no scan')\n"
        "    return scale * int(subject.fields['x'])\n"
    )
    return recipe


@pytest.mark.timeout(60)
def test_plan_before_any_run_creates_nothing(study: Path) -> None:
    done = habitrun("plan", cwd=study.parent)  # default ./recipe.yaml
    assert done.returncode == 0
    assert "no store yet" in done.stdout and "11 subject-stage(s) would run" in done.stdout
    data = json.loads(habitrun("plan", str(study), "--json", cwd=study.parent).stdout)
    assert data["store"] is None and [s["counts"]["pending"] for s in data["stages"]] == [5, 5, 1]
    assert not (study.parent / ".habitrun").exists()


@pytest.mark.timeout(60)
def test_bad_recipe_exits_2(study: Path) -> None:
    study.write_text(study.read_text().replace("needs: [a]", "needs: [nope]"))
    for command in ("plan", "status"):
        done = habitrun(command, str(study), cwd=study.parent)
        assert done.returncode == 2 and "nope" in done.stderr


@pytest.mark.timeout(120)
def test_status_and_plan_after_a_run_with_a_failure(study: Path) -> None:
    folder = study.parent
    none_yet = habitrun("status", str(study), cwd=folder)
    assert none_yet.returncode == 1 and "no run yet" in none_yet.stdout  # nothing finished to show

    run = habitrun("run", str(study), "--quiet", cwd=folder)
    assert run.returncode == 1, run.stdout + run.stderr

    status = habitrun("status", str(study), cwd=folder)
    assert status.returncode == 1  # the last run failed
    out = status.stdout
    assert out.splitlines()[0].endswith(": failed")  # the run's outcome
    assert "a S2: exception: ValueError: S2 has no scan" in out
    log_line = next(line for line in out.splitlines() if line.strip().startswith("log:"))
    log = Path(log_line.split("log:", 1)[1].strip())
    assert log.is_file() and "S2 has no scan" in log.read_text()

    data = json.loads(habitrun("status", str(study), "--json", cwd=folder).stdout)
    assert data["stages"]["a"]["failed"] == 1 and data["stages"]["b"]["blocked"] == 1
    assert data["failures"][0]["subject"] == "S2" and data["failures"][0]["log"] == str(log)
    run_dir = Path(data["run"]["path"])
    by_folder = json.loads(habitrun("status", str(run_dir), "--json", cwd=folder).stdout)
    assert by_folder["run"]["id"] == data["run"]["id"] and by_folder["failures"] == data["failures"]

    plan = habitrun("plan", str(study), "--reason", cwd=folder)
    assert plan.returncode == 0
    assert "recorded failure: exception: ValueError: S2 has no scan" in plan.stdout
    assert "upstream 'a' failed" in plan.stdout and "nothing to run" in plan.stdout

    stale = habitrun("plan", str(study), "stages.b.params.bins=3", "--reason", cwd=folder)
    assert "stale (params.bins: 8 → 3): 4" in stale.stdout and "S1, S3, S4, S5" in stale.stdout


HOLD = """
import sys, time
from pathlib import Path
from habitrun.store.lock import StoreLock
StoreLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
def test_status_tells_running_from_killed(study: Path) -> None:
    loaded = load_recipe(study)
    run = RunFolder.create(loaded.run_root(), resolved_yaml=loaded.resolved_yaml(), recipe_path=study, argv=["run"])
    run.write_provenance({"started_at": "2024-01-01T00:00:00+00:00"})
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(default_lock_path(loaded.store_dir()))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        running = habitrun("status", str(study), cwd=study.parent)
        assert f"running (pid {holder.pid}" in running.stdout
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        killed = habitrun("status", str(study), cwd=study.parent)
        assert "did not finish" in killed.stdout and "habitrun resume" in killed.stdout
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()
