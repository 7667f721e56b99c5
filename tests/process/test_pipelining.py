"""Short subjects are queued several deep per worker: attribution and timeouts stay exact."""

from __future__ import annotations

import random
import struct

import pytest

from habitrun.engine.contract import FailureKind
from habitrun.engine.process import protocol as P
from tests.process.conftest import op, run


def test_frames_survive_any_read_boundaries():
    payloads = [b"", b"a", b"x" * 70000, P.dumps((P.DONE, True, 1, None, None, None, 0.1))]
    stream = b"".join(P.frame(p) for p in payloads)
    stream += struct.pack("!i", -1) + struct.pack("!Q", 3) + b"big"  # the huge-frame header form
    rng = random.Random(7)
    for _ in range(50):
        reader, got, pos = P.FrameReader(), [], 0
        while pos < len(stream):
            step = rng.randint(1, 9000)
            got += reader.feed(stream[pos:pos + step])
            pos += step
        assert got == [*payloads, b"big"] and not reader.buf


@pytest.mark.timeout(90)
def test_deaths_among_many_short_subjects_are_charged_to_the_running_one(make_backend, tasks):
    b = make_backend(workers=2)
    fields = [{"do": "ok"}] * 400
    fields[150] = {"do": "sigkill"}
    fields[260] = {"do": "exit3"}
    got = run(b, op("act"), tasks(*fields))
    assert len(got) == 400
    assert got["S150"].kind == FailureKind.WORKER_DIED and "SIGKILL" in got["S150"].error
    assert got["S260"].kind == FailureKind.WORKER_DIED and "code 3" in got["S260"].error
    assert all(o.ok for s, o in got.items() if s not in ("S150", "S260"))


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_timeout_counts_from_the_subjects_start_not_from_its_queueing(make_backend, tasks):
    # Short subjects make the runner queue deep; the 0.5 s ones that follow are then queued
    # several to a worker (at least 6 x 0.5 s on one), each well within its 2 s from its own
    # start (a busy machine cannot push one past it) but not from its queueing. The hanging
    # one alone times out; the ones queued behind it are not failed.
    b = make_backend(workers=2, subject_timeout_sec=2.0, graceful_shutdown_sec=0.5)
    fields = [{"do": "ok"}] * 200 + [{"do": "sleep", "sec": 0.5}] * 12 + [{"do": "ok"}] * 100
    fields[100] = {"do": "sleep"}
    got = run(b, op("act"), tasks(*fields))
    assert len(got) == 312
    assert got["S100"].kind == FailureKind.TIMEOUT
    assert all(o.ok for s, o in got.items() if s != "S100")


def test_retire_skips_runs_queued_deep_and_they_run_on_a_fresh_worker(make_backend, tasks):
    b = make_backend(workers=1, persistent_worker_max_consecutive_failures=3)
    fields = [{"do": "ok"}] * 60 + [{"do": "raise"}] * 3 + [{"do": "ok"}] * 60
    got = run(b, op("act"), tasks(*fields))
    assert len(got) == 123
    assert [s for s, o in got.items() if not o.ok] == ["S60", "S61", "S62"]
    assert got["S59"].result["pid"] == got["S62"].worker_pid != got["S63"].result["pid"]


@pytest.mark.timeout(90)
def test_a_stop_with_runs_queued_deep_returns_and_the_rest_runs_in_a_later_call(make_backend, tasks):
    from habitrun.engine.control import StopFlag

    b = make_backend(workers=2, graceful_shutdown_sec=5)
    items = tasks(*[{"do": "ok"}] * 1500)
    stop = StopFlag()
    seen: list[int] = []

    def on_batch(batch):
        seen.append(len(batch))
        if sum(seen) >= 200:
            stop.set("fail_fast: enough")

    got = run(b, op("act"), items, stop=stop, on_batch=on_batch)
    assert 200 <= len(got) < 1500 and all(o.ok for o in got.values())
    rest = [t for t in items if t.subject_id not in got]
    again = run(b, op("act"), rest)
    assert sorted(again) == sorted(t.subject_id for t in rest) and all(o.ok for o in again.values())
