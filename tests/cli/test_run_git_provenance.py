"""`run` reads git for its provenance while it starts (a thread begun before the imports): same record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.store.integrity_study import write_study


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          timeout=30)
    return done.stdout.strip()


def run_provenance(recipe: Path) -> dict:
    runs = recipe.parent / ".habitrun" / "runs"
    before = set(runs.glob("*")) if runs.exists() else set()
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "run", str(recipe), "-q", "--rerun", "s1"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=recipe.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    (folder,) = set(runs.glob("*")) - before
    return json.loads((folder / "provenance.json").read_text())["git"]


def test_the_run_records_the_commit_root_and_dirty_flag_of_the_study_repository(tmp_path: Path) -> None:
    study = tmp_path / "repo" / "study"
    recipe = write_study(study)
    git(tmp_path / "repo", "init", "-q")
    (tmp_path / "repo" / ".gitignore").write_text(".habitrun/\n")
    git(tmp_path / "repo", "add", ".")
    git(tmp_path / "repo", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path / "repo", "rev-parse", "HEAD")
    assert run_provenance(recipe) == {"commit": head, "dirty": False, "root": str((tmp_path / "repo").resolve())}
    (study / "salt.txt").write_text("two\n")  # a tracked file changed: dirty
    assert run_provenance(recipe) == {"commit": head, "dirty": True, "root": str((tmp_path / "repo").resolve()),
                                      "changed": ["study/salt.txt"]}  # relative to the repository's root


def test_outside_a_repository_the_git_fields_are_null(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    assert run_provenance(recipe) == {"commit": None, "dirty": None, "root": None}
