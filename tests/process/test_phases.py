"""A worker's phases: the table's moves and no other, real runs going through the expected ones,
and what a dead worker owed, derived from what it was sent."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import types
from collections import defaultdict

import pytest

from habitrun.engine.contract import FailureKind
from habitrun.engine.control import StopFlag
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.book import StageBook
from habitrun.engine.process.endings import Endings
from habitrun.engine.process.handle import WorkerHandle
from habitrun.engine.process.modes import PersistentMode
from habitrun.engine.process.phases import TRANSITIONS, IllegalTransition, WorkerPhase
from habitrun.spec.policy import RunPolicy
from tests.process.conftest import op, run

S, R, T, P, D = (WorkerPhase.STARTING, WorkerPhase.READY, WorkerPhase.RETIRING, WorkerPhase.STOPPING,
                 WorkerPhase.DEAD)
LEGAL = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}


def _bare_handle(phase: WorkerPhase) -> WorkerHandle:
    handle = object.__new__(WorkerHandle)  # no process: only the phase is exercised
    handle.phase, handle.pid = phase, 4242
    return handle


def test_the_table_is_the_lifecycle_the_dispatch_loop_needs():
    assert LEGAL == {(S, R), (S, T), (S, P), (S, D), (R, T), (R, P), (R, D), (T, P), (T, D), (P, D)}


@pytest.mark.parametrize(("current", "wanted"), sorted(LEGAL, key=str))
def test_every_legal_move_is_allowed(current, wanted):
    handle = _bare_handle(current)
    handle.move(wanted)
    assert handle.phase is wanted


@pytest.mark.parametrize(("current", "wanted"),
                         sorted(set(itertools.product(WorkerPhase, repeat=2)) - LEGAL, key=str))
def test_every_other_move_raises_and_leaves_the_phase(current, wanted):
    handle = _bare_handle(current)
    with pytest.raises(IllegalTransition, match=f"worker 4242 cannot move from {current.value} to {wanted.value}"):
        handle.move(wanted)
    assert handle.phase is current


@pytest.fixture
def moves(monkeypatch):
    """Every phase each worker went through, by pid, recorded at the one place the phase changes."""
    seen: dict[int, list[WorkerPhase]] = defaultdict(list)
    original = WorkerHandle.move

    def move(self, phase):
        if not seen[self.pid]:
            seen[self.pid].append(self.phase)
        original(self, phase)
        seen[self.pid].append(phase)

    monkeypatch.setattr(WorkerHandle, "move", move)
    return seen


def test_a_persistent_worker_starts_serves_is_told_to_exit_and_is_buried(make_backend, tasks, moves):
    b = make_backend(workers=1)
    assert all(o.ok for o in run(b, op("act"), tasks(*[{"do": "ok"}] * 5)).values())
    assert dict(moves) == {b.started_pids[0]: [S, R]}
    b.close()
    assert dict(moves) == {b.started_pids[0]: [S, R, T, D]}


def test_isolated_workers_each_retire_after_their_one_subject(make_backend, tasks, moves):
    b = make_backend(workers=2, parallel_mode="isolated")
    assert all(o.ok for o in run(b, op("act"), tasks(*[{"do": "ok"}] * 4)).values())
    b.close()
    assert len(b.started_pids) == 4
    assert set(moves) == set(b.started_pids)
    for phases in moves.values():  # one still exiting at close() may be signalled on its way out
        assert phases in ([S, R, T, D], [S, R, T, P, D])


def test_a_timed_out_subjects_worker_is_stopped_and_one_that_dies_goes_straight_to_dead(make_backend, tasks, moves):
    b = make_backend(workers=1, subject_timeout_sec=1)
    got = run(b, op("act"), tasks({"do": "sleep"}, {"do": "sigkill"}, {"do": "ok"}))
    assert [got[s].kind for s in ("S0", "S1")] == [FailureKind.TIMEOUT, FailureKind.WORKER_DIED] and got["S2"].ok
    timed_out, died, last = b.started_pids
    assert moves[timed_out] == [S, R, P, D]
    assert moves[died] == [S, R, D]
    assert moves[last] == [S, R]


class _OnePool:
    """The part of a WorkerPool a stage's book and endings use, over one handle."""

    def __init__(self, handle: WorkerHandle) -> None:
        self.handle, self.buried = handle, []
        self.mode = PersistentMode(RunPolicy())
        self.effective = 1

    def live(self):
        return [] if self.buried else [self.handle]

    def note_oom(self):
        pass

    def bury(self, handle):
        handle.move(WorkerPhase.DEAD)
        self.buried.append(handle)


@pytest.mark.parametrize("stopping", [False, True])
def test_what_a_dead_worker_owed_is_derived_from_what_it_was_sent(tasks, stopping):
    """Four runs sent, the worker took three (two finished, replies held; the third running) and died:
    the third fails, the others go back to the queue. Once a stop is asked for, the death is the
    stop's doing: nothing fails, nothing is owed any more (a resume runs them)."""
    parent, child = multiprocessing.Pipe()
    proc = types.SimpleNamespace(pid=os.getpid(), pidfd=None, exitcode=3)
    watched = types.SimpleNamespace(oom_note=None, last_rss_mb=0.0)
    beacon = Beacon()
    handle = WorkerHandle(0, proc, parent, watched, 0.0, beacon)
    stop = StopFlag()
    try:
        handle.bound()
        sent, queued = tasks(*[{"do": "ok"}] * 4), tasks({"id": "Q"})
        pool = _OnePool(handle)
        book = StageBook(queued, pool)
        handle.outstanding.extend(sent)
        assert book.owed() == 5
        beacon.took(3, running=True)
        assert handle.progress()[:2] == (2, 2)
        if stopping:
            stop.set("test")
            book.drop_queue()
        Endings(pool, book, RunPolicy(), stop, op("act")).on_death(handle, now=1.0)
        assert handle.dead and pool.buried == [handle] and not handle.outstanding
        if stopping:
            assert book.owed() == 0 and not book.queue and not book.take_batch()
        else:
            [failed] = book.take_batch()
            assert failed.task is sent[2] and failed.kind == FailureKind.WORKER_DIED
            assert failed.worker_pid == proc.pid
            assert book.owed() == 4
            assert [t.subject_id for t in book.queue] == ["S3", "S0", "S1", "Q"]
    finally:
        handle.close_pidfd()
        stop.close()
        parent.close()
        child.close()
