"""A subject or a rank that segfaults leaves ``Fatal Python error`` and its Python stack in its own log,
and ``status`` points at that log (faulthandler in every worker, isolated child and rank)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

OPS = '''
import ctypes, os, sys, time

def crash_in_the_operator(subject):
    print(f"about to crash {subject.id}", flush=True)
    ctypes.string_at(0)

def measure(subject):
    print(f"measuring {subject.id}", flush=True)
    if subject.id == "S2":
        crash_in_the_operator(subject)
    return len(subject.id)

def crash_in_rank_one():
    ctypes.string_at(0)

def train():
    rank = int(os.environ["RANK"])
    print(f"rank {rank} training", flush=True)
    if rank == 1:
        crash_in_rank_one()
    time.sleep(30)  # stopped by the launcher once rank 1 died
'''

CMD_TRAINER = '''
import ctypes, os, time

def crash_in_the_command():
    ctypes.string_at(0)

if os.environ["RANK"] == "1":
    crash_in_the_command()
time.sleep(30)
'''

RECIPE = """\
habitrun: 1
name: crashes
subjects: {{manifest: subjects.csv}}
policy: {{workers: 2, parallel_mode: {mode}, auto_retry_on: []}}
stages:
  - {{name: a, operator: "ops:measure"}}
"""

TRAIN_RECIPE = """\
habitrun: 1
name: crash-train
subjects: {{manifest: subjects.csv}}
policy: {{workers: 1, graceful_shutdown_sec: 2}}
stages:
  - {{name: fit, kind: train, {entry}, launch: {{nproc_per_node: 2}}}}
"""


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=dict(os.environ))
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def study(folder: Path, recipe: str) -> Path:
    (folder / "ops.py").write_text(OPS)
    (folder / "cmd_trainer.py").write_text(CMD_TRAINER)
    (folder / "subjects.csv").write_text("subject_id\nS1\nS2\nS3\nS4\n")
    (folder / "recipe.yaml").write_text(recipe)
    return folder


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["persistent", "isolated"])
def test_a_segfaulting_subject_leaves_its_python_stack_in_its_log_and_status_points_at_it(tmp_path, mode):
    folder = study(tmp_path, RECIPE.format(mode=mode))
    run = habitrun("run", "recipe.yaml", cwd=folder)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "a S2: worker_died: worker died with signal SIGSEGV" in run.stdout

    status = habitrun("status", "recipe.yaml", cwd=folder)
    assert status.returncode == 1
    lines = status.stdout.splitlines()
    at = next(n for n, line in enumerate(lines) if "a S2: worker_died" in line)
    log = Path(lines[at + 1].split("log: ", 1)[1].strip())
    assert log.name == "S2.log" and log.parent.name == "a"
    text = log.read_text()
    assert "measuring S2" in text and "about to crash S2" in text
    assert "Fatal Python error: Segmentation fault" in text
    # the stack of the thread that crashed, down to the operator's own frames, innermost first
    assert re.search(r'ops\.py", line \d+ in crash_in_the_operator\n.*ops\.py", line \d+ in measure', text), text
    assert text.index("about to crash S2") < text.index("Fatal Python error") < text.index("worker died with")
    for other in ("S1", "S3", "S4"):  # the worker's next subjects' logs hold nothing of the crash
        sibling = log.parent / f"{other}.log"
        assert "Fatal Python error" not in (sibling.read_text() if sibling.exists() else "")
    assert re.search(r"^ a\s+map\s+3\s+1\s", status.stdout, re.M), status.stdout  # the three others are done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("entry", ['entrypoint: "ops:train"', 'command: [python, cmd_trainer.py]'])
def test_a_segfaulting_train_rank_leaves_its_python_stack_in_its_stderr_log(tmp_path, entry):
    folder = study(tmp_path, TRAIN_RECIPE.format(entry=entry))
    if entry.startswith("command"):  # the ranks' `python` is this interpreter
        (folder / "recipe.yaml").write_text(TRAIN_RECIPE.format(entry=f"command: [{sys.executable}, cmd_trainer.py]"))
    run = habitrun("run", "recipe.yaml", cwd=folder)
    assert run.returncode == 1, run.stdout + run.stderr
    status = habitrun("status", "recipe.yaml", cwd=folder)
    assert status.returncode == 1
    failure = next(line for line in status.stdout.splitlines() if "fit *:" in line)
    assert "rank 1" in failure and "SIGSEGV" in failure and "decorate" not in failure
    stderr_log = Path(re.search(r"its stderr, see (\S+stderr\.log)", failure)[1])
    assert stderr_log.parts[-3:] == ("attempt_0", "1", "stderr.log")
    text = stderr_log.read_text()
    assert "Fatal Python error: Segmentation fault" in text
    frame = "crash_in_rank_one" if "ops:train" in entry else "crash_in_the_command"
    assert re.search(rf'line \d+ in {frame}\n', text), text


DASK_RECIPE = """\
habitrun: 1
name: crashes-dask
subjects: {manifest: subjects.csv}
policy: {workers: 2, backend: dask, auto_retry_on: [], subject_timeout_sec: 60, graceful_shutdown_sec: 3}
stages:
  - {name: a, operator: "ops:measure"}
"""


@pytest.mark.dask
@pytest.mark.timeout(120)
def test_a_subject_that_crashes_its_dask_worker_leaves_its_python_stack_in_its_log(tmp_path):
    """A Dask worker's stderr is Dask's: faulthandler writes to the worker's crash file beside the
    stage's logs, and the client copies it into the log of the subject it charges."""
    pytest.importorskip("distributed", reason="dask.distributed is not installed (the dask extra)")
    folder = study(tmp_path, DASK_RECIPE)
    run = habitrun("run", "recipe.yaml", cwd=folder)
    assert run.returncode == 1, run.stdout + run.stderr
    status = habitrun("status", "recipe.yaml", cwd=folder)
    assert status.returncode == 1
    lines = status.stdout.splitlines()
    at = next(n for n, line in enumerate(lines) if "a S2: worker_died" in line)
    log = Path(lines[at + 1].split("log: ", 1)[1].strip())
    assert log.name == "S2.log" and log.parent.name == "a"
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text
    assert re.search(r'ops\.py", line \d+ in crash_in_the_operator\n.*ops\.py", line \d+ in measure', text), text
    assert text.index("Fatal Python error") < text.index("running this subject died")
    assert not list(log.parent.glob(".crash-*")), "the workers' crash files outlive the stage"
    assert re.search(r"^ a\s+map\s+3\s+1\s", status.stdout, re.M), status.stdout
