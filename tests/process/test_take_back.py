"""Runs queued in a busy worker are taken back when another worker is idle (RECALL / RECALLED)."""

from __future__ import annotations

import random

import pytest

from tests.process.conftest import op, run


@pytest.mark.timeout(120)
def test_the_idle_worker_takes_back_the_runs_queued_behind_a_long_one(make_backend, tasks, tmp_path):
    # 200 trivial subjects teach the runner to queue deep; the long one is then queued with
    # short ones behind it. The other worker runs every one of those while the long one runs:
    # none waits for it, and none runs twice (each subject claims a marker file).
    b = make_backend(workers=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    fields = [{"sec": 0}] * 200 + [{"sec": 4}] + [{"sec": 0.001}] * 60
    got = run(b, op("once", {"marks": str(marks)}), tasks(*fields))
    assert len(got) == 261 and all(o.ok for o in got.values()), [o.error for o in got.values() if not o.ok]
    long = got["S200"].result
    after = [got[f"S{i}"].result for i in range(201, 261)]
    assert all(r["pid"] != long["pid"] for r in after)
    assert all(r["ended"] < long["ended"] for r in after)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_take_backs_among_mixed_durations_run_each_subject_exactly_once(make_backend, tasks, tmp_path):
    b = make_backend(workers=3)
    marks = tmp_path / "marks"
    marks.mkdir()
    rng = random.Random(3)
    fields = [{"sec": rng.choice([0, 0, 0, 0.002, 0.01, 0.2])} for _ in range(500)]
    got = run(b, op("once", {"marks": str(marks)}), tasks(*fields))
    assert len(got) == 500 and all(o.ok for o in got.values()), [o.error for o in got.values() if not o.ok]
    assert len(list(marks.iterdir())) == 500


@pytest.mark.timeout(120)
def test_a_second_stage_after_take_backs_runs_on_the_same_workers(make_backend, tasks, tmp_path):
    b = make_backend(workers=2)
    for stage in ("a", "b"):
        marks = tmp_path / stage
        marks.mkdir()
        fields = [{"sec": 0}] * 150 + [{"sec": 1}] + [{"sec": 0}] * 40
        got = run(b, op("once", {"marks": str(marks)}, stage=stage), tasks(*fields, stage=stage))
        assert len(got) == 191 and all(o.ok for o in got.values())
    assert len(b.started_pids) == 2


def test_a_recall_takes_exactly_the_runs_not_taken_and_says_how_many():
    # The worker's inbox on a real pipe: two runs taken, three waiting, then a RECALL.
    import socket
    from multiprocessing.connection import Connection

    from habitrun.engine.process import protocol as P
    from habitrun.engine.process.inbox import Inbox
    from habitrun.engine.process.outbox import Outbox

    runner, worker = socket.socketpair()
    conn = Connection(worker.detach())
    inbox = Inbox(conn, Outbox(conn.fileno(), 0.0), on_runner_gone=lambda: None)
    try:
        def send(*messages):
            runner.sendall(b"".join(P.frame(P.dumps(m)) for m in messages))

        send(P.bind_message(None), *[(P.RUN, i) for i in range(5)])
        assert inbox.get()[0] == P.BIND
        assert [inbox.get()[1] for _ in range(2)] == [0, 1]  # taken: these run here
        send((P.RECALL,), (P.RUN, 5))
        reader = P.FrameReader()
        replies: list = []
        while not replies:
            replies = [P.loads(f) for f in reader.feed(runner.recv(4096))]
        assert replies == [P.recalled_message(3)]  # runs 2, 3 and 4, never taken here
        assert inbox.get() == (P.RUN, 5)  # what was sent after the RECALL stays
        assert inbox.empty()
        send((P.EXIT,))
        assert inbox.get() == (P.EXIT,)
    finally:
        runner.close()
        conn.close()
