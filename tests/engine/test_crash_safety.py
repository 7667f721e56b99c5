"""Kill the runner at random moments; `resume` must lose nothing and repeat nothing finished."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from habitrun.planner.plan import plan_study
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from habitrun.store.checkpoint import CheckpointStore
from tests.conftest import wait_gone
from tests.engine.study import events, habitrun_cmd, make_study, markers, run_cli

BACKENDS = [
    pytest.param("process", id="process"),
    pytest.param("dask", id="dask", marks=pytest.mark.dask),
]


def backend_policy(backend: str) -> dict[str, Any]:
    """The same behaviour is owed whichever backend runs the subjects."""
    if backend == "dask":
        pytest.importorskip("distributed")
    return {"backend": backend}


def _ts(event: dict[str, Any]) -> float:
    ts = event["ts"]
    if isinstance(ts, (int, float)):
        return float(ts)
    return datetime.fromisoformat(ts).timestamp()


def stored_results(recipe: Path) -> dict[tuple[str, str], Any]:
    loaded = load_recipe(recipe)
    store = CheckpointStore.open(loaded.store_dir(), create=False)
    try:
        plan = plan_study(loaded, load_subjects(loaded), store)
        out: dict[tuple[str, str], Any] = {}
        for name, stage in plan.stages.items():
            results = store.results(stage.keys.values())
            for sid, key in stage.keys.items():
                assert key in results, f"{name}/{sid} has no stored success"
                out[(name, sid)] = results[key]
        return out
    finally:
        store.close()


def start_run(recipe: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(habitrun_cmd("run", str(recipe), *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_done_events(folder: Path, count: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for e in events(folder) if e.get("event") == "subject_done") >= count:
            return
        if proc.poll() is not None:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {count} subject_done events within {timeout}s")


def assert_no_finished_subject_recomputed(folder: Path) -> None:
    """A subject whose success was stored (subject_done event) never starts again afterwards."""
    done_at: dict[str, float] = {}
    for e in events(folder):
        if e.get("event") == "subject_done" and e.get("subject") != "*":
            key = f"{e['stage']}-{e['subject']}"
            done_at.setdefault(key, _ts(e))
    for key, entries in markers(folder).items():
        if key in done_at:
            late = [t for what, t, _ in entries if what == "start" and t > done_at[key] + 1e-3]
            assert not late, f"{key} was recomputed after its result was stored"


@pytest.mark.timeout(240)
def test_sigkill_at_random_moments_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    reference = make_study(tmp_path / "reference", subjects=16, square_params={"sleep": 0.0})
    result = run_cli("run", str(reference), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = stored_results(reference)

    recipe = make_study(tmp_path / "study", subjects=16, square_params={"sleep": 0.15},
                        plus_params={"sleep": 0.1})
    folder = recipe.parent
    rng = random.Random(1234)
    for attempt in range(3):
        command = "run" if attempt == 0 else "resume"
        proc = subprocess.Popen(habitrun_cmd(command, str(recipe)), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        time.sleep(rng.uniform(0.8, 2.0))
        workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
        assert wait_gone(workers, timeout=5.0) == [], "workers outlived the SIGKILLed runner"
    final = run_cli("resume", str(recipe), "--quiet", timeout=180)
    assert final.returncode == 0, final.stdout + final.stderr
    assert stored_results(recipe) == expected
    assert_no_finished_subject_recomputed(folder)
    # every subject computed at least once, and each finished run of it happened exactly once
    for key, entries in markers(folder).items():
        assert sum(1 for what, *_ in entries if what == "end") >= 1, key


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigint_stops_stores_finished_and_exits_130_then_resume_completes(tmp_path: Path, backend: str) -> None:
    recipe = make_study(tmp_path / "study", subjects=20, square_params={"sleep": 0.3}, policy=backend_policy(backend))
    folder = recipe.parent
    proc = start_run(recipe)
    wait_for_done_events(folder, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "habitrun resume" in out
    done_before = {e["subject"] for e in events(folder) if e.get("event") == "subject_done" and e["stage"] == "square"}
    assert 3 <= len(done_before) < 20
    result = run_cli("resume", str(recipe), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_no_finished_subject_recomputed(folder)
    for sid in done_before:
        starts = [e for e in markers(folder)[f"square-{sid}"] if e[0] == "start"]
        assert len(starts) == 1, f"{sid} finished before SIGINT yet ran {len(starts)} times"


def wait_for_a_start(folder: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until a subject has started: the run holds the store lock from before then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(what == "start" for entries in markers(folder).values() for what, *_ in entries):
            return
        time.sleep(0.05)
    raise AssertionError(f"no subject started within {timeout}s (exit code {proc.poll()})")


@pytest.mark.timeout(120)
def test_second_concurrent_run_is_refused_naming_the_holder(tmp_path: Path) -> None:
    # The first run's subjects wait on a gate the test opens only after the second run was
    # refused: however slow the machine, the first run still holds the store then.
    gate = tmp_path / "gate"
    recipe = make_study(tmp_path / "study", subjects=8, square_params={"gate": str(gate)})
    first = start_run(recipe, "--quiet")
    try:
        wait_for_a_start(recipe.parent, first)
        second = run_cli("run", str(recipe))
    finally:
        gate.touch()
    assert second.returncode == 2, second.stdout + second.stderr
    message = second.stderr + second.stdout
    assert f"pid {first.pid}" in message, message
    assert "Traceback" not in message
    out, _ = first.communicate(timeout=90)
    assert first.returncode == 0, out
    again = run_cli("run", str(recipe), "--quiet")
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(sum(1 for w, *_ in entries if w == "start") == 1 for entries in markers(recipe.parent).values())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["plain-file", "garbage-db"])
def test_foreign_file_where_the_store_should_be_is_refused_and_left_alone(tmp_path: Path, what: str) -> None:
    recipe = make_study(tmp_path / "study", subjects=3)
    store = recipe.parent / ".habitrun" / "store"
    store.parent.mkdir(parents=True)
    if what == "plain-file":
        victim = store
        victim.write_bytes(b"my thesis draft, not a store\n")
    else:
        store.mkdir()
        victim = store / "cache.db"
        victim.write_bytes(os.urandom(4096))
    before = victim.read_bytes()
    result = run_cli("run", str(recipe))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert str(store) in result.stdout + result.stderr
    assert victim.read_bytes() == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_fail_fast_stops_at_the_first_failure_and_exits_1_naming_it(tmp_path: Path, backend: str) -> None:
    recipe = make_study(tmp_path / "study", subjects=30,
                        policy={**backend_policy(backend), "on_subject_failure": "fail_fast", "workers": 1},
                        square_params={"fail": ["S002"], "sleep": 0.05})
    result = run_cli("run", str(recipe))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "S002" in result.stdout and "broken on purpose" in result.stdout
    started = [k for k in markers(recipe.parent) if k.startswith("square-")]
    assert len(started) < 30, "fail_fast kept dispatching"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_failures_are_isolated_retried_and_downstream_skipped(tmp_path: Path, backend: str) -> None:
    recipe = make_study(tmp_path / "study", subjects=6, policy={**backend_policy(backend), "auto_retry_rounds": 1,
                                                          "auto_retry_on": "all"},
                        square_params={"fail": ["S001"]})
    result = run_cli("run", str(recipe))
    assert result.returncode == 1, result.stdout + result.stderr
    starts = [e for e in markers(recipe.parent)["square-S001"] if e[0] == "start"]
    assert len(starts) == 2, "auto_retry_rounds: 1 means two attempts"
    assert "plus_one-S001" not in markers(recipe.parent), "a subject whose upstream failed must be skipped"
    assert all(f"plus_one-S00{i}" in markers(recipe.parent) for i in (0, 2, 3, 4, 5))
    status = run_cli("status", str(recipe))
    assert status.returncode == 1, status.stdout + status.stderr  # the last run failed
    assert "S001" in status.stdout and "broken on purpose" in status.stdout
    # nothing changed: a second run reruns nothing and still reports the failure
    again = run_cli("run", str(recipe), "--quiet")
    assert again.returncode == 1
    assert len([e for e in markers(recipe.parent)["square-S001"] if e[0] == "start"]) == 2


@pytest.mark.timeout(60)
def test_serial_backend_runs_in_process_and_nothing_reruns(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=4,
                        policy={"backend": "serial", "workers": 1, "subject_timeout_sec": None})
    first = run_cli("run", str(recipe), "--quiet")
    assert first.returncode == 0, first.stdout + first.stderr
    pids = {pid for entries in markers(recipe.parent).values() for _, _, pid in entries}
    assert len(pids) == 1, "serial runs every subject in the runner's process"
    second = run_cli("run", str(recipe), "--quiet")
    assert second.returncode == 0
    assert all(sum(1 for w, *_ in e if w == "start") == 1 for e in markers(recipe.parent).values())
