"""A study survives what people do with it (issue 31): copied, moved, cloned, its data moved.

Through the real CLI: a study whose subjects are found on disk (``subjects.from``) runs once;
then `cp -a`, `mv`, a `git clone` of its repository plus a copy of its data and store, and a
data folder moved elsewhere with its one ``vars`` value changed (on the command line, then in
the file), each plan ``nothing to run``, and the operators still get the files' absolute paths.
A file outside the study and every declared root keeps its absolute path, and `plan` says which
stage depends on it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

OPS = '''
from pathlib import Path


def load(subject):
    path = Path(subject.fields["image"])
    assert path.is_absolute() and path.is_file(), path
    return {"value": len(path.read_text()), "path": str(path)}


def scale(subject, factor=2):
    stored = Path(subject.inputs["load"]["path"])  # a path stored by load, maybe before a move
    assert stored.is_absolute() and stored.is_file(), stored
    return subject.inputs["load"]["value"] * factor


def table(collection):
    return dict(sorted(collection.items()))
'''

RECIPE = """\
habitrun: 1
name: relocatable
{head}subjects:
  from: "{template}"
  pivot: kind
  required: [image]
policy: {{backend: serial, subject_timeout_sec: null}}
stages:
  - {{name: load, operator: "ops:load"}}
  - {{name: scale, operator: "ops:scale", needs: [load], params: {{factor: 3}}}}
  - {{name: table, kind: collect, operator: "ops:table", needs: [scale]}}
"""


def habitrun(folder: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=folder)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def study(folder: Path, data: Path, *, head: str = "", template: str = "data/{subject}/{kind}.txt") -> Path:
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "recipe.yaml").write_text(RECIPE.format(head=head, template=template))
    for sid in ("S1", "S2", "S3"):
        (data / sid).mkdir(parents=True)
        (data / sid / "image.txt").write_text(f"image of {sid}\n")
    done = habitrun(folder, "run", "recipe.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def nothing_to_run(folder: Path, *args: str) -> None:
    done = habitrun(folder, "plan", "recipe.yaml", *args, "--reason")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to run: every stage is done" in done.stdout, done.stdout
    assert "outside the study" not in done.stdout  # every file under the study or a data root


def test_a_copy_a_move_and_a_clone_plan_nothing_to_run(tmp_path: Path) -> None:
    origin = study(tmp_path / "origin", tmp_path / "origin" / "data")
    table = next((origin / ".habitrun" / "runs").iterdir()) / "subjects.csv"
    assert str(tmp_path) not in table.read_text() and "data/S1/image.txt" in table.read_text()

    copied = tmp_path / "copied"
    subprocess.run(["cp", "-a", str(origin), str(copied)], check=True, timeout=60)
    nothing_to_run(copied)

    moved = tmp_path / "moved"
    os.rename(copied, moved)
    nothing_to_run(moved)
    # what runs there reads the moved files (a new subject, by its absolute path there)
    (moved / "data" / "S4").mkdir()
    (moved / "data" / "S4" / "image.txt").write_text("image of S4\n")
    again = habitrun(moved, "run", "recipe.yaml")
    assert again.returncode == 0 and "[load] finished: 1 done, 3 cached" in again.stdout, again.stdout

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    (origin / ".gitignore").write_text(".habitrun/\ndata/\n__pycache__/\n")
    subprocess.run([*git, "init", "-q"], cwd=origin, check=True, timeout=60)
    subprocess.run([*git, "add", "-A"], cwd=origin, check=True, timeout=60)
    subprocess.run([*git, "commit", "-qm", "study"], cwd=origin, check=True, timeout=60)
    clone = tmp_path / "colleague" / "clone"
    subprocess.run([*git, "clone", "-q", str(origin), str(clone)], check=True, timeout=60)
    for part in ("data", ".habitrun"):
        subprocess.run(["cp", "-a", str(origin / part), str(clone / part)], check=True, timeout=60)
    nothing_to_run(clone)


def test_a_moved_data_root_with_its_vars_value_changed_plans_nothing_to_run(tmp_path: Path) -> None:
    data = tmp_path / "scanner" / "export"
    folder = study(tmp_path / "study", data, head=f"vars: {{data: {data}}}\n",
                   template="${vars.data}/{subject}/{kind}.txt")
    plan = json.loads(habitrun(folder, "plan", "recipe.yaml", "--json").stdout)
    assert plan["counts"]["done"] == 7

    elsewhere = tmp_path / "archive" / "2026"
    elsewhere.parent.mkdir()
    os.rename(data, elsewhere)
    nothing_to_run(folder, f"vars.data={elsewhere}")  # on the command line
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(data), str(elsewhere)))
    nothing_to_run(folder)  # in the file
    subjects = next((folder / ".habitrun" / "runs").iterdir()) / "subjects.csv"
    assert "${vars.data}/S1/image.txt" in subjects.read_text()

    # results name files under the data root relative to it: scale, rerun, reads load's stored
    # paths (written before the move) at the data's new place
    con = sqlite3.connect(folder / ".habitrun" / "store" / "cache.db")
    try:
        values = [bytes(v) for (v,) in con.execute("SELECT value FROM habitrun_record WHERE value IS NOT NULL")]
    finally:
        con.close()
    assert values and not any(str(data).encode() in v or str(elsewhere).encode() in v for v in values)
    table = subprocess.run([sys.executable, "-c", "import sys, habitrun; t = habitrun.results(sys.argv[1], 'load', "
                            "manifest=True); print(t['path']['S1']); print(t['image']['S1'])", str(folder / "recipe.yaml")],
                           capture_output=True, text=True, timeout=60)
    assert table.stdout.split() == [str(elsewhere / "S1" / "image.txt")] * 2, table.stdout + table.stderr
    rerun = habitrun(folder, "run", "recipe.yaml", "stages.scale.params.factor=4")
    assert rerun.returncode == 0 and "[scale] finished: 3 done, 0 cached" in rerun.stdout, rerun.stdout + rerun.stderr

    # the study copied elsewhere, the data where the recipe says: nothing to run either
    shutil.copytree(folder, tmp_path / "copy", symlinks=True)
    nothing_to_run(tmp_path / "copy")


def test_files_outside_every_root_stay_absolute_and_plan_names_their_stages(tmp_path: Path) -> None:
    data = tmp_path / "elsewhere"
    folder = study(tmp_path / "study", data, template=f"{data}/{{subject}}/{{kind}}.txt")
    plan = habitrun(folder, "plan", "recipe.yaml")
    assert "nothing to run" in plan.stdout
    assert "load: 3 input file(s) outside the study and its data roots" in plan.stdout, plan.stdout
    assert str(data / "S1" / "image.txt") in plan.stdout.replace("\n", "")
    assert "scale: 3 input file(s) outside" in plan.stdout  # its keys cover the subjects' files too
    assert "table: " not in plan.stdout
    subjects = next((folder / ".habitrun" / "runs").iterdir()) / "subjects.csv"
    assert str(data / "S1" / "image.txt") in subjects.read_text()
    data_json = json.loads(habitrun(folder, "plan", "recipe.yaml", "--json").stdout)
    files = [str(data / sid / "image.txt") for sid in ("S1", "S2", "S3")]
    assert data_json["outside_inputs"] == {"load": files, "scale": files}


def test_a_reason_many_subjects_share_is_one_short_line(tmp_path: Path) -> None:
    folder = study(tmp_path / "study", tmp_path / "study" / "data")
    for sid in ("S1", "S2", "S3"):
        (folder / "data" / sid / "image.txt").write_text(f"new image of {sid}\n")
    plan = habitrun(folder, "plan", "recipe.yaml", "--reason")
    lines = plan.stdout.splitlines()
    assert "  stale (image: data/{subject}/image.txt content changed): 3" in lines, plan.stdout
    assert "    S1, S2, S3" in lines
    reasons = lines[lines.index("load"):]
    assert not any(str(tmp_path) in line for line in reasons) and max(map(len, reasons)) < 100, plan.stdout
