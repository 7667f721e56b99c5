"""The array task's session, run as the real program on a real batch folder (no SLURM needed).

The operators are the backend behaviour suite's (tests/backends/ops): a
subject's ``do`` field says whether it succeeds, raises, sleeps or kills its
worker; each call leaves a line in a marker file, so a test counts runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from habitrun.engine.contract import FailureKind, OperatorRef, SubjectTask
from habitrun.engine.slurm.batch import read_chunk, read_spec, write_batch, write_job_script
from habitrun.engine.slurm.session import main
from habitrun.engine.slurm.shard import ShardRecord, outcome_wire_of, read_chunk_records
from habitrun.spec.policy import RunPolicy
from tests.backends.conftest import OPS_DIR, OPS_MODULE

BASE = {"backend": "slurm", "workers": 1, "subject_timeout_sec": 60, "subject_spawn_timeout_sec": 60,
        "graceful_shutdown_sec": 10, "persistent_worker_max_consecutive_failures": 100}


def make_batch(root: Path, *fields: dict[str, Any], **policy: Any) -> Path:
    """A batch of one chunk, subject S<i> doing ``fields[i]``; markers under root/markers."""
    (root / "markers").mkdir(exist_ok=True)
    op = OperatorRef(stage="s", path=f"{OPS_MODULE}:act", params={"marker_dir": str(root / "markers")},
                     search_path=(str(OPS_DIR),))
    tasks = [SubjectTask(key=f"key-S{i}", subject_id=f"S{i}", fields=dict(f), inputs={},
                         workdir=str(root / "work" / f"S{i}"), log_path=str(root / "logs" / f"S{i}.log"))
             for i, f in enumerate(fields)]
    batch = root / "batch"
    write_batch(batch, stage="s", op=op, policy=RunPolicy(**{**BASE, **policy}).to_dict(),
                scratch_dir=str(root / "scratch"), chunks=[tasks])
    return batch


def session_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "HABITRUN_SLURM_CHUNK": "0", **extra}


def start(batch: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "habitrun.engine.slurm.session", str(batch), "0"],
                            env=session_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def runs(root: Path) -> dict[str, int]:
    return {f.stem: len(f.read_text().splitlines()) for f in (root / "markers").glob("*.log")}


def outcomes(records: list[ShardRecord]) -> dict[str, tuple]:
    got: dict[str, tuple] = {}
    for r in records:
        if r.kind == "outcome":
            assert r.key not in got, f"{r.key} has two outcomes"
            got[r.key] = outcome_wire_of(r)  # type: ignore[index]
    return got


def wait_started(batch: Path, key: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.kind == "start" and r.key == key for r in read_chunk_records(batch, 0)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} never started: {read_chunk_records(batch, 0)}")


def test_outcomes_are_charged_as_on_the_process_backend_and_a_second_incarnation_skips_them(tmp_path):
    batch = make_batch(tmp_path, {"do": "ok"}, {"do": "raise"}, {"do": "sleep"}, {"do": "sigkill"}, {"do": "ok"},
                       workers=2, subject_timeout_sec=1.0)
    script = write_job_script(batch, python=sys.executable, setup=["echo setup ran >&2"])
    done = subprocess.run([str(script), "0"], env=session_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "setup ran\n", done.stderr
    records = read_chunk_records(batch, 0)
    assert records[0].kind == "begin" and records[-1].kind == "end" and records[-1].reason == "done"
    assert records[0].data["subjects"] == 5 and records[0].data["skipped"] == 0
    got = outcomes(records)
    assert sorted(got) == [f"key-S{i}" for i in range(5)]
    assert got["key-S0"][:2] == (True, {"id": "S0", "pid": got["key-S0"][6], "stage": 1})
    assert got["key-S4"][0] is True
    raised, slow, died = got["key-S1"], got["key-S2"], got["key-S3"]
    assert raised[2:4] == ("ValueError: subject S1 is broken on purpose", FailureKind.EXCEPTION)
    assert slow[3] == FailureKind.TIMEOUT and "subject_timeout_sec" in slow[2]
    assert died[3] == FailureKind.WORKER_DIED and "SIGKILL" in died[2]
    assert {r.key for r in records if r.kind == "start"} >= {"key-S2"}  # in a worker's hands long enough

    again = start(batch)
    assert finish(again) == (0, "")
    second = [r for r in read_chunk_records(batch, 0) if r.incarnation != records[0].incarnation]
    assert [r.kind for r in second] == ["begin", "end"] and second[-1].reason == "done"
    assert second[0].data["skipped"] == 5
    assert runs(tmp_path) == {f"S{i}": 1 for i in range(5)}


def test_the_warning_signal_stops_taking_subjects_ends_warned_and_requeues_the_task(tmp_path):
    batch = make_batch(tmp_path, *[{"do": "sleep", "sec": 0.5}] * 8, workers=2, start_method="fork")
    bin_dir = tmp_path / "bin"  # the edge of the world: SLURM's scontrol, recording what it was asked
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.log'}\n")
    (bin_dir / "scontrol").chmod(0o755)
    proc = start(batch, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0", PATH=f"{bin_dir}:{os.environ['PATH']}")
    wait_started(batch, "key-S1")
    proc.send_signal(signal.SIGUSR1)
    assert finish(proc) == (0, "")
    first = read_chunk_records(batch, 0)
    assert first[0].incarnation == f"4242-0-{proc.pid}" and first[-1].reason == "warned"
    got = outcomes(first)
    assert {"key-S0", "key-S1"} <= set(got) and len(got) < 8, sorted(got)
    assert all(wire[0] for wire in got.values()), got  # the running one finished; no subject was charged
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"

    requeued = start(batch, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="1", PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert finish(requeued) == (0, "")
    records = read_chunk_records(batch, 0)
    assert records[-1].incarnation == f"4242-1-{requeued.pid}" and records[-1].reason == "done"
    assert sorted(outcomes(records)) == [f"key-S{i}" for i in range(8)]
    assert runs(tmp_path) == {f"S{i}": 1 for i in range(8)}
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"  # done: no requeue


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_term_stops_at_once_and_the_deaths_it_caused_are_nobodys_failure(tmp_path, method):
    # SLURM signals every process of the job: here the workers (and their fork server) first, the
    # session a moment later, the order that makes the session see a death before its own TERM
    # (forkserver: no new worker can start, the stage looks broken; fork: a new one runs the next subject)
    batch = make_batch(tmp_path, {"do": "sleep", "sec": 60}, {"do": "sleep", "sec": 0.1}, {"do": "sleep", "sec": 60},
                       start_method=method)
    proc = start(batch)
    wait_started(batch, "key-S0")
    session = psutil.Process(proc.pid)
    for child in session.children(recursive=True):
        child.send_signal(signal.SIGTERM)
    time.sleep(0.15)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert finish(proc) == (0, "")
    assert time.monotonic() - t0 < 10
    records = read_chunk_records(batch, 0)
    assert records[-1].kind == "end" and records[-1].reason == "terminated"
    assert "key-S0" not in outcomes(records), records
    assert all(wire[0] for wire in outcomes(records).values())


def test_term_alone_ends_terminated_and_leaves_no_worker(tmp_path):
    batch = make_batch(tmp_path, {"do": "sleep", "sec": 60}, {"do": "ok"}, start_method="fork")
    proc = start(batch)
    wait_started(batch, "key-S0")
    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc) == (0, "")
    records = read_chunk_records(batch, 0)
    assert records[-1].reason == "terminated" and outcomes(records) == {}
    assert not psutil.wait_procs(workers, timeout=10)[1]


def test_an_unreadable_batch_exits_2_with_one_line(tmp_path):
    proc = start(tmp_path / "nowhere")
    code, err = finish(proc)
    assert code == 2 and err.count("\n") == 1 and "is missing" in err and "Traceback" not in err, err


@pytest.mark.parametrize(("argv", "env", "said"), [
    (["B"], {}, "usage:"),
    (["B", "0"], {"HABITRUN_SLURM_CHUNK": None}, "neither SLURM_ARRAY_TASK_ID nor HABITRUN_SLURM_CHUNK"),
    (["B", "x"], {}, "whole numbers"),
    (["B", "0"], {"SLURM_ARRAY_TASK_ID": "3"}, "chunk 3 is not in batch"),
    (["B", "0"], {"DAMAGE": "chunk"}, "damaged or not habitrun's"),
    (["B", "0"], {"DAMAGE": "policy"}, "policy is not valid here (another habitrun version?): workers: Input should"),
])
def test_what_a_session_cannot_use_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, env, said):
    batch = make_batch(tmp_path, {"do": "ok"})
    monkeypatch.setenv("HABITRUN_SLURM_CHUNK", "0")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    for name, value in env.items():
        if name == "DAMAGE" and value == "chunk":
            (batch / "chunk-00000.pkl").write_bytes(b"\x80\x05garbage")
        elif name == "DAMAGE":
            spec = read_spec(batch)
            write_batch(batch, stage="s", op=spec.op, policy={**spec.policy, "workers": 0}, scratch_dir=None,
                        chunks=[read_chunk(batch, 0)])
        elif value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    assert main([str(batch) if a == "B" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert not (batch / "shards").exists() or not list((batch / "shards").iterdir())


def test_a_warned_session_abandons_a_subject_past_the_grace_without_charging_it(tmp_path):
    batch = make_batch(tmp_path, {"do": "sleep", "sec": 60}, {"do": "ok"}, graceful_shutdown_sec=0.5,
                       start_method="fork")
    proc = start(batch)  # not under SLURM: nothing to requeue
    wait_started(batch, "key-S0")
    proc.send_signal(signal.SIGUSR1)
    t0 = time.monotonic()
    assert finish(proc) == (0, "")
    assert time.monotonic() - t0 < 15
    records = read_chunk_records(batch, 0)
    assert records[-1].reason == "warned" and outcomes(records) == {}
    assert runs(tmp_path) == {"S0": 1}


def test_a_death_held_when_the_warning_comes_is_not_written_after_it(tmp_path):
    # a worker dies; the warning comes within the hold; the other subject runs on past the hold
    batch = make_batch(tmp_path, {"do": "sleep", "sec": 2.5}, {"do": "sigkill"}, workers=2, start_method="fork")
    proc = start(batch)
    deadline = time.monotonic() + 30
    while not (tmp_path / "markers" / "S1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    assert finish(proc) == (0, "")
    records = read_chunk_records(batch, 0)
    assert records[-1].reason == "warned"
    assert list(outcomes(records)) == ["key-S0"], outcomes(records)


def test_an_operator_that_cannot_be_built_ends_the_session_with_its_error(tmp_path):
    batch = make_batch(tmp_path, {"do": "ok"}, {"do": "ok"}, start_method="fork")
    spec = read_spec(batch)
    op = OperatorRef(stage="s", path=f"{OPS_MODULE}:Unbuildable", search_path=spec.op.search_path)
    write_batch(batch, stage="s", op=op, policy=spec.policy, scratch_dir=None, chunks=[read_chunk(batch, 0)])
    code, err = finish(start(batch))
    assert code == 2 and err.count("\n") == 1 and "cannot construct its operator" in err, err
    records = read_chunk_records(batch, 0)
    assert records[-1].kind == "end" and records[-1].reason.startswith("error: OperatorBindError: stage 's': cannot construct")
    assert outcomes(records) == {}


def test_a_task_slurm_gave_gpus_pins_one_to_each_worker(tmp_path):
    # no GPU here: SLURM's part is its environment (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES), which is all
    # the session reads; each worker must see exactly one of the task's devices
    # subjects of 0.5 s: both workers get some (instant ones may all go to the first worker up)
    batch = make_batch(tmp_path, *[{"do": "gpu", "sec": "0.5"}] * 6, workers=3)
    code, err = finish(start(batch, SLURM_JOB_GPUS="3,5", CUDA_VISIBLE_DEVICES="3,5"))
    assert code == 0, err
    got = outcomes(read_chunk_records(batch, 0))
    seen = {wire[1]["pid"]: wire[1]["cuda"] for wire in got.values()}
    assert set(seen.values()) == {"3", "5"} and len(seen) == 2, seen  # 3 workers capped to the 2 GPUs
    (tmp_path / "plain").mkdir()
    unpinned = make_batch(tmp_path / "plain", *[{"do": "gpu"}] * 2, workers=2)
    code, err = finish(start(unpinned, CUDA_VISIBLE_DEVICES="3,5"))  # not given by SLURM: left alone
    assert code == 0, err
    assert {wire[1]["cuda"] for wire in outcomes(read_chunk_records(unpinned, 0)).values()} == {"3,5"}


def test_a_session_keeps_its_scratch_files_in_a_folder_of_its_own(tmp_path):
    # sessions of one batch run side by side on a node and share the run's scratch folder: a process backend
    # removes its scratch folder when it closes (if empty), which must never be the shared one, or a sibling
    # session's worker starting at that moment finds no folder to write its output to (seen in CI)
    batch = make_batch(tmp_path, {"do": "ok"}, {"do": "ok"})
    shared = tmp_path / "scratch"
    shared.mkdir()
    code, err = finish(start(batch))
    assert code == 0, err
    assert shared.is_dir(), "the session removed the scratch folder its sibling sessions share"
    assert list(shared.iterdir()) == []  # its own folder (slurm-<incarnation>) is gone with it
