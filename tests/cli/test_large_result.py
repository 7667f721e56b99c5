"""A result over LARGE_RESULT_MB is stored, and warned about once per stage, on the console and in the events,
pointing the operator at a file in its work folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.engine.recorder import LARGE_RESULT_MB

OPS = '''
def make(subject):
    return b"x" * (20 << 20) if subject.id != "S3" else b"small"

def grow(subject):
    return b"y" * (12 << 20) if subject.id == "S3" else len(subject.inputs["make"])
'''

RECIPE = """\
habitrun: 1
name: large
subjects: {manifest: subjects.csv}
policy: {workers: 2}
stages:
  - {name: make, operator: "ops:make"}
  - {name: grow, operator: "ops:grow", needs: [make]}
"""


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "400"})
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("quiet", [False, True])
def test_a_20_mb_result_is_stored_and_warned_about_once_per_stage(tmp_path, quiet):
    assert LARGE_RESULT_MB < 12
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id\nS1\nS2\nS3\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    run = habitrun("run", "recipe.yaml", *(["-q"] if quiet else []), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    warnings = [line for line in run.stdout.splitlines() if line.startswith("warning: stage ")]
    assert len(warnings) == 2, run.stdout  # two subjects of make over the limit, one of grow: one line each
    grow, make = sorted(warnings)
    assert "stage grow: the result of subject S3 is 12 MB pickled" in grow
    assert "stage make: the result of subject S" in make and "is 20 MB pickled" in make
    assert f"(over {LARGE_RESULT_MB} MB)" in make
    assert "subject's work folder (subject.workdir) and return its path instead" in make

    events = [json.loads(line) for path in (tmp_path / ".habitrun" / "runs").glob("*/events.jsonl")
              for line in path.read_text().splitlines()]
    large = [e for e in events if e["event"] == "large_result"]
    assert sorted(e["stage"] for e in large) == ["grow", "make"]
    assert all(e["limit_mb"] == LARGE_RESULT_MB and e["size_mb"] >= 12 for e in large)

    results = habitrun("results", "recipe.yaml", "grow", "-o", "grow.jsonl", cwd=tmp_path)
    assert results.returncode == 0, results.stdout + results.stderr  # stored, all of it
