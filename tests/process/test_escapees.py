"""A daemon a subject started (double fork + setsid) ends with the subject, whatever the mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from habitrun.engine.contract import FailureKind
from tests.engine.study import habitrun_cmd
from tests.process.conftest import OPS_DIR, alive, op, run, wait_gone


def _daemon(pidfile: Path) -> int:
    return int(pidfile.read_text())


@pytest.fixture(autouse=True)
def _no_daemon_left(tmp_path):
    """Daemons escape the conftest's check (they are nobody's children): kill any left, after the test."""
    yield
    for pidfile in tmp_path.glob("daemon.pid*"):
        for pid in alive([_daemon(pidfile)]):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["persistent", "isolated"])
def test_a_daemonised_grandchild_is_killed_when_its_subject_ends(make_backend, tasks, tmp_path, mode):
    b = make_backend(workers=1, parallel_mode=mode)
    pidfile = tmp_path / "daemon.pid"
    got = run(b, op("act"), tasks({"do": "daemon", "pidfile": str(pidfile)}, {"do": "ok"}))
    assert got["S0"].ok and got["S1"].ok
    daemon = _daemon(pidfile)
    assert not wait_gone([daemon], timeout=5), "the daemon outlived its subject"
    if mode == "persistent":
        assert got["S0"].worker_pid == got["S1"].worker_pid and alive([got["S1"].worker_pid])


@pytest.mark.timeout(60)
def test_a_daemon_of_a_subject_that_times_out_ignoring_sigterm_is_killed(make_backend, tasks, tmp_path):
    b = make_backend(workers=1, subject_timeout_sec=1.5, graceful_shutdown_sec=30)
    pidfile = tmp_path / "daemon.pid"
    t0 = time.monotonic()
    got = run(b, op("act"), tasks({"do": "daemon_then_hang", "pidfile": str(pidfile)}, {"do": "ok"}))
    assert got["S0"].kind == FailureKind.TIMEOUT and got["S1"].ok
    assert time.monotonic() - t0 < 25, "the worker waited out the grace period"
    assert not wait_gone([_daemon(pidfile)], timeout=5), "the daemon outlived its timed-out subject"


@pytest.mark.timeout(90)
def test_run_piped_into_cat_does_not_wait_for_a_subjects_daemon(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    (study / "subjects.csv").write_text("subject_id\nS1\nS2\n")
    pidfile = tmp_path / "daemon.pid"
    recipe = {
        "habitrun": 1, "name": "daemons", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 1, "subject_timeout_sec": 60},
        "stages": [{"name": "s", "operator": "faults:daemon_op", "params": {"pidfile": str(pidfile)}}],
    }
    (study / "recipe.yaml").write_text(json.dumps(recipe))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([OPS_DIR, os.environ.get("PYTHONPATH", "")])}
    command = " ".join(habitrun_cmd("run", str(study / "recipe.yaml"), "--quiet")) + " | cat"
    t0 = time.monotonic()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=80, env=env)
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < 40, f"the pipe stayed open for {elapsed:.0f} s"
    daemons = [_daemon(Path(f"{pidfile}.{sid}")) for sid in ("S1", "S2")]
    assert not wait_gone(daemons, timeout=5), "the daemons outlived the run"


def test_a_child_left_in_the_workers_group_lives_until_the_worker_ends_then_dies_with_it(make_backend, tasks,
                                                                                        tmp_path):
    # still in the worker's group: it may be an operator's pool, kept between subjects
    b = make_backend(workers=1)
    pidfile = tmp_path / "daemon.pid"
    got = run(b, op("act"), tasks({"do": "child_outlives", "pidfile": str(pidfile)}, {"do": "ok"}))
    assert got["S0"].ok and got["S1"].ok
    child = _daemon(pidfile)
    assert alive([child])
    b.close()
    assert not wait_gone([child], timeout=5), "the child outlived its worker"


@pytest.mark.timeout(120)
def test_a_50_mb_result_is_stored_and_reaches_the_next_stage(tmp_path, monkeypatch):
    from tests.engine.test_crash_safety import stored_results

    study = tmp_path / "study"
    study.mkdir()
    (study / "subjects.csv").write_text("subject_id,do\nS1,big\nS2,ok\n")
    recipe = {
        "habitrun": 1, "name": "big", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 100},
        "stages": [{"name": "big", "operator": "faults:act"},
                   {"name": "size", "operator": "faults:size_of", "needs": ["big"]}],
    }
    (study / "recipe.yaml").write_text(json.dumps(recipe))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([OPS_DIR, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(habitrun_cmd("run", str(study / "recipe.yaml"), "--quiet"), capture_output=True,
                          text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    monkeypatch.syspath_prepend(OPS_DIR)  # planning reads the operators' code
    results = stored_results(study / "recipe.yaml")
    assert results[("size", "S1")] == 50 * 1024 * 1024
    assert results[("big", "S1")] == b"x" * (50 * 1024 * 1024)


def test_orphans_that_end_are_reaped_so_zombies_do_not_pile_up_in_a_persistent_worker(make_backend, tasks):
    b = make_backend(workers=1)
    got = run(b, op("act"), tasks(*[{"do": "orphan"}] * 5, {"do": "zombies"}))
    assert all(o.ok for o in got.values())
    assert got["S5"].result == [], f"zombie children left in the worker: {got['S5'].result}"
