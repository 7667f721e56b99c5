"""`backend: slurm` end to end on the real one-node SLURM: arrays, detach and resume, lost tasks.

The cluster (tests/cluster/slurm_up.sh) has MaxArraySize 4 and 2 CPUs, so a
stage of 8 chunks is submitted as two arrays and two tasks run at a time.
Every operator call leaves a marker line (tests/engine/study.py), so "done
exactly once" is counted, not assumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from habitrun.planner.plan import GROUP_SUBJECT
from tests.cluster.slurm import jobs
from tests.engine.study import OPS_SOURCE, events, make_study, markers, run_cli
from tests.engine.test_crash_safety import start_run, stored_results

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm")]

NAMES = ("hr-square", "hr-plus_one", "hr-total", "hr-work")


def ours() -> dict[str, str]:
    """Jobs in squeue that these tests submitted (by their names)."""
    out: dict[str, str] = {}
    for name in NAMES:
        out.update(jobs(name))
    return out


def wait_ours_gone(timeout: float = 30.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    left = ours()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = ours()
    return left


@pytest.fixture(autouse=True)
def no_jobs_left_for_the_next_test() -> Iterator[None]:
    """Each test checks that its run left no job; after a failed one, cancel them for the next."""
    yield
    left = ours()
    if left:
        subprocess.run(["scancel", *left], timeout=30, check=False)
        wait_ours_gone(30)


def slurm_policy(**slurm: Any) -> dict[str, Any]:
    return {"backend": "slurm", "workers": 1, "subject_timeout_sec": 60, "graceful_shutdown_sec": 2,
            "auto_retry_rounds": 0,
            "slurm": {"partition": "debug", "time": "00:10:00", "poll_sec": 0.3, "mem": "500M", **slurm}}


def starts(folder: Path) -> dict[str, int]:
    """stage-subject -> how many times its operator started."""
    return {key: sum(1 for what, _, _ in entries if what == "start") for key, entries in markers(folder).items()}


def ends(folder: Path) -> dict[str, int]:
    return {key: sum(1 for what, _, _ in entries if what == "end") for key, entries in markers(folder).items()}


def batches(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((folder / ".habitrun" / "slurm").glob("*/arrays.json"))]


@pytest.mark.timeout(240)
def test_200_subjects_two_map_stages_and_a_collect_each_done_once(tmp_path: Path) -> None:
    n = 200
    recipe = make_study(tmp_path / "study", subjects=n, policy=slurm_policy(chunk_size=25))
    folder = recipe.parent
    done = run_cli("run", str(recipe), "--quiet", timeout=220)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(starts(folder).values()) == {1}, "a subject ran more than once"
    assert len(starts(folder)) == 2 * n and set(ends(folder).values()) == {1}
    results = stored_results(recipe)
    assert all(results[("plus_one", f"S{i:03d}")] == i * i + 1 for i in range(n))
    total = [e for e in events(folder) if e.get("event") == "run_finished"][-1]
    assert total["outcome"] == "success", total
    # the collect's one result: the sum of every plus_one
    assert results[("total", GROUP_SUBJECT)] == {"sum": sum(i * i + 1 for i in range(n)), "n": n}
    # 8 chunks of 25 per map stage: two arrays each (MaxArraySize 4); the collect: one array of one task
    sizes = {b["stage"]: (b["chunks"], len(b["parts"])) for b in batches(folder)}
    assert sizes == {"square": (8, 2), "plus_one": (8, 2), "total": (1, 1)}, sizes
    assert wait_ours_gone(15) == {}, "jobs left in squeue after the run ended"


@pytest.mark.timeout(240)
def test_detach_then_status_then_resume_finishes_the_study(tmp_path: Path) -> None:
    n = 40
    recipe = make_study(tmp_path / "study", subjects=n, policy=slurm_policy(chunk_size=10),
                        square_params={"sleep": 0.05})
    folder = recipe.parent
    started = time.monotonic()
    detached = run_cli("run", str(recipe), "--detach", timeout=120)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    assert "detached" in detached.stdout and "habitrun resume" in detached.stdout, detached.stdout
    left = [e for e in events(folder) if e.get("event") == "stage_detached"]
    assert [(e["stage"], e["subjects"]) for e in left] == [("square", n)] and left[0]["jobs"], left
    assert f"[square] detached: {n} subject(s) left to batch job(s) {', '.join(left[0]['jobs'])}" in detached.stdout
    assert ours(), "the detached run left no array in squeue"
    # the runner is gone by design; status follows the arrays and exits 0 while they run
    seen = run_cli("status", str(recipe), "--json", timeout=60)
    document = json.loads(seen.stdout)
    assert document["run"]["outcome"] == "detached", document["run"]
    assert document["slurm"]["batches"][0]["stage"] == "square", document["slurm"]
    live = document["slurm"]["live_tasks"]
    assert seen.returncode == (0 if live else 1), (seen.returncode, live)
    assert wait_ours_gone(120) == {}, "the detached arrays did not finish"
    text = run_cli("status", str(recipe), timeout=60)
    assert f"shards hold {n} done, 0 failed of {n}" in text.stdout, text.stdout
    assert text.returncode == 1, "a detached run whose arrays ended is not finished: resume it"
    assert "habitrun resume" in text.stdout
    assert set(starts(folder)) == {f"square-S{i:03d}" for i in range(n)}
    finished = run_cli("resume", str(recipe), "--quiet", timeout=150)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert set(starts(folder).values()) == {1}, "resume ran again a subject a shard held"
    assert len(starts(folder)) == 2 * n
    results = stored_results(recipe)
    assert all(results[("plus_one", f"S{i:03d}")] == i * i + 1 for i in range(n))
    after = run_cli("status", str(recipe), "--json", timeout=60)
    assert after.returncode == 0 and json.loads(after.stdout)["run"]["outcome"] == "success", after.stdout
    assert "slurm" not in json.loads(after.stdout), "the merged batches are still listed"
    assert time.monotonic() - started < 230


def test_detach_without_a_slurm_stage_is_refused(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=3)
    refused = run_cli("run", str(recipe), "--detach", timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no stage of this recipe uses backend 'slurm'" in refused.stderr.replace("\n", " ")
    assert "Traceback" not in refused.stderr
    assert not (recipe.parent / ".habitrun" / "runs").exists() or not any((recipe.parent / ".habitrun" / "runs").iterdir())


LOST_OPS = OPS_SOURCE + '''

def work(subject, marker_dir, gate, held=3, sleep=0.05):
    """Each chunk of 6 runs its first subjects, then holds its 4th until the gate file exists."""
    _mark(marker_dir, "work", subject.id, "start")
    if int(subject.fields["n"]) % 6 == held:
        _wait_for_gate(gate)
    time.sleep(sleep)
    _mark(marker_dir, "work", subject.id, "end")
    return int(subject.fields["n"])
'''


def lost_study(folder: Path, n: int) -> Path:
    recipe = make_study(folder, subjects=n, policy=slurm_policy(chunk_size=6))
    (folder / "ops.py").write_text(LOST_OPS)
    data = json.loads(recipe.read_text())
    data["stages"] = [{"name": "work", "operator": "ops:work",
                       "params": {"marker_dir": str(folder / "markers"), "gate": str(folder / "gate")}}]
    recipe.write_text(json.dumps(data, indent=2))
    return recipe


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


def hurry_requeued(name: str) -> int:
    """Start now the array tasks SLURM requeued: it holds them back (reason BeginTime) for about two
    minutes after a requeue, a cluster's own pace that this test need not wait for; how many."""
    out = subprocess.run(["squeue", "-h", "-r", f"--name={name}", "-o", "%i %T %r"], capture_output=True,
                         text=True, timeout=30).stdout
    held_back = [line.split()[0] for line in out.splitlines() if line.split()[1:] == ["PENDING", "BeginTime"]]
    for task in held_back:
        subprocess.run(["scontrol", "update", f"JobId={task}", "StartTime=now"], capture_output=True, timeout=30)
    return len(held_back)


def held(folder: Path, sid: str) -> bool:
    """The subject's operator started (and waits at the gate)."""
    return starts(folder).get(f"work-{sid}", 0) >= 1


@pytest.mark.timeout(240)
def test_a_cancelled_a_requeued_and_a_warned_task_charge_nobody(tmp_path: Path) -> None:
    n = 24  # 4 chunks of 6: one array of 4 tasks, two running at a time
    recipe = lost_study(tmp_path / "study", n)
    folder = recipe.parent
    proc = start_run(recipe, "--quiet")
    try:
        wait_for(lambda: held(folder, "S003") and held(folder, "S009"), 120, "chunks 0 and 1 held", proc)
        array = batches(folder)[0]["parts"][0]["job"]
        subprocess.run(["scancel", f"{array}_0"], check=True, timeout=30)  # cancelled mid-chunk
        subprocess.run(["scontrol", "requeue", f"{array}_1"], check=True, timeout=30)  # requeued mid-chunk
        wait_for(lambda: held(folder, "S015"), 120, "chunk 2 held", proc)
        time.sleep(0.5)
        # SLURM's warning signal, as --signal=B:USR1@N sends it before the end or a pre-emption
        subprocess.run(["scancel", "--batch", "--signal=USR1", f"{array}_2"], check=True, timeout=30)
        time.sleep(1.0)
        (folder / "gate").touch()
        hurried = 0
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            hurried += hurry_requeued("hr-work")
            time.sleep(0.5)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert hurried >= 1, "no task was requeued (scontrol requeue, and the warned session's own)"
    finals = [e for e in events(folder) if e.get("event") == "subject_failed"]
    assert finals == [], finals
    count = starts(folder)
    assert set(ends(folder)) == {f"work-S{i:03d}" for i in range(n)} and set(ends(folder).values()) == {1}, ends(folder)
    repeated = {k: v for k, v in count.items() if v > 1}
    # at most the subject in flight is repeated per event: S003 (cancelled), S009 (requeued), S015 (warned)
    assert set(repeated) <= {"work-S003", "work-S009", "work-S015"}, repeated
    assert all(v == 2 for v in repeated.values()), repeated
    results = stored_results(recipe)
    assert {sid: value for (_stage, sid), value in results.items()} == {f"S{i:03d}": i for i in range(n)}
    assert wait_ours_gone(30) == {}, "jobs left in squeue after the run ended"


@pytest.mark.timeout(180)
def test_ctrl_c_of_an_attached_run_cancels_its_arrays_and_resume_finishes(tmp_path: Path) -> None:
    recipe = lost_study(tmp_path / "study", 18)  # 3 chunks: two held at their 4th subject, one pending
    folder = recipe.parent
    proc = start_run(recipe)
    try:
        wait_for(lambda: held(folder, "S003") and held(folder, "S009"), 120, "chunks 0 and 1 held", proc)
        assert len(ours()) == 3, ours()
        time.sleep(0.5)
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out
    assert "habitrun resume" in out, out
    assert took < 2 + 5 + 10, f"the stop took {took:.1f} s (grace 2 s)"
    assert wait_ours_gone(10) == {}, "Ctrl-C left the run's array tasks in squeue"
    assert "work-S012" not in starts(folder), "the pending chunk ran after the stop"
    (folder / "gate").touch()
    finished = run_cli("resume", str(recipe), "--quiet", timeout=150)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert set(ends(folder)) == {f"work-S{i:03d}" for i in range(18)} and set(ends(folder).values()) == {1}
    repeated = {k: v for k, v in starts(folder).items() if v > 1}
    assert set(repeated) <= {"work-S003", "work-S009"} and set(repeated.values()) <= {2}, repeated
    assert [e for e in events(folder) if e.get("event") == "subject_failed"] == []


@pytest.mark.timeout(180)
def test_a_sigkilled_runners_live_arrays_are_waited_for_by_resume_not_run_again(tmp_path: Path) -> None:
    recipe = lost_study(tmp_path / "study", 12)  # 2 chunks, both held at their 4th subject
    folder = recipe.parent
    proc = start_run(recipe, "--quiet")
    try:
        wait_for(lambda: held(folder, "S003") and held(folder, "S009"), 120, "both chunks held", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    live = ours()
    assert len(live) == 2, f"the killed runner's tasks should run on: {live}"
    resumed = start_run(recipe, "--quiet")  # `run` again: it finds the batch a killed run left
    try:
        time.sleep(3.0)  # the new runner has adopted the live tasks by now, or submitted them again
        assert set(ours()) == set(live), f"the resumed run submitted again what still runs: {ours()}"
        (folder / "gate").touch()
        out, _ = resumed.communicate(timeout=120)
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.communicate()
    assert resumed.returncode == 0, out
    assert set(starts(folder).values()) == {1} and len(starts(folder)) == 12, starts(folder)
    assert {sid: v for (_s, sid), v in stored_results(recipe).items()} == {f"S{i:03d}": i for i in range(12)}
    assert wait_ours_gone(15) == {}


KILLER_OPS = OPS_SOURCE + '''

def _session_pid():
    """The array task's habitrun session: the topmost ancestor running it (a fork server forked from it
    shows the same command line; one started afresh does not)."""
    pid, found = os.getpid(), None
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"habitrun.engine.slurm.session" in f.read():
                found = pid
    return found


def work(subject, marker_dir, slow_killer="S002", fast_killer="S004"):
    _mark(marker_dir, "work", subject.id, "start")
    if subject.id in (slow_killer, fast_killer):
        if subject.id == slow_killer:
            time.sleep(0.5)  # long enough for its session to note it started
        os.kill(_session_pid(), 9)  # the whole array task goes, not just this worker
        time.sleep(60)
    _mark(marker_dir, "work", subject.id, "end")
    return int(subject.fields["n"])
'''


@pytest.mark.timeout(180)
def test_a_subject_that_kills_its_task_twice_is_charged_worker_died_and_the_rest_are_not(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=6, policy=slurm_policy(chunk_size=3))
    folder = recipe.parent
    (folder / "ops.py").write_text(KILLER_OPS)
    data = json.loads(recipe.read_text())
    data["stages"] = [{"name": "work", "operator": "ops:work", "params": {"marker_dir": str(folder / "markers")}}]
    recipe.write_text(json.dumps(data, indent=2))
    done = run_cli("run", str(recipe), "--quiet", timeout=150)
    assert done.returncode == 1, done.stdout + done.stderr
    finals = {e["subject"]: e["kind"] for e in events(folder) if e.get("event") == "subject_failed" and e.get("final")}
    assert finals == {"S002": "worker_died", "S004": "worker_died"}, finals
    assert starts(folder)["work-S002"] == 2, "charged at the second task it killed, not before or after"
    # killed at once, before its session noted its start: its chunk's unfinished subjects were suspects, each
    # run again alone, and the killer charged at the second death it was alone for
    assert starts(folder)["work-S004"] == 3
    finished = {key: n for key, n in ends(folder).items() if n}
    assert set(finished) == {f"work-S{i:03d}" for i in (0, 1, 3, 5)}, finished
    # a subject under 5 ms whose reply its worker held back when the task died runs again (as after a
    # SIGKILL of the runner on the process backend); none is charged
    assert all(n <= 2 for n in finished.values()) and finished["work-S000"] == finished["work-S001"] == 1, finished
    assert wait_ours_gone(15) == {}


@pytest.mark.timeout(120)
def test_a_task_that_cannot_start_habitrun_twice_stops_the_run_saying_what_it_printed(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=4,
                        policy=slurm_policy(chunk_size=4, setup=["echo 'module: python/9.9 not found' >&2", "false"]))
    done = run_cli("run", str(recipe), timeout=100)
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stderr.replace("\n", " ")
    assert "ended twice before its habitrun session began" in said and "python/9.9 not found" in said, said
    assert "Traceback" not in done.stderr
    run = [e for e in events(recipe.parent) if e.get("event") == "run_finished"][-1]
    assert run["outcome"] == "error" and run["exit_code"] == 2, run
    assert [e for e in events(recipe.parent) if e.get("event") == "subject_failed"] == []  # nobody charged
    assert wait_ours_gone(15) == {}


def test_a_submission_the_cluster_refuses_is_the_runs_error_not_the_subjects(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=3, policy=slurm_policy(partition="no-such-partition"))
    done = run_cli("run", str(recipe), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Invalid partition name specified" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert [e for e in events(recipe.parent) if e.get("event") == "subject_failed"] == []
    again = run_cli("run", str(recipe), "policy.slurm.partition=debug", "--stage", "square", "--quiet", timeout=100)
    assert again.returncode == 0, again.stdout + again.stderr


def test_without_the_slurm_commands_the_run_says_so_and_records_its_end(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=3, policy=slurm_policy())
    env = {**os.environ, "PATH": str(tmp_path / "empty")}  # no sbatch, squeue, scancel, scontrol
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "run", str(recipe)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stderr.replace("\n", " ")
    assert "needs the SLURM commands on PATH; not found: sbatch" in said and "Traceback" not in said, said
    run = [e for e in events(recipe.parent) if e.get("event") == "run_finished"][-1]
    assert run["outcome"] == "error" and run["exit_code"] == 2, run
