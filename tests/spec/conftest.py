"""A small valid study in a temporary folder, and the real CLI as a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BASE = textwrap.dedent(
    """\
    habitrun: 1
    name: t
    vars: {bins: 8}
    subjects:
      manifest: subjects.csv
      id: subject_id
    policy:
      workers: 2
      subject_timeout_sec: 60
    stages:
      - name: prep
        operator: ops:prep
      - name: feat
        operator: ops:feat
        needs: [prep]
        params: {bins: "${vars.bins}"}
      - name: table
        kind: collect
        operator: ops:table
        needs: [feat]
    """
)
"""The valid recipe every bad case mutates; line numbers in the tests refer to it."""

OPS = textwrap.dedent(
    """\
    CONSTANT = 3


    def prep(subject):
        return {"id": subject.id}


    def feat(subject, bins=4):
        return {"bins": bins}


    def table(results):
        return len(results)
    """
)

FILES = {
    "subjects.csv": "subject_id,age\nS1,40\nS2,50\nS3,60\n",
    "padded.csv": "subject_id,age\n1,40\n002,50\n003,60\n",
    "dup.csv": "subject_id,age\nS1,40\nS2,50\nS1,60\n",
    "empty.csv": "subject_id,age\n",
    "ops.py": OPS,
    "broken.py": "raise RuntimeError('import-time failure')\n",
    # an integer id of 5000 digits (Python converts at most 4300) on the third subject's line
    "long.json": '[\n  {"subject_id": "S1"},\n  {"subject_id": 2},\n  {"subject_id": ' + "7" * 5000 + '}\n]\n',
    "long.jsonl": '{"subject_id": "S1"}\n\n{"subject_id": ' + "7" * 5000 + '}\n',
    "long.yaml": "- subject_id: S1\n- subject_id: " + "7" * 5000 + "\n",
}


def make_study(folder: Path, recipe: str = BASE) -> Path:
    """Write the study files and ``recipe``; return the recipe's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (folder / name).write_text(text)
    path = folder / "recipe.yaml"
    path.write_text(recipe)
    return path


@pytest.fixture
def study(tmp_path: Path) -> Path:
    return make_study(tmp_path / "study")


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m habitrun.cli.app ARGS`` as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "habitrun.cli.app", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )
