"""Shards: what a session appends and the runner follows; torn and damaged lines never break a reader."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading

from habitrun.engine.contract import FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.slurm.shard import (
    ShardFollower,
    ShardWriter,
    encode,
    outcome_ok,
    outcome_wire_of,
    read_chunk_records,
    shard_name,
)
from habitrun.engine.usage import Usage


def outcome_line(key: str, wire: tuple) -> bytes:
    """An outcome record's line as a session writes it."""
    return encode(("outcome", key, wire[0], wire[3], pickle.dumps(wire)))


def _task(key: str) -> SubjectTask:
    return SubjectTask(key=key, subject_id=key, fields={}, inputs={}, workdir="/w", log_path="/l")


def _ok(key: str, result: object = None) -> SubjectOutcome:
    return SubjectOutcome(task=_task(key), ok=True, result={"v": key} if result is None else result,
                          duration_sec=0.5, worker_pid=123, usage=Usage(*range(len(Usage._fields))))


def test_records_come_back_in_file_order_once_each_and_new_ones_on_the_next_poll(tmp_path):
    writer = ShardWriter(tmp_path, 3, "77-0-100")
    writer.begin({"host": "n1", "pid": 100})
    writer.started("a", 4242, 10.0)
    writer.outcomes([_ok("a"), SubjectOutcome(task=_task("b"), ok=False, error="ValueError: no",
                                              kind=FailureKind.EXCEPTION, traceback="tb", duration_sec=1.0)])
    follower = ShardFollower(tmp_path)
    got = follower.poll()
    assert [(r.kind, r.key) for r in got] == [("begin", None), ("start", "a"), ("outcome", "a"), ("outcome", "b")]
    assert all(r.chunk == 3 and r.incarnation == "77-0-100" for r in got)
    assert got[0].data == {"host": "n1", "pid": 100}
    assert got[1].data == (4242, 10.0)
    ok, result, error, kind, _tb, duration, pid, usage = outcome_wire_of(got[2])
    assert (ok, result, error, kind, duration, pid) == (True, {"v": "a"}, None, None, 0.5, 123)
    assert usage == tuple(range(len(Usage._fields)))
    assert outcome_wire_of(got[3])[:4] == (False, None, "ValueError: no", "exception")
    assert not outcome_ok(got[3]) and got[3].data[1] == "exception" and outcome_ok(got[2])
    assert follower.poll() == []
    writer.end("done")
    writer.close()
    (end,) = follower.poll()
    assert end.kind == "end" and end.reason == "done" and end.key is None
    assert follower.bad == 0
    assert read_chunk_records(tmp_path, 3) == got + [end]
    assert read_chunk_records(tmp_path, 2) == []


def test_each_incarnation_writes_its_own_file_and_a_chunk_reads_all_of_its_own(tmp_path):
    for chunk, incarnation, key in ((0, "5-0-1", "a"), (0, "5-1-2", "b"), (1, "6-0-3", "c")):
        writer = ShardWriter(tmp_path, chunk, incarnation)
        writer.outcomes([_ok(key)])
        writer.close()
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        shard_name(0, "5-0-1"), shard_name(0, "5-1-2"), shard_name(1, "6-0-3")]
    assert [(r.incarnation, r.key) for r in read_chunk_records(tmp_path, 0)] == [("5-0-1", "a"), ("5-1-2", "b")]
    assert [r.key for r in ShardFollower(tmp_path).poll()] == ["a", "b", "c"]


def test_a_line_without_its_newline_waits_for_the_next_poll(tmp_path):
    writer = ShardWriter(tmp_path, 0, "local-0-1")
    writer.outcomes([_ok("a")])
    line = outcome_line("b", (True, 1, None, None, None, 0.1, 9, None))
    path = writer.path
    writer.close()
    follower = ShardFollower(tmp_path)
    with open(path, "ab") as f:
        f.write(line[:10])
    assert [r.key for r in follower.poll()] == ["a"]
    assert follower.poll() == [] and read_chunk_records(tmp_path, 0)[-1].key == "a"
    with open(path, "ab") as f:
        f.write(line[10:])
    (late,) = follower.poll()
    assert late.key == "b" and outcome_wire_of(late)[1] == 1 and follower.bad == 0


TORN_WRITER = """
import os, signal, sys
from habitrun.engine.slurm.shard import ShardWriter, encode
writer = ShardWriter(sys.argv[1], 0, sys.argv[2])
writer.begin({"pid": os.getpid()})
line = encode(("outcome", "torn", True, None, b"x" * 5000))
os.write(os.open(str(writer.path), os.O_WRONLY | os.O_APPEND), line[: len(line) // 2])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_session_killed_mid_line_leaves_a_torn_tail_that_readers_ignore(tmp_path):
    killed = subprocess.run([sys.executable, "-c", TORN_WRITER, str(tmp_path), "9-0-1"], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    follower = ShardFollower(tmp_path)
    assert [r.kind for r in follower.poll()] == ["begin"]
    nxt = ShardWriter(tmp_path, 0, "9-1-2")  # the requeued incarnation: its own file, never after the tail
    nxt.outcomes([_ok("torn")])
    nxt.close()
    assert [(r.incarnation, r.kind, r.key) for r in follower.poll()] == [("9-1-2", "outcome", "torn")]
    assert [r.kind for r in read_chunk_records(tmp_path, 0)] == ["begin", "outcome"]
    assert follower.bad == 0


def test_undecodable_lines_are_skipped_and_counted_never_raised(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    garbage = [b"!!not base64!!", b"", encode(("nonsense", 1))[:-1], encode(["outcome", "a", None])[:-1],
               encode(("outcome", "a", 1, None, b"x"))[:-1], encode(("start", 5, 1, 2.0))[:-1], b"gARdlC4=",
               outcome_line("ok", (True, 1, None, None, None, 0.1, 9, None))[:-1]]
    (folder / shard_name(0, "x-0-1")).write_bytes(b"\n".join(garbage) + b"\n")
    (folder / "notes.txt").write_bytes(b"not a shard\n")
    follower = ShardFollower(tmp_path)
    assert [r.key for r in follower.poll()] == ["ok"]
    assert follower.bad == len(garbage) - 1


def test_a_writer_meeting_a_torn_tail_in_its_file_ends_that_line_first(tmp_path):
    first = ShardWriter(tmp_path, 0, "local-0-7")
    first.begin({})
    first.close()
    with open(first.path, "ab") as f:
        f.write(encode(("end", "done", 1.0))[:7])
    again = ShardWriter(tmp_path, 0, "local-0-7")  # the same name again (a reused pid)
    again.outcomes([_ok("a")])
    again.close()
    follower = ShardFollower(tmp_path)
    assert [r.kind for r in follower.poll()] == ["begin", "outcome"] and follower.bad == 1


def test_a_result_that_cannot_be_pickled_is_stored_as_that_subjects_failure(tmp_path):
    writer = ShardWriter(tmp_path, 0, "local-0-1")
    writer.outcomes([_ok("lock", result=threading.Lock()), _ok("fine")])
    writer.close()
    lock, fine = read_chunk_records(tmp_path, 0)
    locked, fined = outcome_wire_of(lock), outcome_wire_of(fine)
    assert lock.key == "lock" and locked[0] is False and locked[3] == FailureKind.UNPICKLABLE
    assert "not picklable" in locked[2] and locked[5] == 0.5 and lock.data[1] == FailureKind.UNPICKLABLE
    assert fine.key == "fine" and fined[0] is True and outcome_ok(fine)


def test_writes_from_threads_keep_their_lines_whole(tmp_path):
    writer = ShardWriter(tmp_path, 0, "local-0-1")

    def many(prefix: str) -> None:
        for i in range(200):
            if i % 2:
                writer.started(f"{prefix}{i}", os.getpid())
            else:
                writer.outcomes([_ok(f"{prefix}{i}"), _ok(f"{prefix}{i}+")])

    threads = [threading.Thread(target=many, args=(p,)) for p in "xyz"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    follower = ShardFollower(tmp_path)
    assert len(follower.poll()) == 3 * (100 + 200) and follower.bad == 0
