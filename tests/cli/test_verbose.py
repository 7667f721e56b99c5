"""The debug channel (issue 30): HABITRUN_DEBUG=1 writes the engine's decisions to the run folder's debug.log,
`habitrun -v` also prints them on stderr (literally), and without either nothing is written.

Real CLI runs on the process backend: a subject that fails its first attempt is retried, so the log has
dispatch, worker phase, retry, commit, plan and backend lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

OPS = textwrap.dedent('''
    import os


    def flaky(subject, marks):
        mark = os.path.join(marks, subject.fields["n"])
        first = not os.path.exists(mark)
        open(mark, "a").close()
        if first and subject.fields["n"] == "1":
            raise RuntimeError("first attempt fails")
        return 1
''')
ODD_ID = "[bold]S\x1b[31mX[/]"  # rich markup and a terminal escape: printed as text, never acted on


def _study(folder: Path) -> Path:
    (folder / "marks").mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text(f"subject_id,n\nS0,0\nS1,1\n\"{ODD_ID}\",2\n")
    recipe = {"habitrun": 1, "name": "verbose", "subjects": {"manifest": "subjects.csv"},
              "policy": {"workers": 1, "auto_retry_rounds": 1, "auto_retry_on": "all"},
              "stages": [{"name": "a", "operator": "ops:flaky", "params": {"marks": str(folder / "marks")}}]}
    (folder / "recipe.yaml").write_text(json.dumps(recipe))
    return folder / "recipe.yaml"


def _run(recipe: Path, *args: str, debug_env: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HABITRUN_DEBUG"}
    if debug_env:
        env["HABITRUN_DEBUG"] = "1"
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args, "run", str(recipe)], env=env,
                          cwd=recipe.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _debug_logs(folder: Path) -> list[Path]:
    return sorted(folder.glob(".habitrun/runs/*/debug.log"))


def test_habitrun_debug_writes_the_decisions_to_debug_log(tmp_path: Path) -> None:
    recipe = _study(tmp_path / "env")
    done = _run(recipe, debug_env=True)
    [log] = _debug_logs(recipe.parent)
    text = log.read_text()
    for needle in ("habitrun.engine.planning: plan a: 3 pending; to run: 3",
                   "habitrun.engine.backend_choice: backend: process with 1 worker(s)",
                   "habitrun.engine.process.stage: stage a: dispatch", "S0#1",
                   "habitrun.engine.process.handle: worker", "-> ready",
                   "habitrun.engine.map_stage: stage a: S1#1 failed (exception), retried as attempt 2",
                   "habitrun.engine.process.stage: stage a: worker", "S1#2 done",
                   "habitrun.engine.recorder: commit:"):
        assert needle in text, needle
    assert "\x1b" not in text and "S\\x1b[31mX" in text  # the id's escape is written as text
    assert "habitrun.engine" not in done.stderr  # HABITRUN_DEBUG alone prints nothing more


def test_verbose_prints_the_lines_on_stderr_as_text(tmp_path: Path) -> None:
    recipe = _study(tmp_path / "v")
    done = _run(recipe, "-v")
    assert "habitrun.engine.process.stage: stage a: dispatch" in done.stderr
    assert "habitrun.engine.map_stage: stage a: S1#1 failed (exception), retried as attempt 2" in done.stderr
    assert "[bold]S\\x1b[31mX[/]" in done.stderr and "\x1b[31m" not in done.stderr  # literal, no markup read
    [log] = _debug_logs(recipe.parent)
    assert "habitrun.engine.recorder: commit:" in log.read_text()


def test_without_either_no_debug_log(tmp_path: Path) -> None:
    recipe = _study(tmp_path / "quiet")
    done = _run(recipe)
    assert _debug_logs(recipe.parent) == []
    assert "habitrun.engine" not in done.stderr
    assert list(recipe.parent.glob(".habitrun/runs/*/events.jsonl"))  # it did run
