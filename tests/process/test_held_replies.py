"""Workers hold successes briefly so several share a write; never longer than the hold."""

from __future__ import annotations

import os
import select
import time

import pytest

from habitrun.engine.control import StopFlag
from habitrun.engine.process import protocol as P
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.outbox import Outbox
from tests.process.conftest import op, run


def _frames(fd: int, want: int, timeout: float) -> list[bytes]:
    reader, got = P.FrameReader(), []
    deadline = time.monotonic() + timeout
    while len(got) < want and select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        got += reader.read(fd) or []
    return got


def test_a_held_reply_is_sent_by_the_timer_and_a_plain_one_sends_all_in_order():
    r, w = os.pipe()
    try:
        box = Outbox(w, hold_sec=0.05)
        box.send(b"a", hold=True)
        assert not select.select([r], [], [], 0.0)[0]  # held
        assert _frames(r, 1, timeout=5) == [b"a"]  # the timer sent it with nobody asking
        box.send(b"b", hold=True)
        box.send(b"c", hold=True)
        box.send(b"d")  # not held: it and everything before it, in order, in one write
        assert os.read(r, 1 << 16) == b"".join(P.frame(x) for x in (b"b", b"c", b"d"))
    finally:
        os.close(r)
        os.close(w)


def test_a_hold_of_zero_sends_at_once_and_a_vanished_reader_is_not_an_error():
    r, w = os.pipe()
    box = Outbox(w, hold_sec=0.0)
    box.send(b"x", hold=True)
    assert _frames(r, 1, timeout=0.1) == [b"x"]
    os.close(r)
    box.send(b"y")  # EPIPE (SIGPIPE is ignored by the runner and its workers): noted, not raised
    assert box.broken
    os.close(w)


def test_a_beacon_reading_is_what_was_written():
    beacon = Beacon()
    assert beacon.read() == (0, False, 0.0, 0)
    before = time.monotonic()
    beacon.took(3, running=True, output_from=12345)
    reading = beacon.read()
    assert reading.taken == 3 and reading.running and before <= reading.started_at <= time.monotonic()
    assert reading.output_from == 12345
    beacon.ended()
    assert beacon.read()[:2] == (3, False)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_replies_held_by_a_worker_are_not_stuck_behind_a_long_subject(make_backend, tasks):
    # One worker, short subjects queued deep, then a long one: the short ones' replies
    # reach the runner while the long one still runs, not when it ends.
    b = make_backend(workers=1)
    items = tasks(*[{"do": "ok"}] * 40, {"do": "sleep", "sec": 4}, *[{"do": "ok"}] * 5)
    arrived: dict[str, float] = {}

    def report(batch):
        now = time.monotonic()
        for o in batch:
            arrived[o.task.subject_id] = now

    t0 = time.monotonic()
    b.run_tasks(op("act"), items, report, StopFlag())
    assert len(arrived) == 46
    assert arrived["S39"] < arrived["S40"] - 2.0, (arrived["S39"] - t0, arrived["S40"] - t0)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_the_beacon_is_shared_under_every_start_method(make_backend, tasks, start_method):
    # Short subjects (replies held) around a death and a hang: only those two fail, and
    # the hang is stopped by its timeout, which the runner reads from the beacon.
    b = make_backend(workers=2, start_method=start_method, subject_timeout_sec=2, graceful_shutdown_sec=0.5)
    fields = [{"do": "ok"}] * 100 + [{"do": "sleep"}] + [{"do": "ok"}] * 50
    fields[60] = {"do": "sigkill"}
    got = run(b, op("act"), tasks(*fields))
    assert len(got) == 151
    assert {s: o.kind for s, o in got.items() if not o.ok} == {"S60": "worker_died", "S100": "timeout"}


@pytest.mark.timeout(60)
def test_a_longer_subject_s_success_is_sent_at_once_even_with_runs_queued(make_backend, tasks):
    # 20 ms subjects on one worker are queued ahead (depth 7), yet each success goes at once:
    # a held reply would die with a SIGKILLed runner and its subject would run again.
    b = make_backend(workers=1)
    batches: list[int] = []
    b.run_tasks(op("act"), tasks(*[{"do": "sleep", "sec": 0.02}] * 40), lambda batch: batches.append(len(batch)),
                StopFlag())
    assert sum(batches) == 40
    assert len(batches) >= 30, f"replies arrived together: {batches}"  # held, they would come ~5 to a write
