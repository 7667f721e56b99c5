"""A class operator whose constructor raises is one stage error, not one failure per subject.

Typed as a user would (``habitrun run`` in a subprocess), in each way a stage's
subjects can run: the run stops at the first worker that cannot construct the
class, with one line naming the stage and the exception (exit 2, the run's
outcome ``error``); the stage's subjects are not run and none is recorded as
failed, so fixing the cause and resuming runs them all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

OPS = '''
import os

def measure(subject):
    return 1

class Model:
    def __init__(self, bins=8):
        if not os.path.exists(os.path.join(os.path.dirname(__file__), "fixed")):
            raise ImportError("No module named 'nibabel'")
        self.bins = bins

    def __call__(self, subject):
        return self.bins
'''

RECIPE = """\
habitrun: 1
name: ctor
subjects: {{manifest: subjects.csv}}
policy: {{{policy}}}
stages:
  - name: a
    operator: ops:measure
  - name: b
    operator: ops:Model
    needs: [a]
  - name: c
    operator: ops:measure
    needs: [b]
"""

POLICIES = {
    "persistent": "backend: process, workers: 2, parallel_mode: persistent",
    "isolated": "backend: process, workers: 2, parallel_mode: isolated",
    "serial": "backend: serial, subject_timeout_sec: null",
    "dask": "backend: dask, workers: 2",
}


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=90, cwd=cwd)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.dask) if m == "dask" else m
                                  for m in sorted(POLICIES)])
def test_a_constructor_that_raises_stops_the_run_with_one_line_for_the_stage(tmp_path: Path, mode: str) -> None:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i}\n" for i in range(1, 9)))
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(policy=POLICIES[mode]))

    done = habitrun("run", "recipe.yaml", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    errors = [line for line in out.splitlines() if "nibabel" in line]
    assert errors == ["error: stage 'b': cannot construct its operator ops:Model: ImportError: No module named "
                      "'nibabel'; the run stopped, its subjects were not run and none was recorded as failed"], out
    assert "failed (exception)" not in out and "[c]" not in out  # no subject's failure, no later stage

    status = json.loads(habitrun("status", "recipe.yaml", "--json", cwd=tmp_path).stdout)
    assert status["run"]["outcome"] == "error"
    assert status["failures"] == []
    assert status["stages"]["a"]["done"] == 8
    assert (status["stages"]["b"]["pending"], status["stages"]["b"]["failed"]) == (8, 0)  # not charged

    (tmp_path / "fixed").touch()  # the missing dependency installed: a resume runs every subject
    resumed = habitrun("resume", "recipe.yaml", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    status = json.loads(habitrun("status", "recipe.yaml", "--json", cwd=tmp_path).stdout)
    assert [status["stages"][s]["done"] for s in "abc"] == [8, 8, 8]
