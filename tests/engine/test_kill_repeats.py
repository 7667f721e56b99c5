"""SIGKILLs of the runner mid-stage repeat at most the subjects its workers were running (issue 29, item 5).

What the runner received and had not committed yet is in its journal, and a
worker holds back no finished long subject's reply: `resume` runs again only
what the kill cut short, one subject per worker.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from tests.engine.study import habitrun_cmd, make_study, markers, run_cli
from tests.engine.test_lost_commits import kill_after

WORKERS = 2
SUBJECTS = 400
KILLS = 5


def executions(folder: Path) -> dict[str, int]:
    """square's subjects -> how many times each started."""
    return {key: sum(1 for what, *_ in entries if what == "start")
            for key, entries in markers(folder).items() if key.startswith("square-")}


def repeats(folder: Path) -> int:
    return sum(n - 1 for n in executions(folder).values())


def runs(folder: Path) -> set[Path]:
    return set((folder / ".habitrun" / "runs").glob("*/provenance.json"))


def kill_mid_stage(folder: Path, proc: subprocess.Popen[str], delay: float) -> None:
    """SIGKILL the runner ``delay`` seconds after its run began (its run folder appeared): polled cheaply,
    so the test does not compete with the runner for the CPU."""
    known = runs(folder)
    deadline = time.monotonic() + 60
    while not runs(folder) - known and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    kill_after(folder, proc, 0)


def start(recipe: Path, command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(habitrun_cmd(command, str(recipe), "-q"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.timeout(300)
def test_each_kill_repeats_at_most_one_subject_per_worker(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=SUBJECTS, square_params={"sleep": 0.04},
                        policy={"workers": WORKERS})
    study = recipe.parent
    rng = random.Random(29)
    per_kill: list[int] = []
    before = 0
    for attempt in range(KILLS):
        proc = start(recipe, "run" if attempt == 0 else "resume")
        kill_mid_stage(study, proc, rng.uniform(0.5, 1.5))  # the stage takes 8 s: the kill lands in it
        if attempt:
            per_kill.append(repeats(study) - before)  # what this run repeated of the last kill's
        before = repeats(study)
    final = run_cli("resume", str(recipe), "-q", timeout=240)
    assert final.returncode == 0, final.stdout + final.stderr
    per_kill.append(repeats(study) - before)
    ran = executions(study)
    assert len(ran) == SUBJECTS and all(ran.values())
    assert statistics.median(per_kill) <= WORKERS, f"repeats per kill: {per_kill}"
