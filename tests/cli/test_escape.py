"""User text that looks like rich markup is printed literally by every command, never a MarkupError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.store.runs import list_runs

MARKUP = ("[/x]", "[bold red]x", "[link=file:///etc]x")

OPS = '''
def load(subject, where):
    if subject.id == "S[columns]":
        raise KeyError("None of [Index(['a', 'b'])] are in the [columns]")
    if subject.id != "ok":
        raise FileNotFoundError(f"no image for [{where}/{subject.id}/ct.nii]")
    return 1
'''

RECIPE = """\
habitrun: 1
name: "study [/x] [bold red]y"
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: a, operator: "ops:load", params: {where: "[/data]"}}
"""


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "MarkupError" not in out, out
    return done


def write_study(folder: Path, ids: list[str], recipe: str = RECIPE) -> Path:
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"{sid}\n" for sid in ids))
    (folder / "recipe.yaml").write_text(recipe)
    return folder / "recipe.yaml"


@pytest.mark.timeout(120)
def test_markup_in_ids_names_and_errors_is_printed_literally(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, ["ok", *MARKUP, "S[columns]"])
    validate = habitrun("validate", str(recipe), cwd=tmp_path)
    assert validate.returncode == 0, validate.stderr
    assert "study [/x] [bold red]y" in validate.stdout

    plan = habitrun("plan", str(recipe), "--reason", "--limit", "0", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "study [/x] [bold red]y" in plan.stdout
    assert all(sid in plan.stdout for sid in MARKUP) and "S[columns]" in plan.stdout

    run = habitrun("run", str(recipe), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    for sid in MARKUP:
        assert f"no image for [[/data]/{sid}/ct.nii]" in run.stdout
        assert f"a {sid}: " in run.stdout  # the summary's failure line
    assert "are in the [columns]" in run.stdout and "None of [Index(['a', 'b'])]" in run.stdout

    status = habitrun("status", str(recipe), cwd=tmp_path)
    assert status.returncode == 1, status.stderr  # the last run failed
    for sid in MARKUP:
        assert f"a {sid}: exception: FileNotFoundError: no image for [[/data]/{sid}/ct.nii]" in status.stdout
    assert "are in the [columns]" in status.stdout

    replan = habitrun("plan", str(recipe), "--reason", cwd=tmp_path)
    assert replan.returncode == 0, replan.stdout + replan.stderr
    # the failures that differ only by their subject's id are one reason, the ids listed below it
    assert "no image for [[/data]/{subject}/ct.nii]" in replan.stdout and "[/x]" in replan.stdout

    resume = habitrun("resume", str(recipe), cwd=tmp_path)
    assert resume.returncode == 1 and "S[columns]: recorded failure" in resume.stdout, resume.stdout + resume.stderr
    recipe.write_text(RECIPE.replace("name: a,", "name: '[/x]',"))  # the file no longer loads: the note quotes it
    broken = habitrun("resume", str(recipe), cwd=tmp_path)
    assert broken.returncode == 2 and "got '[/x]'" in broken.stderr, broken.stderr
    run_folder = list_runs(tmp_path / ".habitrun")[-1].path  # the newest (two runs can share a second)
    noted = habitrun("resume", str(run_folder), cwd=tmp_path)
    assert noted.returncode == 1, noted.stdout + noted.stderr
    assert "got '[/x]'" in noted.stdout.split("resuming with the stored recipe", 1)[1], noted.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sid", MARKUP)
def test_duplicate_markup_id_gives_the_duplicate_id_message(tmp_path: Path, sid: str) -> None:
    recipe = write_study(tmp_path, [sid, "ok", sid])
    for command in ("validate", "plan", "run"):  # status reads no manifest before the first run
        done = habitrun(command, str(recipe), cwd=tmp_path)
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert f"duplicate subject id {sid!r}" in done.stderr, (command, done.stderr)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", MARKUP)
def test_markup_in_a_stage_name_is_reported_literally(tmp_path: Path, name: str) -> None:
    recipe = write_study(tmp_path, ["ok"], RECIPE.replace("name: a,", f"name: {name!r},"))
    for command in ("validate", "plan", "run", "status"):
        done = habitrun(command, str(recipe), cwd=tmp_path)
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert name in done.stderr, (command, done.stderr)


@pytest.mark.timeout(60)
def test_version(tmp_path: Path) -> None:
    from habitrun import __version__

    done = habitrun("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"habitrun {__version__}"
