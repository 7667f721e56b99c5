"""The Dask backend on a real one-node SLURM: jobs submitted through dask-jobqueue, killed by the scheduler.

Needs the SLURM of tests/cluster/slurm_up.sh (the ``slurm`` fixture starts it once per session).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from habitrun.planner.plan import plan_study
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from habitrun.store.checkpoint import CheckpointStore
from tests.cluster.slurm import job_of, jobs, wait_no_jobs
from tests.engine.study import OPS_SOURCE, events, make_study, markers, run_cli
from tests.engine.test_crash_safety import (
    assert_no_finished_subject_recomputed,
    start_run,
    stored_results,
    wait_for_done_events,
)

pytestmark = [pytest.mark.dask, pytest.mark.slurm, pytest.mark.usefixtures("slurm")]

# The study's square operator, able to hang, die, or wait for a gate file.
SLURM_OPS = OPS_SOURCE + '''

def work(subject, marker_dir, sleep=0.0, fail=(), die=(), hang=(), gate=None, gated=()):
    _mark(marker_dir, "square", subject.id, "start")
    if subject.id in hang:
        time.sleep(3600)
    if subject.id in die:
        os.kill(os.getpid(), 9)
    if subject.id in gated:
        _wait_for_gate(gate)
    if sleep:
        time.sleep(sleep)
    if subject.id in fail:
        raise ValueError(f"subject {subject.id} is broken on purpose")
    n = int(subject.fields["n"])
    _mark(marker_dir, "square", subject.id, "end")
    return {"n": n, "square": n * n}
'''

JOBQUEUE = {"system": "slurm", "cores": 1, "memory": "1GB", "queue": "debug", "walltime": "00:10:00",
            "death_timeout_sec": 30}


@pytest.fixture(autouse=True)
def no_jobs_left_for_the_next_test() -> Iterator[None]:
    """Each test checks that its run left no job; after a failed one, cancel them for the next."""
    yield
    left = jobs()
    if left:
        subprocess.run(["scancel", *left], timeout=30, check=False)
        wait_no_jobs(30)


def slurm_study(folder: Path, subjects: int, cores: int = 1, **square: Any) -> Path:
    """2 Dask workers: two 1-core jobs, or one job of 2 cores."""
    policy = {"backend": "dask", "workers": 2, "subject_timeout_sec": 12, "graceful_shutdown_sec": 3,
              "auto_retry_rounds": 0, "dask": {"jobqueue": {**JOBQUEUE, "cores": cores}}}
    recipe = make_study(folder, subjects=subjects, policy=policy, square_params=square)
    (folder / "ops.py").write_text(SLURM_OPS)
    recipe.write_text(recipe.read_text().replace('"ops:square"', '"ops:work"'))
    return recipe


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def failures(folder: Path, stage: str) -> dict[str, str]:
    return {e["subject"]: e["kind"] for e in events(folder)
            if e.get("event") == "subject_failed" and e["stage"] == stage and e.get("final")}


@pytest.mark.timeout(180)
def test_200_subjects_on_slurm_with_failures_and_a_scancelled_job(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    n = 200
    # one job running both workers: cancelling it leaves none until habitrun replaces it
    recipe = slurm_study(tmp_path / "study", n, cores=2, sleep=0.02, fail=["S010"], die=["S020"], hang=["S030"],
                         gate=str(gate), gated=["S150"])
    folder = recipe.parent
    assert wait_no_jobs(30) == {}, "the SLURM should be empty before the test"
    proc = start_run(recipe, "--quiet")
    try:
        # S150 holds its worker until the gate opens: cancel that worker's job under it
        start_file = folder / "markers" / "square-S150.log"
        wait_for(lambda: start_file.exists() and start_file.read_text().strip(), 120, "S150 started", proc)
        pid = int(start_file.read_text().split()[2])
        time.sleep(0.5)  # S150 is announced running (and its batch's finished subjects sent) after 0.1 s
        job = job_of(pid)
        assert job is not None and job in jobs(), f"S150 does not run in a SLURM job (pid {pid}): {jobs()}"
        # the job's two workers: S150's and one running fast subjects
        killed = {p for e in markers(folder).values() for _, _, p in e if job_of(p) == job}
        subprocess.run(["scancel", job], check=True, timeout=30)
        before = set(jobs())
        assert before == {job}, before
        wait_for(lambda: job not in jobs(), 30, f"job {job} gone from squeue")
        replacement = wait_for(lambda: set(jobs()) - before, 60, "a job replacing the cancelled one", proc)
        assert len(replacement) == 1, jobs()
        # S150 runs again on the new job's workers (and waits there for the gate)
        wait_for(lambda: len(markers(folder)["square-S150"]) >= 2, 60, "S150 started again", proc)
        gate.touch()
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out
    assert failures(folder, "square") == {"S010": "exception", "S020": "worker_died", "S030": "timeout"}, out
    # the cancelled job's subject ran again elsewhere and finished; nothing else failed
    s150 = markers(folder)["square-S150"]
    assert [what for what, _, _ in s150] == ["start", "start", "end"], s150
    assert s150[1][2] != pid
    results = stored_results_ok(recipe, n, {"S010", "S020", "S030"})
    assert results[("square", "S150")]["square"] == 150 * 150
    assert_no_finished_subject_recomputed(folder)
    # a subject ran twice only if its first run finished on a worker killed during a fast subject
    # of the same batch (S020's, or the cancelled job's) before the result was sent, never stored
    killed.add(markers(folder)["square-S020"][0][2])
    for key, entries in markers(folder).items():
        ends = [e for e in entries if e[0] == "end"]
        if key.startswith("square-") and len(ends) > 1:
            assert ends[0][2] in killed, f"{key} ran twice: {entries}"
    assert wait_no_jobs(15) == {}, "jobs left in squeue after the run ended"


def stored_results_ok(recipe: Path, n: int, failed: set[str]) -> dict[tuple[str, str], Any]:
    """Every subject but ``failed`` has both stages' results stored."""
    loaded = load_recipe(recipe)
    store = CheckpointStore.open(loaded.store_dir(), create=False)
    try:
        plan = plan_study(loaded, load_subjects(loaded), store)
        out: dict[tuple[str, str], Any] = {}
        for name in ("square", "plus_one"):
            keys = plan.stages[name].keys
            found = store.results(keys.values())
            for i in range(n):
                sid = f"S{i:03d}"
                if sid in failed:
                    continue
                assert keys[sid] in found, f"{name}/{sid} has no stored result"
                out[(name, sid)] = found[keys[sid]]
        return out
    finally:
        store.close()


@pytest.mark.timeout(180)
def test_resume_after_sigkill_of_the_runner_cancels_its_orphaned_jobs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    recipe = slurm_study(tmp_path / "study", 12, sleep=0.2, gate=str(gate),
                         gated=[f"S{i:03d}" for i in range(5, 12)])
    folder = recipe.parent
    proc = start_run(recipe, "--quiet")
    try:
        wait_for_done_events(folder, 3, proc, timeout=120)
        assert proc.poll() is None, "the run ended before the gate opened"
        orphans = jobs()
        assert len(orphans) == 2, orphans
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    time.sleep(1.0)
    assert set(jobs()) == set(orphans), "the orphaned jobs should still be there (their workers wait 30 s)"
    done_before = {e["subject"] for e in events(folder) if e.get("event") == "subject_done" and e["stage"] == "square"}
    gate.touch()
    final = run_cli("resume", str(recipe), "--quiet", timeout=150)
    assert final.returncode == 0, final.stdout + final.stderr
    assert not set(jobs()) & set(orphans), f"resume left the orphaned jobs {orphans} running"
    assert wait_no_jobs(15) == {}, "jobs left in squeue after the resumed run ended"
    assert_no_finished_subject_recomputed(folder)
    results = stored_results(recipe)
    assert all(results[("plus_one", f"S{i:03d}")] == i * i + 1 for i in range(12))
    for sid in done_before:
        assert sum(1 for e in markers(folder)[f"square-{sid}"] if e[0] == "start") == 1
