"""The checkpoint store: atomic batches, bulk reads, replacement rules, durability under SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from habitrun.errors import StoreError
from habitrun.store.checkpoint import CheckpointStore, Record, StoreNotFound, UnstorableResult


def ok(stage: str, key: str, sid: str, result: object = None, **kw) -> Record:
    return Record(stage=stage, key=key, subject_id=sid, ok=True, result=result, **kw)


def bad(stage: str, key: str, sid: str, error: str = "ValueError: boom", **kw) -> Record:
    return Record(stage=stage, key=key, subject_id=sid, ok=False, error=error, kind="exception", **kw)


@pytest.fixture
def store(tmp_path: Path):
    s = CheckpointStore.open(tmp_path / "store")
    yield s
    s.close()


def test_put_then_bulk_states_and_results(store: CheckpointStore) -> None:
    store.put([ok("a", f"k{i}", f"S{i}", {"v": i}, log_path=f"/logs/S{i}.log", run_id="r1") for i in range(500)])
    store.put([bad("a", "kf", "SF", attempts=3)])
    keys = [f"k{i}" for i in range(0, 500, 7)] + ["kf", "absent"]
    states = store.states(keys)
    assert set(states) == set(keys) - {"absent"}
    assert states["k7"].ok and states["k7"].log_path == "/logs/S7.log" and states["k7"].run_id == "r1"
    assert not states["kf"].ok and states["kf"].attempts == 3 and states["kf"].error == "ValueError: boom"
    results = store.results(keys)
    assert set(results) == {f"k{i}" for i in range(0, 500, 7)}  # failures have no result
    assert results["k14"] == {"v": 14}
    done, failed = store.stage_outcomes("a")
    assert len(done) == 500 and failed == {"kf"}
    assert store.count("a") == 501 and store.stage_keys("b") == []


def test_large_result_round_trips(store: CheckpointStore) -> None:
    big = {"blob": b"x" * 200_000, "list": list(range(10_000))}  # spilled to a file by diskcache
    store.put([ok("a", "big", "S1", big)])
    assert store.results(["big"])["big"] == big


def _spilled_files(store: CheckpointStore) -> set[str]:
    return {str(p.relative_to(store.directory)) for p in store.directory.rglob("*.val")}


def test_replacing_a_spilled_result_leaves_one_file_and_diskcache_agrees(store: CheckpointStore) -> None:
    def big(tag: str) -> dict:
        return {"blob": tag.encode() * 100_000}

    store.put([ok("a", "big", "S1", big("a")), ok("a", "small", "S2", 1)])
    first = _spilled_files(store)
    assert len(first) == 1
    # replaced in a later batch, and twice within one batch: the last success wins
    store.put([ok("a", "big", "S1", big("b")), ok("a", "big", "S1", big("c")), ok("a", "small", "S2", 2)])
    assert store.results(["big", "small"]) == {"big": big("c"), "small": 2}
    files = _spilled_files(store)
    assert len(files) == 1 and files != first  # the replaced files are gone
    cache = store._cache  # diskcache itself reads the large result, and its counters add up
    assert cache["big"] == big("c") and "small" not in cache and len(cache) == 1
    con = cache._con
    assert con.execute("SELECT value FROM Settings WHERE key = 'size'").fetchone()[0] == \
        con.execute("SELECT sum(size) FROM Cache").fetchone()[0] > 100_000
    assert cache.check() == []  # files, counts and sizes as diskcache expects them


def test_a_result_moves_between_row_and_file_as_its_size_changes(store: CheckpointStore) -> None:
    big = {"blob": b"x" * 200_000}
    store.put([ok("a", "k", "S1", 1)])
    store.put([ok("a", "k", "S1", big)])  # small -> large: the row's copy goes, diskcache holds it
    assert store.results(["k"]) == {"k": big} and len(_spilled_files(store)) == 1
    assert store._cache._con.execute("SELECT mode FROM habitrun_record WHERE key = 'k'").fetchone() == (None,)
    store.put([ok("a", "k", "S1", 2)])  # large -> small: diskcache's row and file go
    assert store.results(["k"]) == {"k": 2} and _spilled_files(store) == set() and len(store._cache) == 0
    store.put([bad("a", "k", "S1")])  # a late failure keeps the stored success and its result
    assert store.results(["k"]) == {"k": 2}
    assert store._cache.check() == []


def test_a_small_result_lives_in_its_record_row(store: CheckpointStore) -> None:
    store.put([ok("a", "k", "S1", {"v": 1}), bad("a", "f", "S2")])
    rows = dict(store._cache._con.execute("SELECT key, value IS NOT NULL FROM habitrun_record").fetchall())
    assert rows == {"k": 1, "f": 0} and len(store._cache) == 0


def test_components_given_as_json_text_are_stored_as_given(store: CheckpointStore) -> None:
    store.put([ok("a", "k1", "S1", 1, components='{"params":"p1","row":"r1"}'), ok("a", "k2", "S2", 1, components={"params": "p2"})])
    latest = store.latest("a")
    assert latest["S1"] == ("k1", {"params": "p1", "row": "r1"}) and latest["S2"] == ("k2", {"params": "p2"})


def test_a_refused_batch_leaves_no_spilled_file(store: CheckpointStore) -> None:
    with pytest.raises(UnstorableResult):
        store.put([ok("a", "big", "S1", {"blob": b"x" * 200_000}), ok("a", "k2", "S2", threading.Lock())])
    assert _spilled_files(store) == set() and store.states(["big"]) == {}


def test_batch_is_all_or_nothing(store: CheckpointStore) -> None:
    batch = [ok("a", "k1", "S1", 1), ok("a", "k2", "S2", threading.Lock()), ok("a", "k3", "S3", 3)]
    with pytest.raises(UnstorableResult) as info:
        store.put(batch)
    assert info.value.record.subject_id == "S2" and "S2" in str(info.value)
    assert store.states(["k1", "k2", "k3"]) == {} and store.results(["k1", "k3"]) == {}
    store.put([batch[0], batch[2]])  # the store is fine afterwards
    assert set(store.results(["k1", "k3"])) == {"k1", "k3"}


def test_success_replaces_failure_but_not_the_reverse(store: CheckpointStore) -> None:
    store.put([bad("a", "k", "S1", attempts=1)])
    store.put([ok("a", "k", "S1", 42, attempts=2)])
    assert store.states(["k"])["k"].ok and store.results(["k"]) == {"k": 42}
    store.put([bad("a", "k", "S1", error="late failure")])
    state = store.states(["k"])["k"]
    assert state.ok and state.error is None and store.results(["k"]) == {"k": 42}
    store.put([ok("a", "k", "S1", 43)])  # a new success (a forced rerun) replaces the old one
    assert store.results(["k"]) == {"k": 43}


def test_latest_failures_and_discard(store: CheckpointStore) -> None:
    store.put([ok("a", "old1", "S1", 1, components={"params": "p1"}), ok("a", "old2", "S2", 1)])
    store.put([ok("a", "new1", "S1", 2, components={"params": "p2"}), bad("b", "bf", "S2")])
    latest = store.latest("a")
    assert latest["S1"] == ("new1", {"params": "p2"}) and latest["S2"][0] == "old2"
    assert [f.key for f in store.failures()] == ["bf"] and store.failures("a") == []
    assert store.discard(["old1", "bf", "nope"]) == 2
    assert store.states(["old1", "bf"]) == {} and store.results(["old1"]) == {}
    assert store.count() == 2


def test_stage_outcomes_with_prefix(store: CheckpointStore) -> None:
    store.put([ok("a", "p1.s1", "S1"), bad("a", "p1.s2", "S2"), ok("a", "p2.s1", "S1"), ok("a", "p10.s9", "S9")])
    assert store.stage_outcomes("a", "p1.") == ({"s1"}, {"s2"})
    assert store.stage_outcomes("a", "p2.") == ({"s1"}, set())


def test_reserved_separator_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(StoreError, match="reserved"):
        store.put([ok("a", "bad\x1fkey", "S1")])


def test_check_recipe_warns_or_refuses(store: CheckpointStore) -> None:
    assert store.check_recipe("study", "a" * 64, strict=False) is None
    assert store.check_recipe("study", "a" * 64, strict=True) is None
    warning = store.check_recipe("study", "b" * 64, strict=False)
    assert warning and "another version of recipe 'study'" in warning
    with pytest.raises(StoreError, match="strict_checkpoint_hash"):
        store.check_recipe("other", "c" * 64, strict=True)
    assert store.recipe_info() == ("study", "b" * 64)  # a refusal does not take the store over


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "s") as s:
        s.put([ok("a", "k", "S", [1, 2])])
        s.check_recipe("r", "x", strict=False)
    with CheckpointStore.open(tmp_path / "s", create=False) as s:
        assert s.results(["k"]) == {"k": [1, 2]} and s.recipe_info() == ("r", "x")


def test_open_without_create_does_not_create(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound):
        CheckpointStore.open(tmp_path / "nothing", create=False)
    assert not (tmp_path / "nothing").exists()
    assert CheckpointStore.exists(tmp_path / "nothing") is False


WRITER = """
import sys
from pathlib import Path
from habitrun.store.checkpoint import CheckpointStore, Record
store = CheckpointStore.open(Path(sys.argv[1]))
batch = 0
while True:
    store.put([Record(stage="a", key=f"b{batch}-{i}", subject_id=f"S{batch}-{i}", ok=True,
                      result={"batch": batch, "i": i, "pad": "x" * (i * 50)}) for i in range(20)])
    print(batch, flush=True)
    batch += 1
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("batches_before_kill", [1, 7, 25])
def test_sigkill_of_a_writer_loses_no_returned_put(tmp_path: Path, child, batches_before_kill: int) -> None:
    store_dir = tmp_path / "store"
    proc = child(WRITER, str(store_dir))
    acknowledged = -1
    while acknowledged < batches_before_kill:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        acknowledged = int(line)
    os.kill(proc.pid, signal.SIGKILL)  # mid-loop: likely inside the next put
    proc.wait(timeout=30)
    for line in proc.stdout.read().splitlines():  # acknowledged before the kill, not yet read by us
        acknowledged = int(line)
    with CheckpointStore.open(store_dir, create=False) as store:
        done, failed = store.stage_outcomes("a")
        assert not failed
        batches: dict[int, int] = {}
        for key in done:
            b = int(key[1:].split("-")[0])
            batches[b] = batches.get(b, 0) + 1
        for b in range(acknowledged + 1):
            assert batches.get(b) == 20, f"batch {b} was acknowledged but is incomplete"
        assert all(n == 20 for n in batches.values()), "a half batch is visible"
        assert max(batches) <= acknowledged + 1
        results = store.results(sorted(done))
        assert set(results) == done  # every record has its result, and the reverse
        for key, value in results.items():
            b, i = (int(x) for x in key[1:].split("-"))
            assert value == {"batch": b, "i": i, "pad": "x" * (i * 50)}


@pytest.mark.timeout(90)
def test_a_concurrent_reader_never_sees_half_a_batch(tmp_path: Path, child) -> None:
    store_dir = tmp_path / "store"
    proc = child(WRITER, str(store_dir))
    assert proc.stdout.readline(), proc.stderr.read()  # the first batch is in
    with CheckpointStore.open(store_dir, create=False) as reader:
        for _ in range(15):
            done, _ = reader.stage_outcomes("a")
            per_batch: dict[str, int] = {}
            for key in done:
                per_batch[key.split("-")[0]] = per_batch.get(key.split("-")[0], 0) + 1
            assert set(per_batch.values()) == {20}
            assert set(reader.results(sorted(done))) == done
    proc.kill()
    proc.wait(timeout=30)


def test_a_store_killed_while_being_created_opens(tmp_path: Path) -> None:
    from habitrun.store.schema import mark_new_store as _mark_new_store

    _mark_new_store(tmp_path / "store").close()  # our tables are in; diskcache never got to run
    assert CheckpointStore.exists(tmp_path / "store")
    with CheckpointStore.open(tmp_path / "store", create=False) as store:
        store.put([ok("a", "k", "S", 1)])
        assert store.results(["k"]) == {"k": 1}


def test_a_reader_opened_before_a_large_result_was_written_still_reads_it(store: CheckpointStore) -> None:
    reader = CheckpointStore.open(store.directory)  # as `habitrun status` beside a running run
    try:
        big = {"blob": b"y" * 200_000}
        store.put([ok("a", "big", "S1", big), ok("a", "small", "S2", 2)])
        assert reader.results(["big", "small"]) == {"big": big, "small": 2}
    finally:
        reader.close()
