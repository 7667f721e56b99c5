"""Ctrl-C says at once what it waits for; a second Ctrl-C stops the running subjects now."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

OPS = '''
import time
from pathlib import Path

def slow(subject):
    (Path(__file__).parent / ("started-" + subject.id.replace("/", "_"))).write_text("x")
    time.sleep(60)
'''

RECIPE = """\
habitrun: 1
name: hung
subjects: {manifest: subjects.csv}
policy: {workers: 2, graceful_shutdown_sec: 30}
stages:
  - {name: a, operator: "ops:slow"}
"""


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(90)
def test_ctrl_c_says_what_it_waits_for_and_a_second_one_stops_now(tmp_path: Path) -> None:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id\nS1\n[/x]\nS3\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "habitrun.cli.app", "run", "recipe.yaml"], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, 60), out_path.read_text()
        os.kill(proc.pid, signal.SIGINT)
        said = "stopping: 2 subject(s) still running, waiting up to 30 s; Ctrl-C again to stop them now"
        assert wait_for(lambda: said in out_path.read_text(), 5), out_path.read_text()
        assert proc.poll() is None  # still waiting for the two hung subjects
        again = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=15) == 130
        assert time.monotonic() - again < 10, "the second Ctrl-C did not stop the subjects at once"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text()
    assert "Traceback" not in text
    assert "stopping now: running subjects are stopped at once" in text
    assert "Continue with: habitrun resume recipe.yaml" in text
    status = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "status", "recipe.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 1 and ": interrupted" in status.stdout.splitlines()[0], status.stdout
