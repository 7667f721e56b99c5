"""`status` and `plan` tell the truth about runs they cannot show as finished: a run still starting, one
killed before its run folder existed, one running now, and a failed run whose failures the store no
longer holds (through the real CLI, with real SIGKILLs)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.engine.study import habitrun_cmd, make_study, run_cli
from tests.engine.test_crash_safety import start_run, wait_for_done_events

SLOW_IMPORT = textwrap.dedent('''
    import time

    time.sleep(60)  # the operator check imports this: the runner waits for it, before its run folder


    def square(subject):
        return 1
''')


def slow_start_study(folder: Path) -> Path:
    folder.mkdir()
    (folder / "ops.py").write_text(SLOW_IMPORT)
    (folder / "subjects.csv").write_text("subject_id\nS1\nS2\n")
    recipe = {"habitrun": 1, "name": "slow-start", "subjects": {"manifest": "subjects.csv"},
              "policy": {"backend": "process", "workers": 1, "subject_spawn_timeout_sec": 90},
              "stages": [{"name": "square", "operator": "ops:square"}]}
    (folder / "recipe.yaml").write_text(json.dumps(recipe))
    return folder / "recipe.yaml"


def wait_for_lock_holder(lock: Path, pid: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if json.loads(lock.read_text() or "{}").get("pid") == pid:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{lock} never named pid {pid}")


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the runner; wait until every process it started is gone."""
    children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout:
        proc.stdout.close()
    assert wait_gone(children, timeout=15) == []


def stop_if_running(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        kill(proc)


@pytest.mark.timeout(120)
def test_no_run_yet_exits_1_and_a_start_up_killed_before_its_run_folder_is_named(tmp_path: Path) -> None:
    recipe = slow_start_study(tmp_path / "study")
    study = recipe.parent
    never = run_cli("status", "recipe.yaml", cwd=study)
    assert never.returncode == 1, never.stdout + never.stderr
    assert "no run yet for" in never.stdout and "killed" not in never.stdout, never.stdout
    assert json.loads(run_cli("status", "recipe.yaml", "--json", cwd=study).stdout)["run"] is None

    proc = subprocess.Popen(habitrun_cmd("run", "recipe.yaml"), cwd=study, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_lock_holder(study / ".habitrun" / "store.lock", proc.pid, proc)
        starting = run_cli("status", "recipe.yaml", cwd=study)
        text = " ".join(starting.stdout.split())
        assert starting.returncode == 0, starting.stdout + starting.stderr  # it is running
        assert f"a run is in progress (pid {proc.pid}, started" in text, text
        assert "`habitrun run recipe.yaml`); it has not made its run folder yet" in text, text
        planned = run_cli("plan", "recipe.yaml", cwd=study)
        assert planned.returncode == 0 and f"a run is in progress (pid {proc.pid}" in planned.stdout, planned.stdout
        as_json = json.loads(run_cli("plan", "recipe.yaml", "--json", cwd=study).stdout)
        assert as_json["in_progress"]["pid"] == proc.pid and as_json["in_progress"]["host"] == socket.gethostname()
        assert proc.poll() is None  # neither read took the lock from it
        kill(proc)
    finally:
        stop_if_running(proc)
    runs = study / ".habitrun" / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]

    shown = run_cli("status", "recipe.yaml", cwd=study)
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "no run yet for" in text, text
    assert (f"`habitrun run recipe.yaml` (pid {proc.pid}, started" in text
            and "died holding the store lock" in text and "before it made a run folder" in text), text
    assert "start it again with: habitrun resume recipe.yaml" in text, text
    as_json = json.loads(run_cli("status", "recipe.yaml", "--json", cwd=study).stdout)
    assert as_json["run"] is None and as_json["in_progress"] is None and "died holding" in as_json["before_run_folder"]
    assert "in progress" not in run_cli("plan", "recipe.yaml", cwd=study).stdout


@pytest.mark.timeout(120)
def test_plan_and_status_during_a_run_name_it_and_its_pid(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=6)
    study = recipe.parent
    first = run_cli("run", "recipe.yaml", "-q", "--stage", "square", cwd=study, timeout=60)  # an earlier run
    assert first.returncode == 0, first.stdout + first.stderr
    # new params: this run redoes square; S000 is done at once, the others wait on a gate never opened
    # (running for as long as the test looks, however loaded the machine)
    make_study(study, subjects=6, square_params={"gate": str(tmp_path / "never"), "gate_from": 1})
    proc = start_run(recipe)
    try:
        wait_for_done_events(study, 7, proc)  # the earlier run's six, then one of this run
        assert proc.poll() is None
        planned = run_cli("plan", "recipe.yaml", cwd=study)
        text = " ".join(planned.stdout.split())
        assert planned.returncode == 0, planned.stdout + planned.stderr
        assert f"a run is in progress (pid {proc.pid}, started" in text and f"`habitrun run {recipe}`" in text, text
        assert json.loads(run_cli("plan", "recipe.yaml", "--json", cwd=study).stdout)["in_progress"]["pid"] == proc.pid
        live = run_cli("status", "recipe.yaml", cwd=study)
        assert live.returncode == 0 and f"running (pid {proc.pid}" in live.stdout, live.stdout + live.stderr
        assert "now:" not in live.stdout  # the run shown is the one in progress: said once
        kill(proc)
    finally:
        stop_if_running(proc)
    assert "in progress" not in run_cli("plan", "recipe.yaml", cwd=study).stdout
    dead = run_cli("status", "recipe.yaml", cwd=study)
    assert dead.returncode == 1 and "interrupted (the runner died)" in dead.stdout, dead.stdout + dead.stderr


FAILING = textwrap.dedent('''
    def bad(subject, word="broken"):
        raise ValueError(f"{subject.id} is {word}")


    def after(subject):
        return 1
''')


@pytest.mark.timeout(120)
@pytest.mark.parametrize("resume", [True, False])
def test_a_failed_run_lists_its_failures_even_when_the_store_holds_none_now(tmp_path: Path, resume: bool) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "ops.py").write_text(FAILING)
    (study / "subjects.csv").write_text("subject_id\nS1\nS2\nS3\n")
    recipe = {"habitrun": 1, "name": "all-fail", "subjects": {"manifest": "subjects.csv"},
              "policy": {"backend": "process", "workers": 2, "resume": resume},
              "stages": [{"name": "bad", "operator": "ops:bad"},
                         {"name": "after", "operator": "ops:after", "needs": ["bad"]}]}
    (study / "recipe.yaml").write_text(json.dumps(recipe))
    done = run_cli("run", "recipe.yaml", "-q", cwd=study)
    assert done.returncode == 1, done.stdout + done.stderr

    shown = run_cli("status", "recipe.yaml", cwd=study)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert ": failed" in shown.stdout and "no failed subjects" not in shown.stdout, shown.stdout
    assert "3 failed subject(s)" in shown.stdout, shown.stdout  # resume off: forced again, still failures
    for sid in ("S1", "S2", "S3"):
        assert f"bad {sid}: exception: ValueError: {sid} is broken" in shown.stdout, shown.stdout

    # new keys: no failure is stored under them (status plans the recipe the run stored: its code changes)
    (study / "ops.py").write_text(FAILING.replace('is {word}"', 'is {word}, mended"'))
    changed = run_cli("status", "recipe.yaml", cwd=study)
    text = " ".join(changed.stdout.split())
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "no failed subjects" not in text, text
    assert "3 subject(s) failed in this run" in text, text
    for sid in ("S1", "S2", "S3"):
        assert f"bad {sid}: exception: ValueError: {sid} is broken (now stale)" in text, text
    as_json = json.loads(run_cli("status", "recipe.yaml", "--json", cwd=study).stdout)
    assert as_json["failures"] == [] and len(as_json["run_failures"]) == 3, as_json


@pytest.mark.timeout(120)
def test_a_run_stopped_by_fail_fast_says_why_and_lists_the_failure(tmp_path: Path) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "ops.py").write_text(FAILING)
    (study / "subjects.csv").write_text("subject_id\nS1\nS2\nS3\n")
    recipe = {"habitrun": 1, "name": "fail-fast", "subjects": {"manifest": "subjects.csv"},
              "policy": {"backend": "process", "workers": 1, "on_subject_failure": "fail_fast"},
              "stages": [{"name": "bad", "operator": "ops:bad"}]}
    (study / "recipe.yaml").write_text(json.dumps(recipe))
    done = run_cli("run", "recipe.yaml", "-q", cwd=study)
    assert done.returncode == 1, done.stdout + done.stderr
    shown = run_cli("status", "recipe.yaml", cwd=study)
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 1, text
    assert ": failed" in text and "stopped fail_fast: subject S1 failed in stage 'bad'" in text, text
    assert "1 failed subject(s)" in text and "bad S1: exception: ValueError: S1 is broken" in text, text
