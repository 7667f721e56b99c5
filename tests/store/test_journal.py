"""The run journal on disk: batches and commit marks read back; a torn or damaged tail ends the reading."""

from __future__ import annotations

import os
from pathlib import Path

from habitrun.store.journal import RESULT_MAX, RunJournal, read_journal
from habitrun.store.records import Record


def record(i: int, result: object = None) -> Record:
    return Record(stage="s", key=f"k{i}", subject_id=f"S{i}", ok=True, result={"i": i} if result is None else result,
                  run_id="r1", components='{"a": 1}')


def write(path: Path) -> None:
    journal = RunJournal(path, "r1", Path("store"))
    assert journal.outcomes([record(0), record(1)], [("trace",)]) == 1
    journal.committed(1, 2)
    assert journal.outcomes([record(2), record(3, "x" * (2 * RESULT_MAX))], None) == 2
    journal.forgotten(["k0"])
    journal.close()


def test_batches_commits_and_forgotten_keys_read_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    write(path)
    content = read_journal(path)
    assert content is not None and not content.torn
    assert (content.run_id, content.store_dir) == ("r1", "store")
    assert [b.seq for b in content.batches] == [1, 2]
    assert [row[1] for row in content.batches[0].rows] == ["k0", "k1"]
    assert content.batches[0].rows[0][4] == {"i": 0} and content.batches[0].trace == [("trace",)]
    # results over RESULT_MAX on average: one that is over is named, not kept (its loss is counted,
    # never restored)
    assert [row[1] for row in content.batches[1].rows] == ["k2"]
    assert content.batches[1].unkept == [("s", "S3", "k3")]
    assert (content.committed_seq, content.committed_total) == (1, 2)
    assert content.forgotten == {"k0"}


def test_a_torn_or_damaged_tail_ends_the_reading_there(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    write(path)
    whole = path.read_bytes()
    for cut in (len(whole) - 3, len(whole) // 2):
        path.write_bytes(whole[:cut])  # a write cut short by a kill
        content = read_journal(path)
        assert content is not None and content.torn
        assert not content.forgotten and (len(content.batches) == 2 if cut > len(whole) // 2
                                          else len(content.batches) < 2)
    path.write_bytes(whole[:60] + os.urandom(40) + whole[100:])  # noise inside a frame
    content = read_journal(path)
    assert content is None or (content.torn and not content.batches)
    path.write_bytes(b"not a journal")
    assert read_journal(path) is None
