"""Operators are checked in a child process before any subject runs (validate, run, resume).

Each case is typed as a user would (``habitrun ...`` in a subprocess) and the
message is checked: the recipe position, what is wrong, a close match.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from habitrun.spec._opcheck_child import warm_modules

OPS = '''
import os, sys, time
MODE = os.environ.get("OPS_MODE", "")
if MODE == "exit3":
    sys.exit(3)
if MODE == "exit0":
    os._exit(0)
if MODE == "hang":
    with open(os.environ["PID_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(60)
print("importing ops prints this")

def measure(subject, offset, scale=1.0):
    return offset * scale

class Model:
    def __init__(self, bins=8, **options):
        self.bins = bins

    def __call__(self, subject):
        return self.bins
'''

RECIPE = """\
habitrun: 1
name: check
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - name: a
    operator: ops:measure
    params: {offset: 1.0}
  - name: b
    operator: ops:Model
    params: {anything: 1}
    needs: [a]
"""


def habitrun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env={**os.environ, **(env or {})})
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


@pytest.fixture
def study(tmp_path: Path) -> Path:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id\nS1\nS2\nS3\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    return tmp_path / "recipe.yaml"


def runs(recipe: Path) -> list[Path]:
    folder = recipe.parent / ".habitrun" / "runs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.timeout(60)
def test_run_with_a_mistyped_module_stops_before_any_subject(study: Path) -> None:
    study.write_text(RECIPE.replace("ops:measure", "study_ops.mesure:measure"))
    for command in ("validate", "run"):
        done = habitrun(command, str(study), cwd=study.parent)
        assert done.returncode == 2, done.stdout + done.stderr
        assert ("recipe.yaml:7:15: stages[0].operator: stage 'a': operator 'study_ops.mesure:measure': "
                "no module named 'study_ops'") in done.stderr
        assert "S1" not in done.stdout + done.stderr  # no subject ran, none is listed
    assert runs(study) == []  # no run folder: the check comes before it


@pytest.mark.timeout(60)
def test_resume_checks_the_operators_of_the_recipe_it_replays(study: Path) -> None:
    first = habitrun("run", str(study), "--quiet", cwd=study.parent)
    assert first.returncode == 0, first.stdout + first.stderr
    (study.parent / "ops.py").write_text(OPS.replace("def measure(", "def measure_renamed("))
    done = habitrun("resume", str(study), cwd=study.parent)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "stage 'a': operator 'ops:measure': module 'ops' has no attribute 'measure'" in done.stderr
    assert len(runs(study)) == 1


@pytest.mark.timeout(60)
def test_params_are_checked_against_the_signature(study: Path) -> None:
    study.write_text(RECIPE.replace("params: {offset: 1.0}", 'params: {ofset: 1.0, "[bold]x": 2}'))
    done = habitrun("validate", str(study), cwd=study.parent)
    assert done.returncode == 2
    err = done.stderr
    assert ("recipe.yaml:8:14: stages[0].params.ofset: stage 'a': operator 'ops:measure' has no parameter "
            "'ofset'; did you mean 'offset'?") in err
    assert "has no parameter '[bold]x'; it takes 'offset', 'scale'" in err  # markup-like text, printed as is
    assert "recipe.yaml:8:5: stages[0].params: stage 'a': operator 'ops:measure' needs parameter 'offset'" in err
    assert "stage 'b'" not in err  # a class whose __init__ takes **options accepts any name

    run = habitrun("run", str(study), cwd=study.parent)
    assert run.returncode == 2 and "did you mean 'offset'?" in run.stderr and runs(study) == []

    # an override is named as the place the param came from
    study.write_text(RECIPE)
    done = habitrun("validate", str(study), "stages.a.params.scal=2", cwd=study.parent)
    assert done.returncode == 2
    assert "override 'stages.a.params.scal=2'" in done.stderr and "did you mean 'scale'?" in done.stderr


@pytest.mark.timeout(60)
def test_an_import_time_syntax_error_names_its_file_and_line(study: Path) -> None:
    (study.parent / "ops.py").write_text(OPS + "\ndef broken(:\n    pass\n")
    done = habitrun("run", str(study), cwd=study.parent)
    assert done.returncode == 2
    line = len(OPS.splitlines()) + 2
    assert f"importing 'ops' raised SyntaxError: invalid syntax at {study.parent / 'ops.py'}:{line}:" in done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode, says", [
    ("exit3", "importing it called sys.exit(3)"),
    ("exit0", "importing it ended the process (exit code 0)"),
    ("hang", "importing it did not finish within 1 s (policy.subject_spawn_timeout_sec)"),
])
def test_any_end_of_the_importing_child_is_the_operators_error(study: Path, mode: str, says: str) -> None:
    started = time.monotonic()
    for command in ("validate", "run"):
        done = habitrun(command, str(study), "policy.subject_spawn_timeout_sec=1", cwd=study.parent,
                        env={"OPS_MODE": mode, "PID_FILE": str(study.parent / "pids")})
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"recipe.yaml:7:15: stages[0].operator: stage 'a': operator 'ops:measure': {says}" in done.stderr
    assert time.monotonic() - started < 20
    assert runs(study) == []


def test_the_early_scan_finds_the_modules_a_recipe_names() -> None:
    text = RECIPE + """\
  - name: c
    operator: 'pkg.mod.Cls'
  - {name: d, kind: train, entrypoint: "train_ops:main", needs: [c]}
"""
    assert warm_modules(text) == ["ops", "pkg.mod", "train_ops"]


@pytest.mark.timeout(60)
def test_an_early_check_child_is_stopped_when_the_command_fails_before_using_it(study: Path) -> None:
    """`run` starts the check's child before it has read the recipe; a bad recipe must not leave it behind."""
    pids = study.parent / "pids"
    study.write_text(RECIPE.replace("name: check", "name: check\nbogus: 1"))
    done = habitrun("run", str(study), cwd=study.parent, env={"OPS_MODE": "hang", "PID_FILE": str(pids)})
    assert done.returncode == 2 and "unknown key 'bogus'" in done.stderr
    for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
