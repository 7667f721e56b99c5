"""`resume` in a copy of a study folder works on the copy and writes nothing into the original."""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
from pathlib import Path

from habitrun.store.runs import list_runs
from tests.engine.study import run_cli
from tests.engine.test_crash_safety import start_run, wait_for_done_events

OPS = textwrap.dedent('''
    import time


    def slow(subject, sleep=0.3):
        time.sleep(sleep)
        return {"id": subject.id}


    def total(results):
        return {"n": len(results)}
''')


def make_plain_study(folder: Path, subjects: int) -> Path:
    """A study whose operators write nothing anywhere: every file it gains is habitrun's."""
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:03d}\n" for i in range(subjects)))
    recipe = {
        "habitrun": 1, "name": "copied", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60},
        "stages": [{"name": "slow", "operator": "ops:slow"},
                   {"name": "total", "kind": "collect", "operator": "ops:total", "needs": ["slow"]}],
    }
    (folder / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
    return folder / "recipe.yaml"


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_resume_in_a_copied_study_works_on_the_copy_only(tmp_path: Path) -> None:
    original = tmp_path / "A"
    recipe = make_plain_study(original, subjects=10)
    proc = start_run(recipe)
    try:
        wait_for_done_events(original, 2, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
    copy = tmp_path / "C"
    shutil.copytree(original, copy, symlinks=True)
    before = snapshot(original)
    (run_id,) = [p.name for p in (original / ".habitrun" / "runs").iterdir()]

    done = run_cli("resume", "recipe.yaml", "-q", cwd=copy)
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, out
    assert f"resuming run {run_id} ({copy}/.habitrun/runs/{run_id})" in out
    assert f"run {run_id} was made in {original}; resuming it here, in {copy}" in out
    assert f"run folder: {copy}/.habitrun/runs/" in out
    assert snapshot(original) == before, "resume in the copy wrote into the original study"
    runs = [run.path for run in list_runs(copy / ".habitrun")]  # oldest first (two runs can share a second)
    assert len(runs) == 2
    source = json.loads((runs[-1] / "source.json").read_text())
    assert source["root"] == str(copy) and source["recipe_path"] == str(copy / "recipe.yaml")
    status = run_cli("status", "recipe.yaml", cwd=copy)
    assert "success" in status.stdout and str(original) not in status.stdout, status.stdout

    # A run folder copied with its study names the original: replaying it there is refused.
    stale = copy / ".habitrun" / "runs" / run_id
    for command in ("resume", "status"):
        refused = run_cli(command, str(stale), cwd=copy)
        text = " ".join(refused.stderr.split())
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "copied or moved" in text and "Traceback" not in text, text
    assert snapshot(original) == before
