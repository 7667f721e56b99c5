"""A run's journal: the outcomes its runner received and how many the store committed, outside SQLite.

Two faults the store alone cannot see or avoid:

* Outcomes the runner has received but the recorder has not committed yet
  (the group-commit window, :mod:`habitrun.engine.recorder`) are lost with a
  SIGKILL of the runner, and `resume` would run those subjects again.
* A commit that SQLite lost without a word: noise written into, or the
  deletion of, ``cache.db-wal`` after a kill makes SQLite drop every commit
  from the damaged frame on, and its checks find nothing wrong.

So the runner appends every batch of outcomes it books here, with a plain
``write()`` and no fsync, before the recorder stores it (a SIGKILL keeps the
page cache; only a machine crash loses the tail, and then the group commit
was the bound anyway); and the recorder appends, after each commit, the
number of the last batch it committed. The next run stores the outcomes that
never reached the store without running their subjects again, and `plan`,
`status` and `run` compare what was committed with what the store holds
(:mod:`habitrun.store.recovery`).

Format: ``MAGIC``, then frames of a 4-byte length and a 4-byte CRC-32 of the
payload (big-endian), the payload a pickled tuple:

* ``(HEADER, run_id, store_dir, ts)``, first;
* ``(OUTCOMES, seq, ts, rows, trace, unkept)``: a batch as the recorder got it:
  ``rows`` each a tuple of the :data:`FIELDS` of a record whose result is kept;
  ``unkept`` the (stage, subject, key) of records whose result is over
  :data:`RESULT_MAX` bytes (or cannot be pickled): counted, not restorable;
* ``(COMMITTED, seq, total)``: every batch up to ``seq`` is in the store,
  ``total`` records committed by this run so far;
* ``(FORGOTTEN, keys)``: records the run removed on purpose
  (``clear_checkpoint_on_success``).

A frame that is short or fails its checksum ends the reading: a torn tail.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from habitrun.store.records import Record

JOURNAL_FILE = "journal.bin"
MAGIC = b"HABITRUN-JOURNAL-1\n"
HEADER, OUTCOMES, COMMITTED, FORGOTTEN = "header", "outcomes", "committed", "forgotten"
FIELDS = ("stage", "key", "subject_id", "ok", "result", "error", "kind", "attempts", "components", "run_id",
          "log_path", "duration_sec")
RESULT_MAX = 64 * 1024  # a larger result is not journaled (its subject runs again after a kill)
BATCH_MAX = 16 * 1024 * 1024  # a batch pickled larger is looked at record by record
_FRAME = struct.Struct(">II")
_row_of = attrgetter(*FIELDS)


def record_of(*row: Any) -> Record:
    """A journal row (the :data:`FIELDS` of a record, in that order) back into a Record."""
    return Record(**dict(zip(FIELDS, row, strict=True)))


def _frame(payload: Any) -> bytes:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME.pack(len(data), zlib.crc32(data)) + data


def _kept(rows: list[tuple], records: Sequence[Record]) -> tuple[list[tuple], list[tuple[str, str, str]]]:
    """The rows whose result is small enough to keep, and the (stage, subject, key) of the others
    (too large, or not picklable), looked at record by record."""
    kept, unkept = [], []
    for row, rec in zip(rows, records, strict=True):
        try:
            if len(pickle.dumps(row[4], protocol=pickle.HIGHEST_PROTOCOL)) <= RESULT_MAX:
                kept.append(row)
                continue
        except Exception:  # noqa: BLE001 - the store refuses it too (a failure then)
            pass
        unkept.append((rec.stage, rec.subject_id, rec.key))
    return kept, unkept


class RunJournal:
    """The writing end of a run's journal (one per run; the dispatch and recorder threads share it).

    A write that fails (a full disk) is passed to ``on_error`` once and the journal writes
    nothing more: the run stops as for any file of its folder it cannot write.
    """

    def __init__(self, path: Path, run_id: str, store_dir: str | Path,
                 on_error: Callable[[OSError], None] | None = None) -> None:
        self.path = Path(path)
        self.on_error = on_error
        self.broken = False
        self.seq = 0
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._write(MAGIC + _frame((HEADER, run_id, str(store_dir), time.time())))

    def outcomes(self, records: Sequence[Record], trace: Sequence[tuple] | None) -> int:
        """Append a batch (before the recorder stores it); its sequence number.

        One pickle of the whole frame when its results are small on average (the usual
        batch, often of one outcome: this runs once per reply on the dispatch thread);
        else record by record, keeping what is small enough.
        """
        rows = [_row_of(r) for r in records]
        trace_rows = list(trace or ())
        self.seq += 1
        ts = time.time()
        try:
            data = pickle.dumps((OUTCOMES, self.seq, ts, rows, trace_rows, []), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an unpicklable result: found record by record below
            data = None
        if data is not None and len(data) <= min(RESULT_MAX * len(rows), BATCH_MAX):
            self._write(_FRAME.pack(len(data), zlib.crc32(data)) + data)
        else:
            kept, unkept = _kept(rows, records)
            self._write(_frame((OUTCOMES, self.seq, ts, kept, trace_rows, unkept)))
        return self.seq

    def committed(self, seq: int, total: int) -> None:
        """Every batch up to ``seq`` is in the store; ``total`` records committed by the run."""
        self._write(_frame((COMMITTED, seq, total)))

    def forgotten(self, keys: Sequence[str]) -> None:
        """These records were removed on purpose: not lost."""
        if keys:
            self._write(_frame((FORGOTTEN, list(keys))))

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self.broken or self._fd is None:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError as exc:
                self.broken = True
                if self.on_error is not None:
                    self.on_error(exc)


@dataclass
class Batch:
    """One OUTCOMES frame as read back."""

    seq: int
    ts: float
    rows: list[tuple]
    trace: list[tuple]
    unkept: list[tuple[str, str, str]]


@dataclass
class JournalContent:
    """What a journal says, up to its first damaged or torn frame."""

    path: Path
    run_id: str = ""
    store_dir: str = ""
    started: float = 0.0
    batches: list[Batch] = field(default_factory=list)
    committed_seq: int = 0
    committed_total: int = 0
    forgotten: set[str] = field(default_factory=set)
    torn: bool = False  # reading stopped at a frame that is short or fails its checksum


def _frames(data: bytes) -> Iterator[Any]:
    at = len(MAGIC)
    while at + _FRAME.size <= len(data):
        size, crc = _FRAME.unpack_from(data, at)
        start = at + _FRAME.size
        body = data[start:start + size]
        if len(body) != size or zlib.crc32(body) != crc:
            raise ValueError("torn")
        yield pickle.loads(body)
        at = start + size
    if at != len(data):
        raise ValueError("torn")


def read_journal(path: Path) -> JournalContent | None:
    """A journal's content; None when the file is not a journal (or cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if not data.startswith(MAGIC):
        return None
    content = JournalContent(Path(path))
    try:
        for frame in _frames(data):
            kind = frame[0]
            if kind == OUTCOMES:
                content.batches.append(Batch(*frame[1:]))
            elif kind == COMMITTED:
                content.committed_seq, content.committed_total = frame[1], frame[2]
            elif kind == FORGOTTEN:
                content.forgotten.update(frame[1])
            elif kind == HEADER:
                content.run_id, content.store_dir, content.started = frame[1], frame[2], frame[3]
    except Exception:  # noqa: BLE001 - a torn tail (or a frame this habitrun cannot rebuild): stop there
        content.torn = True
    return content if content.run_id else None
