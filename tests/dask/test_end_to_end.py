"""The real CLI with `policy.backend: dask`: a run, SIGKILL of the runner and resume, and a separate cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.engine.study import events, make_study, markers, run_cli
from tests.engine.test_crash_safety import (
    assert_no_finished_subject_recomputed,
    start_run,
    stored_results,
    wait_for_done_events,
)

pytestmark = [pytest.mark.dask]

DASK_POLICY = {"backend": "dask", "workers": 2, "subject_timeout_sec": 60, "graceful_shutdown_sec": 3}


@pytest.mark.timeout(240)
def test_dask_run_survives_sigkill_of_the_runner_and_resume_loses_nothing(tmp_path: Path) -> None:
    # S005 and later wait on a gate that opens only for the resume: however slow the machine,
    # the runner is killed mid-stage, with subjects running on its workers.
    gate = tmp_path / "gate"
    recipe = make_study(tmp_path / "study", subjects=10, policy=DASK_POLICY,
                        square_params={"sleep": 0.3, "gate": str(gate), "gate_from": 5})
    folder = recipe.parent
    proc = start_run(recipe)
    wait_for_done_events(folder, 3, proc, timeout=120)
    assert proc.poll() is None, "the run ended before the gate opened"
    cluster = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert cluster, "the local Dask cluster's workers should be the runner's children"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()  # type: ignore[union-attr]
    assert wait_gone(cluster, timeout=15.0) == [], "Dask workers outlived the SIGKILLed runner"

    done_before = {e["subject"] for e in events(folder) if e.get("event") == "subject_done" and e["stage"] == "square"}
    assert 3 <= len(done_before) <= 5
    gate.touch()
    final = run_cli("resume", str(recipe), "--quiet", timeout=200)
    assert final.returncode == 0, final.stdout + final.stderr
    assert_no_finished_subject_recomputed(folder)
    results = stored_results(recipe)
    assert all(results[("plus_one", f"S{i:03d}")] == i * i + 1 for i in range(10))
    for sid in done_before:
        assert sum(1 for e in markers(folder)[f"square-{sid}"] if e[0] == "start") == 1


def _dask_cli() -> list[str]:
    exe = Path(sys.executable).parent / "dask"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dask"]


@pytest.mark.timeout(240)
def test_separate_scheduler_and_workers_a_worker_killed_mid_stage(tmp_path: Path) -> None:
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    sched_file = tmp_path / "scheduler.json"
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "cluster-logs"
    logs.mkdir()

    def start(*args: str, name: str) -> subprocess.Popen[bytes]:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen([*_dask_cli(), *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        out.close()
        procs.append(p)
        return p

    try:
        start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(sched_file), name="scheduler")
        deadline = time.monotonic() + 90
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sched_file.exists(), (logs / "scheduler.log").read_text()
        for i in range(2):
            start("worker", "--scheduler-file", str(sched_file), "--nthreads", "1", "--nworkers", "1",
                  "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}", name=f"worker{i}")
        import json

        address = json.loads(sched_file.read_text())["address"]
        recipe = make_study(tmp_path / "study", subjects=12, policy={"backend": "dask"},
                            square_params={"sleep": 0.5})
        folder = recipe.parent
        run = start_run(recipe, f"policy.dask.address={address}", "--quiet")
        wait_for_done_events(folder, 2, run, timeout=150)
        # kill one worker process (the nanny's child) while it runs a subject
        nanny = psutil.Process(procs[1].pid)
        workers = [c for c in nanny.children(recursive=True) if "resource_tracker" not in " ".join(c.cmdline())]
        assert workers, "the dask worker's process was not found"
        workers[-1].kill()
        out, _ = run.communicate(timeout=180)
        assert run.returncode == 0, out
        results = stored_results(recipe)
        assert all(results[("square", f"S{i:03d}")]["square"] == i * i for i in range(12))
        ends = {k: sum(1 for e in v if e[0] == "end") for k, v in markers(folder).items() if k.startswith("square-")}
        assert ends == {f"square-S{i:03d}": 1 for i in range(12)}, ends
        done = [e for e in events(folder) if e.get("event") == "subject_done" and e["stage"] == "square"]
        assert sorted(e["subject"] for e in done) == [f"S{i:03d}" for i in range(12)]
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(p.pid).children(recursive=True):
                    child.kill()
                p.kill()
                p.wait(timeout=10)
