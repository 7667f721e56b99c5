"""A batch folder: what the array tasks of one submission read (the stage's spec, its chunks, job.sh).

The runner writes it under ``<study>/.habitrun/slurm/<batch-id>/`` before
submitting; each array task's session reads the spec and its own chunk, and
writes only below ``shards/`` (and SLURM below ``out/``). The spec is
written last and by rename, so a batch whose ``session.pkl`` is there is
complete. Layout (docs: design of issue 35)::

    session.pkl        pickle of BatchSpec
    chunk-00000.pkl    pickle of list[TaskWire], chunk 0 ...
    job.sh             the script sbatch runs: setup lines, then the session
    out/               slurm-%A_%a.out of each task
    shards/            chunk-00003.<incarnation>.shard
"""

from __future__ import annotations

import os
import pickle
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from habitrun.engine.contract import OperatorRef, SubjectTask
from habitrun.engine.wire import TaskWire, task_from_wire, task_wire
from habitrun.errors import BatchError

FORMAT = 1
SPEC_FILE = "session.pkl"
JOB_SCRIPT = "job.sh"
OUT_DIR = "out"
SHARD_DIR = "shards"
SESSION_MODULE = "habitrun.engine.slurm.session"


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """What every array task of a batch needs besides its chunk: the stage, its operator and policy."""

    format: int
    stage: str
    op: OperatorRef
    policy: dict[str, Any]  # RunPolicy.to_dict() of the stage, as the session's ProcessBackend gets it
    scratch_dir: str | None
    chunks: int
    created: float
    requeue: bool = True  # a warned session asks `scontrol requeue` for itself (sbatch --requeue)


def chunk_file(folder: Path, index: int) -> Path:
    return Path(folder) / f"chunk-{index:05d}.pkl"


def _write_atomic(path: Path, data: bytes) -> None:
    """Write by rename: a reader sees the whole file or none (a runner killed mid-write leaves no half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_batch(folder: Path, *, stage: str, op: OperatorRef, policy: dict[str, Any], scratch_dir: str | None,
                chunks: Sequence[Sequence[SubjectTask]], requeue: bool | None = None) -> BatchSpec:
    """Write the chunks, then the spec (last, so a batch with a spec is whole); return the spec.

    ``requeue`` defaults to the policy's ``slurm.requeue`` (True when it has no slurm settings).
    """
    folder = Path(folder)
    for sub in ("", OUT_DIR, SHARD_DIR):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    if requeue is None:
        slurm = policy.get("slurm") or {}
        requeue = bool(slurm.get("requeue", True))
    for index, chunk in enumerate(chunks):
        wires: list[TaskWire] = [task_wire(task) for task in chunk]
        _write_atomic(chunk_file(folder, index), pickle.dumps(wires, protocol=pickle.HIGHEST_PROTOCOL))
    spec = BatchSpec(format=FORMAT, stage=stage, op=op, policy=dict(policy), scratch_dir=scratch_dir,
                     chunks=len(chunks), created=time.time(), requeue=requeue)
    _write_atomic(folder / SPEC_FILE, pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    return spec


def _load(path: Path, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        raise BatchError(f"{what} {path} is missing") from None
    except OSError as exc:
        raise BatchError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever unpickling raises, the file is not ours or is damaged
        raise BatchError(f"{what} {path} is damaged or not habitrun's: {type(exc).__name__}: {exc}") from None


def read_spec(folder: Path) -> BatchSpec:
    """The batch's spec; :class:`BatchError` with a clear message if it is missing, damaged or of another format."""
    path = Path(folder) / SPEC_FILE
    spec = _load(path, "the batch spec")
    if not isinstance(spec, BatchSpec):
        raise BatchError(f"the batch spec {path} is not habitrun's (it holds a {type(spec).__name__})")
    if spec.format != FORMAT:
        raise BatchError(f"the batch spec {path} has format {spec.format}; this habitrun reads format {FORMAT} "
                         "(the compute nodes run another habitrun version than the runner?)")
    return spec


def _read_wires(folder: Path, index: int) -> list[TaskWire]:
    path = chunk_file(folder, index)
    wires = _load(path, f"chunk {index}")
    if not isinstance(wires, list) or not all(isinstance(w, tuple) and len(w) == 7 for w in wires):
        raise BatchError(f"chunk {index} ({path}) is not a list of habitrun tasks")
    return wires


def read_chunk(folder: Path, index: int) -> list[SubjectTask]:
    """The tasks of chunk ``index``; :class:`BatchError` if it is missing or damaged."""
    return [task_from_wire(wire) for wire in _read_wires(Path(folder), index)]


def chunk_keys(folder: Path, index: int) -> list[str]:
    """The keys of chunk ``index``, in order (the runner's books; no task is built)."""
    return [wire[0] for wire in _read_wires(Path(folder), index)]


def write_job_script(folder: Path, *, python: str, setup: Sequence[str]) -> Path:
    """Write ``job.sh``, the script every array task runs: its argument is the batch's chunk offset.

    The session is ``exec``-ed, so it is the job's batch shell: SLURM's warning
    signal (``--signal=B:USR1@N``) reaches it and nothing else.
    """
    folder = Path(folder)
    lines = ["#!/bin/bash", "set -e", *setup,
             f'exec {shlex.quote(python)} -m {SESSION_MODULE} {shlex.quote(str(folder.resolve()))} "$1"', ""]
    path = folder / JOB_SCRIPT
    _write_atomic(path, "\n".join(lines).encode())
    path.chmod(0o755)
    return path
