"""`status` after the runner was SIGKILLed: not "running" forever, but interrupted, with the way on."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.engine.study import make_study, run_cli
from tests.engine.test_crash_safety import start_run, wait_for_done_events


@pytest.mark.timeout(90)
def test_status_after_a_sigkilled_run_says_interrupted_with_the_resume_command(tmp_path: Path) -> None:
    # S000 and S001 run at once, the others wait on a gate the test opens only for the resume: the run
    # is still running at the kill however loaded the machine, and the resume does not sleep
    gate = tmp_path / "gate"
    recipe = make_study(tmp_path / "study", subjects=8, square_params={"gate": str(gate), "gate_from": 2})
    study = recipe.parent
    proc = start_run(recipe)
    try:
        wait_for_done_events(study, 1, proc)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        live = run_cli("status", "recipe.yaml", cwd=study)
        assert f"running (pid {proc.pid}" in live.stdout, live.stdout + live.stderr
        workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
    assert wait_gone(workers, timeout=10.0) == []
    provenance = json.loads(next((study / ".habitrun" / "runs").glob("*/provenance.json")).read_text())
    assert provenance["outcome"] == "running"  # what the killed runner left behind

    shown = run_cli("status", "recipe.yaml", cwd=study)
    text = " ".join(shown.stdout.split())
    assert "interrupted (the runner died)" in text, shown.stdout + shown.stderr
    assert "running (pid" not in text
    assert "continue with: habitrun resume recipe.yaml" in text
    assert "Traceback" not in shown.stdout + shown.stderr
    as_json = json.loads(run_cli("status", "recipe.yaml", "--json", cwd=study).stdout)
    assert as_json["run"]["outcome"] == "interrupted (the runner died)"
    assert as_json["run"]["resume"] == "habitrun resume recipe.yaml"

    gate.touch()
    resumed = run_cli("resume", "recipe.yaml", "-q", cwd=study)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = run_cli("status", "recipe.yaml", cwd=study)
    assert "success" in after.stdout and "runner died" not in after.stdout
