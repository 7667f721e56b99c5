"""Batch folders: what the runner writes for an array and every task reads back."""

from __future__ import annotations

import os
import pickle
import subprocess

import pytest

from habitrun.engine.contract import OperatorRef, SubjectTask
from habitrun.engine.slurm.batch import (
    BatchSpec,
    chunk_file,
    chunk_keys,
    read_chunk,
    read_spec,
    write_batch,
    write_job_script,
)
from habitrun.errors import BatchError, SlurmError
from habitrun.spec.policy import RunPolicy

OP = OperatorRef(stage="s", path="ops:act", params={"n": 1}, search_path=("/recipe",))


def _tasks(*ids: str) -> list[SubjectTask]:
    return [SubjectTask(key=f"k-{i}", subject_id=i, fields={"f": i}, inputs={"in": [i]}, workdir=f"/w/{i}",
                        log_path=f"/l/{i}.log", attempt=2) for i in ids]


def _policy(**slurm: object) -> dict:
    return RunPolicy.from_dict({"backend": "slurm", "workers": 2, "slurm": slurm or None}).to_dict()


def test_a_batch_reads_back_as_written(tmp_path):
    chunks = [_tasks("a", "b"), _tasks("c")]
    spec = write_batch(tmp_path / "b1", stage="s", op=OP, policy=_policy(), scratch_dir="/scratch", chunks=chunks)
    assert read_spec(tmp_path / "b1") == spec
    assert (spec.stage, spec.op, spec.chunks, spec.scratch_dir, spec.requeue, spec.format) == (
        "s", OP, 2, "/scratch", True, 1)
    assert RunPolicy.from_dict(spec.policy).workers == 2
    assert read_chunk(tmp_path / "b1", 0) == chunks[0] and read_chunk(tmp_path / "b1", 1) == chunks[1]
    assert chunk_keys(tmp_path / "b1", 0) == ["k-a", "k-b"]
    assert (tmp_path / "b1" / "out").is_dir() and (tmp_path / "b1" / "shards").is_dir()
    assert not [p for p in (tmp_path / "b1").iterdir() if p.name.endswith(".tmp")]


def test_requeue_follows_the_policy_unless_given(tmp_path):
    off = write_batch(tmp_path / "a", stage="s", op=OP, policy=_policy(requeue=False), scratch_dir=None, chunks=[])
    given = write_batch(tmp_path / "b", stage="s", op=OP, policy=_policy(), scratch_dir=None, chunks=[],
                        requeue=False)
    assert off.requeue is False and given.requeue is False


def test_a_missing_or_damaged_batch_is_a_clear_error(tmp_path):
    with pytest.raises(BatchError, match="batch spec .* is missing"):
        read_spec(tmp_path)
    (tmp_path / "session.pkl").write_bytes(b"not a pickle")
    with pytest.raises(BatchError, match="damaged or not habitrun's"):
        read_spec(tmp_path)
    (tmp_path / "session.pkl").write_bytes(pickle.dumps({"stage": "s"}))
    with pytest.raises(BatchError, match="holds a dict"):
        read_spec(tmp_path)
    spec = write_batch(tmp_path, stage="s", op=OP, policy=_policy(), scratch_dir=None, chunks=[_tasks("a")])
    (tmp_path / "session.pkl").write_bytes(pickle.dumps(BatchSpec(**{**spec.__dict__, "format": 99})))
    with pytest.raises(BatchError, match="format 99"):
        read_spec(tmp_path)
    with pytest.raises(BatchError, match="chunk 1 .* is missing"):
        read_chunk(tmp_path, 1)
    chunk_file(tmp_path, 0).write_bytes(pickle.dumps([("only", "two")]))
    with pytest.raises(BatchError, match="not a list of habitrun tasks"):
        chunk_keys(tmp_path, 0)
    assert issubclass(BatchError, SlurmError) and BatchError("x").exit_code == 2


def test_the_job_script_runs_its_setup_then_the_session(tmp_path):
    batch = tmp_path / "with space"
    batch.mkdir()
    script = write_job_script(batch, python="/opt/py 3/bin/python", setup=["module load python", "echo ready"])
    assert os.access(script, os.X_OK)
    lines = script.read_text().splitlines()
    assert lines[:4] == ["#!/bin/bash", "set -e", "module load python", "echo ready"]
    assert lines[4] == f"""exec '/opt/py 3/bin/python' -m habitrun.engine.slurm.session '{batch}' "$1\""""
    failing = write_job_script(batch, python="/bin/echo", setup=["false"])  # set -e: a failed setup stops it
    done = subprocess.run([str(failing), "7"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stdout == ""
    args = tmp_path / "args"
    args.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    args.chmod(0o755)
    shown = write_job_script(batch, python=str(args), setup=[])
    done = subprocess.run([str(shown), "7"], capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == ["-m", "habitrun.engine.slurm.session", str(batch), "7"]
