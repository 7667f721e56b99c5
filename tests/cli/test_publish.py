"""``publish:``: a stage's current result files copied (or linked) into the study under stable names, with an
index; a rerun of one subject rewrites that subject's file only; stale files removed; a bad value exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OPS = '''
from pathlib import Path

def convert(subject, factor=1):
    out = subject.workdir / "image.txt"
    out.write_text(f"{subject.id} {subject.fields['value']} x{factor}\\n")
    (subject.workdir / "scratch.tmp").write_text("not named by the result")
    return {"image": out, "mask": str(subject.workdir / "image.txt"), "n": int(subject.fields["value"])}

def table(results):
    import pandas as pd
    return pd.DataFrame([{"subject_id": sid, "n": results[sid]["n"]} for sid in sorted(results)])
'''

RECIPE = """\
habitrun: 1
name: pub
subjects: {{manifest: subjects.csv}}
policy: {{workers: 2}}
stages:
  - {{name: convert, operator: "ops:convert", publish: {publish}}}
  - {{name: table, kind: collect, operator: "ops:table", needs: [convert], publish: true}}
"""


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "400"})
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def study(tmp_path: Path, publish: str = "true") -> Path:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id,value\nS1,1\nS2,2\nS3,3\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(publish=publish))
    return tmp_path


@pytest.mark.timeout(120)
def test_published_files_track_the_current_results(tmp_path):
    pytest.importorskip("pandas", reason="the collect stage returns a DataFrame (the 'tables' extra)")
    root = study(tmp_path)
    run = habitrun("run", "recipe.yaml", cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    out = root / "results" / "convert"
    assert "published 3 file(s) to results/convert/ (3 written)" in run.stdout
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "S1/image.txt", "S2/image.txt", "S3/image.txt", "index.json"]  # one file, named twice; no scratch file
    assert (out / "S2" / "image.txt").read_text() == "S2 2 x1\n"
    index = json.loads((out / "index.json").read_text())
    entry = index["files"]["S2/image.txt"]
    assert entry["subject"] == "S2" and entry["run"] and len(entry["key"]) > 8
    import hashlib
    assert entry["sha256"] == hashlib.sha256(b"S2 2 x1\n").hexdigest()
    table = (root / "results" / "table" / "table.csv").read_text().splitlines()
    assert table == ["subject_id,n", "S1,1", "S2,2", "S3,3"]
    before = {p.name + p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/image.txt")}

    # One subject's input changes: only its file is written again; the table follows.
    (root / "subjects.csv").write_text("subject_id,value\nS1,1\nS2,20\nS3,3\n")
    again = habitrun("run", "recipe.yaml", cwd=root)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "published 3 file(s) to results/convert/ (1 written)" in again.stdout
    after = {p.name + p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/image.txt")}
    assert after["image.txtS1"] == before["image.txtS1"] and after["image.txtS3"] == before["image.txtS3"]
    assert after["image.txtS2"] != before["image.txtS2"]
    assert (out / "S2" / "image.txt").read_text() == "S2 20 x1\n"
    assert (root / "results" / "table" / "table.csv").read_text().splitlines()[2] == "S2,20"

    # A subject removed from the manifest: its published file goes; a file the index does not list stays.
    (out / "notes.txt").write_text("mine")
    (root / "subjects.csv").write_text("subject_id,value\nS1,1\nS2,20\n")
    third = habitrun("run", "recipe.yaml", cwd=root)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "published 2 file(s) to results/convert/ (0 written, 1 removed)" in third.stdout
    assert not (out / "S3").exists() and (out / "notes.txt").read_text() == "mine"
    assert sorted(json.loads((out / "index.json").read_text())["files"]) == ["S1/image.txt", "S2/image.txt"]

    # Nothing to run: nothing is published again, nothing changes.
    quiet = habitrun("run", "recipe.yaml", cwd=root)
    assert quiet.returncode == 0 and "published" not in quiet.stdout


@pytest.mark.timeout(120)
def test_link_mode_hard_links_the_stored_file_into_a_folder_of_ones_choice(tmp_path):
    pytest.importorskip("pandas", reason="the collect stage returns a DataFrame (the 'tables' extra)")
    root = study(tmp_path, publish="{to: \"derivatives/{stage}-files\", mode: link}")
    run = habitrun("run", "recipe.yaml", cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    published = root / "derivatives" / "convert-files" / "S1" / "image.txt"
    stored = next((root / ".habitrun" / "work" / "convert" / "S1").glob("*/image.txt"))
    assert published.stat().st_ino == stored.stat().st_ino


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("value", "message"), [
    ("{to: 'out/{subject}'}", "may hold only the placeholder {stage}"),
    ("{mode: move}", "stages[0].publish.mode"),
    ("3", "stages[0].publish"),
])
def test_a_bad_publish_value_is_exit_2_at_its_line(tmp_path, value, message):
    root = study(tmp_path, publish=value)
    done = habitrun("validate", "recipe.yaml", cwd=root)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout + done.stderr


@pytest.mark.timeout(120)
def test_a_folder_that_cannot_be_written_is_a_warning_and_the_results_stay_stored(tmp_path):
    root = study(tmp_path, publish="{to: \"blocked/{stage}\"}")
    (root / "blocked").write_text("a file where the folder should be")
    (root / "recipe.yaml").write_text((root / "recipe.yaml").read_text().replace(
        "  - {name: table, kind: collect, operator: \"ops:table\", needs: [convert], publish: true}\n", ""))
    run = habitrun("run", "recipe.yaml", cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stage 'convert': could not publish into" in run.stdout
    plan = habitrun("plan", "recipe.yaml", cwd=root)
    assert "nothing to run" in plan.stdout, plan.stdout
