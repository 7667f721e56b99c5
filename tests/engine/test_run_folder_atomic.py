"""A runner killed while it makes its run folder leaves nothing `resume` would trip over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.engine.study import make_study, run_cli

# The real CLI, SIGKILLed by itself the moment it writes a run's provenance: where a
# kill in the ~40 ms between making the run folder and writing provenance.json lands.
KILLED_AT_PROVENANCE = """
import os, signal, sys
import habitrun.store.runs as runs

real = runs._write_json_atomic

def write(path, data):
    if path.name == "provenance.json":
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, data)

runs._write_json_atomic = write
from habitrun.cli.app import main
main(sys.argv[1:])
"""


def test_a_kill_while_the_run_folder_is_made_does_not_block_a_strict_resume(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=3, policy={"strict_checkpoint_hash": True})
    study = recipe.parent
    first = run_cli("run", "recipe.yaml", "-q", cwd=study)
    assert first.returncode == 0, first.stdout + first.stderr
    first_id = next((study / ".habitrun" / "runs").iterdir()).name

    # --record-noop: nothing is left to run, and a run with nothing to do makes no run folder unless asked
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_PROVENANCE, "run", "recipe.yaml", "-q", "--record-noop"],
                            cwd=study,
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    resumed = run_cli("resume", "recipe.yaml", "-q", "--record-noop", cwd=study)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert "another version of recipe" not in out
    assert f"resuming run {first_id}" in out
    visible = {p.name for p in (study / ".habitrun" / "runs").iterdir() if not p.name.startswith(".")}
    # (two runs in one second: their ids do not sort by time, their provenance does)
    assert first_id in visible and len(visible) == 2, "the killed run's half-made folder is visible"
    shown = run_cli("status", "recipe.yaml", cwd=study)
    assert "success" in shown.stdout, shown.stdout + shown.stderr


def test_resume_and_status_skip_a_run_folder_without_provenance(tmp_path: Path) -> None:
    """What an older habitrun left after such a kill: recipe and source written, no provenance."""
    recipe = make_study(tmp_path / "study", subjects=3, policy={"strict_checkpoint_hash": True})
    study = recipe.parent
    assert run_cli("run", "recipe.yaml", "-q", cwd=study).returncode == 0
    runs = study / ".habitrun" / "runs"
    first_id = next(runs.iterdir()).name
    half = runs / "29991231-235959-abcdef"  # newer than any real run
    (half / "logs").mkdir(parents=True)
    (half / "recipe.yaml").write_text((runs / first_id / "recipe.yaml").read_text())
    (half / "source.json").write_text(json.dumps({**json.loads((runs / first_id / "source.json").read_text()),
                                                  "created_ts": 32503679999.0}))
    shown = run_cli("status", "recipe.yaml", cwd=study)
    assert f"run {first_id}: success" in shown.stdout, shown.stdout + shown.stderr
    resumed = run_cli("resume", "recipe.yaml", "-q", cwd=study)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming run {first_id}" in resumed.stdout
    refused = run_cli("resume", str(half), cwd=study)
    assert refused.returncode == 2 and "incomplete run folder" in refused.stderr, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
