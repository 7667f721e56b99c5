"""Runs that run_dir put outside the study's own run root are found through its index; a listed folder
that is gone, or a damaged line, is skipped (real run folders on disk)."""

from __future__ import annotations

from pathlib import Path

from habitrun.store.runindex import INDEX_FILE, note_run_elsewhere, study_runs
from habitrun.store.runs import RunFolder


def make_run(run_root: Path) -> RunFolder:
    return RunFolder.create(run_root, resolved_yaml="habitrun: 1\n", recipe_path=run_root / "recipe.yaml",
                            argv=["habitrun", "run"], reserve=0)


def test_runs_elsewhere_are_listed_with_the_study_s_own_oldest_first(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "study" / ".habitrun", tmp_path / "scratch"
    own = make_run(home)
    away = make_run(elsewhere)
    gone = make_run(tmp_path / "gone")
    for run in (away, gone, away):  # listed twice: shown once
        note_run_elsewhere(home, run.path)
    with open(home / INDEX_FILE, "a", encoding="utf-8") as fh:
        fh.write("not json\n{\"path\": 3}\n")
    for entry in sorted(gone.path.iterdir()):
        if entry.is_file():
            entry.unlink()
    found = study_runs(home)
    assert [r.run_id for r in found] == [own.run_id, away.run_id]
    assert found[1].path == away.path
    assert [r.path for r in study_runs(home, elsewhere)] == [own.path, away.path]  # found both ways: once
