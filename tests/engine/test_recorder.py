"""The recorder: stored before reported, unstorable results become failures, checkpoints off the commit path."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import habitrun.engine.recorder as recorder_module
from habitrun.engine.events import SubjectDone, event_dict
from habitrun.engine.recorder import Recorder
from habitrun.store.checkpoint import CheckpointStore, Record


def ok(i: int, result: object = None) -> Record:
    return Record("s", f"k{i}", f"S{i}", True, i if result is None else result)


@pytest.fixture
def store(tmp_path: Path):
    s = CheckpointStore.open(tmp_path / "store")
    yield s
    s.close()


@pytest.mark.timeout(60)
def test_every_reported_subject_is_already_stored(store: CheckpointStore) -> None:
    reader = CheckpointStore.open(store.directory)  # another connection, as a resume would read
    seen_unstored: list[str] = []

    def emit(events: list[dict]) -> None:
        keys = [f"k{e['subject'][1:]}" for e in events]
        stored = reader.states(keys)
        seen_unstored.extend(k for k in keys if k not in stored)

    rec = Recorder(store, emit)
    try:
        for i in range(0, 300, 3):
            rec.submit([ok(i), ok(i + 1), ok(i + 2)],
                       [{"event": "subject_done", "subject": f"S{j}"} for j in (i, i + 1, i + 2)])
        rec.flush()
    finally:
        rec.close()
        reader.close()
    assert seen_unstored == [] and store.count("s") == 300


@pytest.mark.timeout(60)
def test_an_unstorable_result_becomes_that_subjects_failure_and_the_rest_is_kept(store: CheckpointStore) -> None:
    emitted: list = []
    rec = Recorder(store, emitted.extend)
    try:
        rec.submit([ok(1), ok(2, threading.Lock()), ok(3)],
                   [SubjectDone(stage="s", subject=f"S{i}", attempt=1) for i in (1, 2, 3)])
        rec.flush()
    finally:
        rec.close()
    states = store.states(["k1", "k2", "k3"])
    assert states["k1"].ok and states["k3"].ok and not states["k2"].ok
    assert "cannot be stored" in (states["k2"].error or "")
    assert [event_dict(e)["event"] for e in emitted] == ["subject_done", "subject_failed", "subject_done"]
    assert [r.subject_id for r in rec.converted] == ["S2"]


@pytest.mark.timeout(60)
def test_checkpoints_run_between_batches_never_inside_a_flush(store: CheckpointStore, monkeypatch) -> None:
    monkeypatch.setattr(recorder_module, "CHECKPOINT_EVERY_RECORDS", 50)
    calls: list[int] = []
    real_checkpoint = store.checkpoint
    monkeypatch.setattr(store, "checkpoint", lambda: (calls.append(1), real_checkpoint())[1])
    gate, holding = threading.Event(), threading.Event()

    def emit(events: list[dict]) -> None:
        if events and events[0].get("hold"):
            holding.set()
            gate.wait(30)

    rec = Recorder(store, emit)
    submitted = 0
    deadline = time.monotonic() + 30
    try:
        while not calls and time.monotonic() < deadline:  # batches the recorder writes on its own
            rec.submit([ok(i) for i in range(submitted, submitted + 60)], [])
            submitted += 60
            time.sleep(recorder_module.GROUP_COMMIT_SEC * 2)
        assert calls, "no checkpoint after batches written with nothing waiting"
        before = len(calls)
        rec.submit([ok(submitted)], [{"hold": True}])  # the recorder stops in this batch's report
        submitted += 1
        assert holding.wait(30)
        rec.submit([ok(i) for i in range(submitted, submitted + 60)], [])  # past the threshold...
        submitted += 60
        flusher = threading.Thread(target=rec.flush)
        flusher.start()
        while rec._queue.qsize() < 2 and flusher.is_alive():  # ...and queued together with the flush
            time.sleep(0.01)
        gate.set()
        flusher.join(30)
    finally:
        gate.set()
        rec.close()
    assert len(calls) == before  # written for a flush: the flush did not wait for a checkpoint
    assert store.count("s") == submitted


@pytest.mark.timeout(120)
def test_deferred_checkpoints_leave_commits_alone_until_asked(tmp_path: Path) -> None:
    def wal_size_after_puts(defer: bool) -> int:
        folder = tmp_path / ("deferred" if defer else "automatic")
        with CheckpointStore.open(folder) as s:
            if defer:
                s.defer_checkpoints()
            for start in range(0, 3000, 100):  # about 10 MB of pages, past the 4 MB automatic limit
                s.put([ok(i, "x" * 2000) for i in range(start, start + 100)])
            size = (folder / "cache.db-wal").stat().st_size
            assert s.checkpoint()
            assert s.count("s") == 3000
            return size

    automatic, deferred = wal_size_after_puts(defer=False), wal_size_after_puts(defer=True)
    assert automatic < 5 << 20  # SQLite copied the log inside commits, starting it over at 4 MB
    assert deferred > 6 << 20  # no commit copied it
