"""A large stored result (a file diskcache keeps beside the database) damaged or deleted after its run:
`resume` recomputes it as `run` does, and says so, instead of taking its record as finished work."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from tests.engine.study import run_cli

SIZE = 40_000  # over diskcache's 32 KB: each result is a file of its own

OPS = textwrap.dedent('''
    import os


    def big(subject, marker_dir, size):
        with open(os.path.join(marker_dir, subject.id), "a") as fh:
            fh.write("run\\n")
        return subject.id + "x" * size


    def length(subject):
        return len(subject.input("big"))
''')


def make_study(folder: Path) -> Path:
    folder.mkdir()
    (folder / "markers").mkdir()
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i}\n" for i in range(6)))
    recipe = {
        "habitrun": 1, "name": "spilled", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60},
        "stages": [
            {"name": "big", "operator": "ops:big", "params": {"marker_dir": str(folder / "markers"), "size": SIZE}},
            {"name": "length", "operator": "ops:length", "needs": ["big"]},
        ],
    }
    (folder / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
    return folder / "recipe.yaml"


def spilled_file(study: Path, subject: str) -> Path:
    """The file holding ``subject``'s result of stage big (found by its content)."""
    needle = (subject + "xxxx").encode()
    found = [f for f in (study / ".habitrun" / "store").rglob("*.val") if needle in f.read_bytes()]
    assert len(found) == 1, found
    return found[0]


def runs_of(study: Path, subject: str) -> int:
    return len((study / "markers" / subject).read_text().splitlines())


@pytest.mark.timeout(120)
def test_resume_recomputes_a_damaged_and_a_deleted_spilled_result_and_says_so(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study")
    study = recipe.parent
    first = run_cli("run", "recipe.yaml", "-q", cwd=study)
    assert first.returncode == 0, first.stdout + first.stderr

    flipped = spilled_file(study, "S1")
    data = bytearray(flipped.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF  # bits flipped in place: same size
    flipped.write_bytes(bytes(data))
    later = time.time() + 5  # a change after the result was stored, without waiting a second
    os.utime(flipped, (later, later))
    spilled_file(study, "S4").unlink()

    plan = run_cli("plan", "recipe.yaml", "--json", cwd=study)
    big = json.loads(plan.stdout)["stages"][0]
    assert big["counts"]["stale"] == 2 and big["to_run"] == 2, plan.stdout + plan.stderr
    status = run_cli("status", "recipe.yaml", cwd=study)
    assert "2 stored result(s) unreadable" in status.stdout, status.stdout + status.stderr

    resumed = run_cli("resume", "recipe.yaml", "-q", cwd=study)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert "nothing to run" not in out, out
    said = " ".join(out.split())
    assert "stage 'big': the stored result of 2 subject(s) is unreadable" in said, out
    assert "S1, S4; recomputing" in said, out
    assert [runs_of(study, f"S{i}") for i in range(6)] == [1, 2, 1, 1, 2, 1]  # those two, once more each

    after = run_cli("status", "recipe.yaml", "--json", cwd=study)
    shown = json.loads(after.stdout)
    assert after.returncode == 0 and shown["unreadable"] == [], after.stdout + after.stderr
    assert shown["stages"]["big"]["done"] == 6 and shown["stages"]["length"]["done"] == 6
    again = run_cli("resume", "recipe.yaml", "-q", cwd=study)
    assert again.returncode == 0 and "nothing to run" in again.stdout, again.stdout + again.stderr
