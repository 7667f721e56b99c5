"""The recorder: stores outcomes, then reports them, off the dispatch loop's back.

The dispatch loop hands each batch of outcomes over and goes straight back
to feeding workers. One thread writes whatever has piled up in a single
store transaction — the slower the disk, the larger the batches — and only
then emits the events and progress for those subjects. So "reported" always
means "stored": a SIGKILL at any moment loses no subject that was reported,
and a subject that was not yet stored is simply run again by `resume`.

Group commit: after a transaction the thread lets outcomes gather for the
rest of ``GROUP_COMMIT_SEC`` before the next one (a flush or close cuts the
wait short). An outcome is then stored at most that long after it arrived,
and a stage of short subjects pays one commit per few dozen of them instead
of one per subject: a commit costs more than dispatching a subject.

A write that fails (a full disk, a store that became unwritable) ends the
recording: ``on_failure`` is called once so the runner stops dispatching at
once, everything submitted after is dropped (not stored, not reported: a
resume runs those subjects), and ``error`` tells the runner why. Every
batch committed before stays in the store.

Large results: a result over ``LARGE_RESULT_MB`` (pickled; the store reports
the size of every result it keeps in a file) is worth a word, once per
stage: every one is kept in the store, read back by the stages that need it
and copied for each of their subjects, where a file in the subject's work
folder (``subject.workdir``) whose path is returned costs nothing. A
``LargeResult`` event says so after the batch that stored it.

Journal: with a run journal (:mod:`habitrun.store.journal`), each batch is
appended to it on the caller's thread before it is queued, even once a write
failed, and the thread appends the number of the last batch after each
commit. What a SIGKILL of the runner leaves between the two (the commit
window), or a full disk keeps from the store, is stored by the next run from
the journal; nothing runs again for it.

Checkpoints: the thread's commits never copy SQLite's write-ahead log into
the database themselves (that copy fsyncs, and would hold up whichever batch
or end-of-stage flush happened to trigger it); the thread does it after
every ``CHECKPOINT_EVERY_RECORDS``, at a moment when no flush is waiting.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from habitrun.engine.contract import FailureKind
from habitrun.engine.events import Event, LargeResult, SubjectDone, as_failed
from habitrun.store.checkpoint import CheckpointStore, Record, UnstorableResult
from habitrun.store.journal import RunJournal
from habitrun.store.trace import TraceRow

EmitFn = Callable[[list[Event]], None]
log = logging.getLogger(__name__)
_FLUSH = object()
_STOP = object()
GROUP_COMMIT_SEC = 0.2  # at most this long between an outcome's arrival and its commit
CHECKPOINT_EVERY_RECORDS = 2000  # about 16 MB of write-ahead log with subjects of small results
LARGE_RESULT_MB = 10  # a stored result above this (pickled) is warned about, once per stage


class Recorder:
    """A single writer thread in front of the checkpoint store and the event stream."""

    def __init__(self, store: CheckpointStore, emit: EmitFn,
                 on_failure: Callable[[BaseException], None] | None = None,
                 journal: RunJournal | None = None) -> None:
        self.store = store
        self.journal = journal
        self.emit = emit
        self.on_failure = on_failure
        self.stored = 0  # records committed by this recorder
        self.stored_by_stage: dict[str, list[int]] = {}  # stage -> [successes, failures] committed
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._hurry = threading.Event()  # a flush or close is waiting: write without gathering
        self.converted: list[Record] = []  # successes whose result could not be stored (now failures)
        self.large_warned: set[str] = set()  # stages whose large result was warned about
        self._thread = threading.Thread(target=self._loop, name="habitrun-recorder", daemon=True)
        self._thread.start()

    @property
    def error(self) -> BaseException | None:
        """Why recording stopped (a write failed), or None."""
        return self._error

    def submit(self, records: list[Record], events: list[Event], trace: list[tuple] | None = None) -> None:
        """Journal outcomes, then queue them (and their trace rows: store/trace.py's TraceRow fields, as plain
        tuples) to be stored, then
        reported; once a write failed, only journaled."""
        seq = 0
        if records and self.journal is not None:
            seq = self.journal.outcomes(records, trace)
        if self._error is None and (records or events or trace):
            self._queue.put((records, events, trace, seq))

    def flush(self) -> None:
        """Block until everything submitted so far is stored and reported (or dropped: see ``error``)."""
        done = threading.Event()
        self._queue.put((_FLUSH, done, None, 0))
        self._hurry.set()
        done.wait()

    def close(self) -> None:
        if self._thread.is_alive():
            self.flush()
            self._queue.put((_STOP, None, None, 0))
            self._hurry.set()
            self._thread.join()

    # ------------------------------------------------------------------ thread
    def _loop(self) -> None:
        try:
            self.store.defer_checkpoints()
        except Exception:  # noqa: BLE001 - only an optimisation; the thread must reach its loop
            pass
        unchecked = 0  # records committed since the last checkpoint
        while True:
            records: list[Record] = []
            events: list[Event] = []
            trace: list[tuple] = []
            waiters: list[threading.Event] = []
            stop = False
            item = self._queue.get()
            started = time.monotonic()
            last_seq = 0  # the last journaled batch of this commit
            while True:
                first, second, rows, seq = item
                last_seq = seq or last_seq
                if first is _FLUSH:
                    waiters.append(second)
                elif first is _STOP:
                    stop = True
                else:
                    records.extend(first)
                    events.extend(second)
                    if rows:
                        trace.extend(rows)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if self._error is None:
                try:
                    self._write(records, events, trace, last_seq)
                    unchecked += len(records)
                    if unchecked >= CHECKPOINT_EVERY_RECORDS and not waiters and not stop and self._queue.empty():
                        unchecked = 0
                        self.store.checkpoint()
                except BaseException as exc:  # noqa: BLE001 - surfaced to the runner through on_failure/error
                    self._failed(exc)
            for waiter in waiters:
                waiter.set()
            if stop:
                return
            if not waiters:
                # Let the next outcomes gather; a flush or close cuts this short.
                self._hurry.wait(max(0.0, started + GROUP_COMMIT_SEC - time.monotonic()))
            self._hurry.clear()

    def _failed(self, exc: BaseException) -> None:
        self._error = exc
        if self.on_failure is not None:
            try:
                self.on_failure(exc)
            except Exception:  # noqa: BLE001 - the error stays recorded for the runner either way
                pass

    def _write(self, records: list[Record], events: list[Event], trace: list[tuple], seq: int = 0) -> None:
        if records or trace:
            while True:
                try:
                    sizes = self.store.put(records, trace)
                    break
                except UnstorableResult as exc:
                    # Keep the batch: the one result that cannot be stored becomes that subject's failure.
                    bad = exc.record
                    message = f"result cannot be stored: {exc.message}"
                    failed = replace(bad, ok=False, result=None, error=message, kind=FailureKind.UNPICKLABLE)
                    self.converted.append(failed)
                    records = [failed if r is bad else r for r in records]
                    events = [_as_unstorable_event(event, bad, message) for event in events]
                    trace = [_as_unstorable(row, bad, message) for row in trace]
            self.stored += len(records)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("commit: %d record(s), %d trace row(s), journal batch %d; %d stored by this run",
                          len(records), len(trace), seq, self.stored)
            if seq and self.journal is not None:
                self.journal.committed(seq, self.stored)
            for rec in records:
                tally = self.stored_by_stage.get(rec.stage)
                if tally is None:
                    tally = self.stored_by_stage[rec.stage] = [0, 0]
                tally[0 if rec.ok else 1] += 1
            if sizes:
                events = events + self._large_results(records, sizes)
        self.emit(events)

    def _large_results(self, records: list[Record], sizes: dict[str, int]) -> list[Event]:
        """One LargeResult per stage not warned about yet, for its first result over the limit."""
        out: list[Event] = []
        limit = LARGE_RESULT_MB * (1 << 20)
        for rec in records:
            size = sizes.get(rec.key, 0)
            if size > limit and rec.stage not in self.large_warned:
                self.large_warned.add(rec.stage)
                out.append(LargeResult(stage=rec.stage, subject=rec.subject_id, size_mb=round(size / (1 << 20), 1),
                                       limit_mb=LARGE_RESULT_MB))
        return out


def _as_unstorable_event(event: Event, bad: Record, message: str) -> Event:
    """The event of a success whose result could not be stored: its final failure."""
    if isinstance(event, SubjectDone) and event.subject == bad.subject_id and event.stage == bad.stage:
        return as_failed(event, kind=FailureKind.UNPICKLABLE, error=message, log=bad.log_path)
    return event


def _as_unstorable(row: tuple, bad: Record, message: str) -> tuple:
    """The trace row of a success whose result could not be stored: a failure, as its record."""
    named = TraceRow._make(row)
    if named.key != bad.key or named.outcome != "done" or named.stage != bad.stage:
        return row
    return tuple(named._replace(outcome="failed", kind=FailureKind.UNPICKLABLE, error=message, log=bad.log_path))
