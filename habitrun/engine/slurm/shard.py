"""Shards: each array task's append-only, fsynced file of outcomes, which the runner follows.

One file per session incarnation (``shards/chunk-00003.<incarnation>.shard``),
written by that session alone and never by the store: the compute nodes
share only the study's file system with the runner. One line per record,
``urlsafe-base64(pickle(record tuple)) + "\\n"``, each line (or an outcome
batch's lines) written with ONE ``os.write`` on an ``O_APPEND`` descriptor,
an outcome batch then ``fsync``-ed. Records::

    ("begin", info_dict)                  host, pid, job_id, array_job_id, array_task_id, restart, time
    ("start", key, worker_pid, time)      a subject handed to a worker process (in flight)
    ("outcome", key, ok, kind, wire)      ok and kind (a FailureKind or None) in the clear, wire the pickled
                                          engine/wire.py outcome_wire: counting outcomes (status) never
                                          unpickles a result, so never imports the study's code
    ("end", reason, time)                 done | warned | terminated | error: ...

A reader never trusts a file's tail: a line without its ``"\\n"`` (a write in
progress, or the torn tail of a killed session) is left for the next read,
and a line that does not decode is skipped and counted, never raised.
"""

from __future__ import annotations

import base64
import os
import pickle
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from habitrun.engine.contract import FailureKind, SubjectOutcome
from habitrun.engine.invoke import one_line
from habitrun.engine.wire import OutcomeWire, failure_wire, outcome_wire

SHARD_DIR = "shards"
KINDS = {"begin": 2, "start": 4, "outcome": 5, "end": 3}  # kind -> length of its record tuple
_NAME = re.compile(r"^chunk-(\d+)\.(.+)\.shard$")


@dataclass(frozen=True)
class ShardRecord:
    """One record of a shard, with where it came from.

    ``key`` is the subject's (None for begin and end); ``data`` is the rest:
    begin: the info dict; start: ``(worker_pid, time)``; outcome: ``(ok,
    kind, pickled OutcomeWire)`` (see :func:`outcome_ok`, :func:`outcome_wire_of`);
    end: ``(reason, time)``.
    """

    chunk: int
    incarnation: str
    kind: str
    key: str | None
    data: Any

    @property
    def reason(self) -> str | None:
        """An end record's reason (None for the other kinds)."""
        return self.data[0] if self.kind == "end" else None


def shard_name(chunk: int, incarnation: str) -> str:
    return f"chunk-{chunk:05d}.{incarnation}.shard"


def encode(record: tuple) -> bytes:
    """A record as its line."""
    return base64.urlsafe_b64encode(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)) + b"\n"


def decode(line: bytes, chunk: int, incarnation: str) -> ShardRecord | None:
    """The record of a complete line (without its newline); None if it is not one of ours."""
    try:
        record = pickle.loads(base64.urlsafe_b64decode(line))
    except Exception:  # noqa: BLE001 - a damaged line may make unpickling raise anything: it is skipped
        return None
    if not isinstance(record, tuple) or not record or KINDS.get(record[0]) != len(record):
        return None
    kind = record[0]
    if kind == "begin":
        return ShardRecord(chunk, incarnation, kind, None, record[1]) if isinstance(record[1], dict) else None
    if kind == "end":
        return ShardRecord(chunk, incarnation, kind, None, record[1:]) if isinstance(record[1], str) else None
    if not isinstance(record[1], str):
        return None
    if kind == "start":
        return ShardRecord(chunk, incarnation, kind, record[1], record[2:])
    ok, failure, wire = record[2:]
    if not isinstance(ok, bool) or not isinstance(wire, bytes) or not (failure is None or isinstance(failure, str)):
        return None
    return ShardRecord(chunk, incarnation, kind, record[1], (ok, failure, wire))


def outcome_ok(record: ShardRecord) -> bool:
    """Whether an outcome record is a success (read without unpickling its result)."""
    return bool(record.data[0])


def outcome_wire_of(record: ShardRecord) -> OutcomeWire:
    """An outcome record's OutcomeWire (its result unpickled: the study's code may be imported); a result
    that cannot be read here becomes that subject's ``unpicklable`` failure, never an exception."""
    try:
        wire = pickle.loads(record.data[2])
        if isinstance(wire, tuple) and len(wire) == 8:
            return wire
        problem = f"an outcome of {len(wire) if isinstance(wire, tuple) else type(wire).__name__} fields"
    except Exception as exc:  # noqa: BLE001 - whatever unpickling raises is that subject's failure
        problem = one_line(exc)
    return failure_wire(f"its result cannot be read by the runner: {problem}", FailureKind.UNPICKLABLE.value)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte (an O_APPEND write is short only on a full disk or a signal; finish the line)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _storable(outcome: SubjectOutcome) -> bytes:
    """The outcome's line; a result that cannot be pickled is stored as that failure of the subject."""
    kind = None if outcome.ok else (None if outcome.kind is None else str(outcome.kind))
    try:
        wire = pickle.dumps(outcome_wire(outcome), protocol=pickle.HIGHEST_PROTOCOL)
        return encode(("outcome", outcome.task.key, bool(outcome.ok), kind, wire))
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises is the subject's error
        failed = failure_wire(f"result is not picklable: {one_line(exc)}", FailureKind.UNPICKLABLE.value,
                              None, outcome.duration_sec, outcome.worker_pid,
                              None if outcome.usage is None else tuple(outcome.usage))
        return encode(("outcome", outcome.task.key, False, FailureKind.UNPICKLABLE.value,
                       pickle.dumps(failed, protocol=pickle.HIGHEST_PROTOCOL)))


class ShardWriter:
    """Appends one session incarnation's records to its own shard; thread safe."""

    def __init__(self, batch: Path, chunk: int, incarnation: str) -> None:
        folder = Path(batch) / SHARD_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / shard_name(chunk, incarnation)
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._end_torn_tail()

    def _end_torn_tail(self) -> None:
        """An incarnation name met again (a reused pid) after a torn write: end that line first."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    _write_all(self._fd, b"\n")

    def _write(self, data: bytes, sync: bool) -> None:
        with self._lock:
            if self._fd is None:
                raise ValueError(f"shard {self.path} is closed")
            _write_all(self._fd, data)
            if sync:
                os.fsync(self._fd)

    def begin(self, info: dict[str, Any]) -> None:
        self._write(encode(("begin", dict(info))), sync=True)

    def started(self, key: str, pid: int, at: float | None = None) -> None:
        """A subject handed to a worker (not fsynced: losing it loses only a hint)."""
        self._write(encode(("start", key, pid, time.time() if at is None else at)), sync=False)

    def outcomes(self, batch: Sequence[SubjectOutcome]) -> None:
        """A batch of outcomes: one write, then fsync (stored once this returns)."""
        if batch:
            self._write(b"".join(_storable(o) for o in batch), sync=True)

    def end(self, reason: str) -> None:
        self._write(encode(("end", reason, time.time())), sync=True)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class ShardFollower:
    """Reads the new complete lines of every shard of a batch, poll after poll.

    ``bad`` counts the lines skipped as undecodable (a torn line that a later
    write ran into, a file that is not ours).
    """

    def __init__(self, batch: Path) -> None:
        self.folder = Path(batch) / SHARD_DIR
        self.offsets: dict[str, int] = {}
        self.bad = 0

    def poll(self) -> list[ShardRecord]:
        """The records written since the last poll: file by file (by name), each in file order."""
        try:
            names = sorted(entry.name for entry in os.scandir(self.folder) if _NAME.match(entry.name))
        except OSError:
            return []
        records: list[ShardRecord] = []
        for name in names:
            records += self._read_new(name)
        return records

    def _read_new(self, name: str) -> list[ShardRecord]:
        match = _NAME.match(name)
        assert match is not None
        chunk, incarnation = int(match.group(1)), match.group(2)
        offset = self.offsets.get(name, 0)
        try:
            with open(self.folder / name, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return []  # gone or unreadable now: tried again next poll
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offsets[name] = offset + end + 1
        records = []
        for line in data[:end].split(b"\n"):
            record = decode(line, chunk, incarnation)
            if record is None:
                self.bad += 1
            else:
                records.append(record)
        return records


def read_chunk_records(batch: Path, chunk: int) -> list[ShardRecord]:
    """Every complete record of every incarnation of one chunk (a session's list of what is done)."""
    prefix = f"chunk-{chunk:05d}."
    return [r for r in _ChunkFollower(batch, prefix).poll() if r.chunk == chunk]


class _ChunkFollower(ShardFollower):
    """A follower reading only the files of one chunk (a session does not read its peers' shards)."""

    def __init__(self, batch: Path, prefix: str) -> None:
        super().__init__(batch)
        self.prefix = prefix

    def _read_new(self, name: str) -> list[ShardRecord]:
        return super()._read_new(name) if name.startswith(self.prefix) else []
