"""Folders a run cannot use: a plain file or /dev/null where a folder belongs, a read-only study.

Each is met through the real CLI: exit 2, one message naming the folder and
run_dir / checkpoint_dir as the way out, no traceback, nothing touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engine.mounts import read_only
from tests.engine.study import make_study, run_cli


def assert_refused(done, folder: Path) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out, out
    assert "error:" in done.stderr, out
    assert str(folder) in " ".join(done.stderr.split()), out
    assert "run_dir" in done.stderr and "checkpoint_dir" in done.stderr, out


@pytest.mark.parametrize("case", ["habitrun-is-a-file", "habitrun-is-dev-null", "runs-is-a-file",
                                  "run_dir-is-dev-null", "checkpoint_dir-under-a-file"])
def test_a_file_where_a_folder_belongs_exits_2_naming_it(tmp_path: Path, case: str) -> None:
    recipe = make_study(tmp_path / "study", subjects=2)
    study = recipe.parent
    extra: list[str] = []
    if case == "habitrun-is-a-file":
        blocker = study / ".habitrun"
        blocker.write_text("mine\n")
    elif case == "habitrun-is-dev-null":
        blocker = study / ".habitrun"
        blocker.symlink_to("/dev/null")
    elif case == "runs-is-a-file":
        (study / ".habitrun").mkdir()
        blocker = study / ".habitrun" / "runs"
        blocker.write_text("mine\n")
    elif case == "run_dir-is-dev-null":
        blocker = Path("/dev/null")
        extra = ["run_dir=/dev/null"]
    else:
        blocker = study / "notes.txt"
        blocker.write_text("mine\n")
        extra = [f"policy.checkpoint_dir={blocker}/store"]
    done = run_cli("run", str(recipe), "-q", *extra)
    assert_refused(done, blocker)
    assert "not a folder" in done.stderr
    if blocker.is_file() and not blocker.is_symlink():
        assert blocker.read_text() == "mine\n", "the user's file was changed"
    if case == "habitrun-is-dev-null":
        assert os.path.realpath(blocker) == "/dev/null"
    if case == "habitrun-is-a-file":  # the way out the message names: the same study, run_dir elsewhere, runs
        done = run_cli("run", str(recipe), "-q", f"run_dir={tmp_path / 'elsewhere'}")
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("with_earlier_run", [False, True], ids=["fresh", "after-a-run"])
def test_a_read_only_study_folder_exits_2_naming_it_and_run_dir(tmp_path: Path, with_earlier_run: bool) -> None:
    recipe = make_study(tmp_path / "study", subjects=2)
    study = recipe.parent
    if with_earlier_run:
        assert run_cli("run", str(recipe), "-q").returncode == 0
    before = sorted(str(p) for p in study.rglob("*"))
    with read_only(study):
        done = run_cli("resume" if with_earlier_run else "run", str(recipe), "-q")
        assert_refused(done, study / ".habitrun")
        assert "Read-only file system" in done.stderr
        # the way out the message names: runs and store elsewhere (the test's markers too)
        markers = tmp_path / "markers"
        markers.mkdir()
        done = run_cli("run", str(recipe), "-q", f"run_dir={tmp_path / 'writable'}",
                       f"stages.square.params.marker_dir={markers}", f"stages.plus_one.params.marker_dir={markers}")
        assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(str(p) for p in study.rglob("*")) == before
    assert (tmp_path / "writable" / "store").is_dir()
