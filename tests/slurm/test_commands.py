"""engine/slurm/commands.py: sbatch, squeue, scancel, scontrol on the real one-node SLURM, and each way a call fails.

The SLURM tests need the cluster of tests/cluster/slurm_up.sh (MaxArraySize 4). Their jobs are named
``hr-cmds-test`` and only those are cancelled, never anyone else's.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from habitrun.engine.slurm import commands
from habitrun.engine.slurm.chunking import array_parts
from habitrun.engine.slurm.commands import (
    cancel,
    live_tasks,
    max_array_size,
    parse_squeue,
    requeue,
    sbatch_argv,
    submit,
    why_unavailable,
)
from habitrun.errors import SlurmError
from habitrun.spec.policy import SlurmSettings
from tests.cluster.slurm import jobs, wait_no_jobs

NAME = "hr-cmds-test"
GONE_ID = "67000000"  # above any id this cluster hands out (MaxJobId 67043328): a job SLURM does not know


@pytest.fixture
def own_jobs_cancelled() -> Iterator[None]:
    """After each SLURM test (passed or not), this file's jobs are gone, so no test leaves one queued."""
    yield
    if jobs(NAME):
        subprocess.run(["scancel", f"--name={NAME}"], timeout=30, check=False)
        assert not wait_no_jobs(30, name=NAME)


def sleeper(folder: Path) -> Path:
    script = folder / "task.sh"
    script.write_text("#!/bin/bash\nsleep 60\n")
    script.chmod(0o755)
    return script


def argv_for(folder: Path, array: str, **settings: object) -> list[str]:
    return sbatch_argv(SlurmSettings(mem="50M", time="2", **settings), workers=1, worker_threads=1,  # type: ignore[arg-type]
                       job_name=NAME, array=array, output=str(folder / "slurm-%A_%a.out"),
                       script=sleeper(folder), script_args=["7"])


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(0.1)
        value = predicate()
    return value


# --- the argv, pure ---------------------------------------------------------------------------------


def test_sbatch_argv_asks_for_an_array_of_sessions_with_its_resources_then_the_extra_options(tmp_path):
    settings = SlurmSettings(partition="gpu", time="1:00:00", mem="8G", gres="gpu:1", account="lab", qos="low",
                             extra=("--constraint=avx2",), max_running=3, signal_sec=90)
    argv = sbatch_argv(settings, workers=4, worker_threads=2, job_name="hr-s", array="0-9",
                       output="/o/%A_%a.out", script=tmp_path / "job.sh", script_args=["12"])
    assert argv == ["sbatch", "--parsable", "--job-name=hr-s", "--array=0-9%3", "--output=/o/%A_%a.out", "--open-mode=append",
                    "--signal=B:USR1@90", "--requeue", "--cpus-per-task=8", "--partition=gpu",
                    "--time=1:00:00", "--mem=8G", "--gres=gpu:1", "--account=lab", "--qos=low",
                    "--constraint=avx2", str(tmp_path / "job.sh"), "12"]
    plain = sbatch_argv(SlurmSettings(requeue=False, cpus_per_task=3), workers=4, worker_threads=2,
                        job_name="hr-s", array="0-1", output="o", script=Path("job.sh"), script_args=[])
    assert plain == ["sbatch", "--parsable", "--job-name=hr-s", "--array=0-1", "--output=o", "--open-mode=append",
                     "--signal=B:USR1@120", "--no-requeue", "--cpus-per-task=3", "job.sh"]


def test_squeue_lines_become_array_tasks_with_folded_pending_ones_unfolded():
    text = ("63_[2-3%2] PENDING\n63_1 RUNNING\n64 RUNNING\n65_[0,4-8:2] PENDING\n\n"
            "garbage\n66_0 COMPLETING\n")
    assert parse_squeue(text) == {("63", 2): "PENDING", ("63", 3): "PENDING", ("63", 1): "RUNNING",
                                  ("65", 0): "PENDING", ("65", 4): "PENDING", ("65", 6): "PENDING",
                                  ("65", 8): "PENDING", ("66", 0): "COMPLETING"}
    assert parse_squeue(text, ["65"]) == {("65", i): "PENDING" for i in (0, 4, 6, 8)}


# --- failures that never reach SLURM -------------------------------------------------------------------


def test_missing_commands_are_named_and_a_call_is_a_slurm_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = why_unavailable()
    assert reason is not None and all(name in reason for name in ("sbatch", "squeue", "scancel", "scontrol"))
    with pytest.raises(SlurmError, match="squeue is not installed"):
        live_tasks(["1"])
    with pytest.raises(SlurmError, match="sbatch is not installed"):
        submit(["sbatch", "--parsable", "job.sh"])


def test_a_command_that_hangs_is_a_slurm_error_after_the_timeout(tmp_path, monkeypatch):
    fake = tmp_path / "squeue"  # a controller that never answers: the edge of the world, faked
    fake.write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(commands, "TIMEOUT_SEC", 0.5)
    started = time.monotonic()
    with pytest.raises(SlurmError, match="squeue did not answer within"):
        live_tasks(["1"])
    assert time.monotonic() - started < 10


def test_a_failing_command_says_its_exit_code_and_stderr_last_line(tmp_path, monkeypatch):
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\necho 'squeue: error: first' >&2\necho 'slurm_load_jobs error: Unable to "
                    "contact slurm controller (connect failure)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError) as caught:
        live_tasks(["1"])
    assert caught.value.message == ("squeue failed (exit 1): slurm_load_jobs error: Unable to contact slurm "
                                    "controller (connect failure)")
    assert caught.value.exit_code == 2


# --- the real cluster ------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm", "own_jobs_cancelled")
def test_max_array_size_is_the_clusters():
    assert max_array_size() == 4  # slurm_up.sh sets MaxArraySize=4 for the array tests


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm", "own_jobs_cancelled")
def test_an_array_larger_than_the_cluster_allows_is_refused_with_the_size(tmp_path):
    with pytest.raises(SlurmError) as caught:
        submit(argv_for(tmp_path, "0-5"))
    assert caught.value.message.startswith("sbatch failed (exit 1): ")
    assert "Invalid job array specification" in caught.value.message
    assert "MaxArraySize is 4" in caught.value.message
    assert not jobs(NAME)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm", "own_jobs_cancelled")
def test_a_bad_partition_is_refused_with_sbatchs_message(tmp_path):
    with pytest.raises(SlurmError) as caught:
        submit(argv_for(tmp_path, "0-1", partition="no-such-partition"))
    assert caught.value.message == ("sbatch failed (exit 1): sbatch: error: Batch job submission failed: "
                                    "Invalid partition name specified")
    assert caught.value.exit_code == 2


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm", "own_jobs_cancelled")
def test_six_chunks_go_as_two_arrays_are_seen_task_by_task_and_cancelled(tmp_path):
    parts = array_parts(6, max_array_size())
    assert parts == [(0, 4), (4, 2)]
    ids = [submit(argv_for(tmp_path, f"0-{count - 1}", max_running=1)) for _, count in parts]
    assert all(i.isdigit() for i in ids) and len(set(ids)) == 2
    live = live_tasks(ids)
    expected = {(ids[0], t) for t in range(4)} | {(ids[1], t) for t in range(2)}
    assert set(live) == expected  # %1: at most one task of each array runs, the pending ones one by one
    assert sum(1 for state in live.values() if state == "PENDING") >= 4
    assert set(live.values()) <= {"PENDING", "RUNNING", "CONFIGURING"}
    cancel(ids)
    assert wait_for(lambda: live_tasks(ids) == {}), live_tasks(ids)
    cancel(ids)  # already gone: no error


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm", "own_jobs_cancelled")
def test_arrays_slurm_does_not_know_are_no_live_tasks_and_no_error():
    assert live_tasks([GONE_ID]) == {}  # squeue exits 1 "Invalid job id" for one unknown id
    assert live_tasks([GONE_ID, str(int(GONE_ID) + 1)]) == {}  # and 0 with nothing for several
    assert live_tasks([]) == {}
    cancel([GONE_ID])


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm", "own_jobs_cancelled")
def test_a_running_task_requeued_runs_again_and_a_gone_one_is_an_error(tmp_path):
    array = submit(argv_for(tmp_path, "0-0"))
    # a second on an idle node; the wait is for other users' jobs holding the node's 2 CPUs
    assert wait_for(lambda: live_tasks([array]).get((array, 0)) == "RUNNING", 90), live_tasks([array])
    requeue(f"{array}_0")

    def restarts() -> int:
        shown = subprocess.run(["scontrol", "show", "job", f"{array}_0"], capture_output=True, text=True,
                               timeout=30, check=True).stdout
        return int(shown.split("Restarts=", 1)[1].split()[0])

    assert wait_for(lambda: restarts() == 1)
    assert (array, 0) in live_tasks([array])  # back in the queue, not gone
    cancel([array])
    with pytest.raises(SlurmError, match=r"^scontrol failed \(exit 1\): .*Invalid job id"):
        requeue(GONE_ID)
