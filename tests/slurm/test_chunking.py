"""engine/slurm/chunking.py: how many subjects an array task runs, chunks in order, arrays within MaxArraySize."""

from __future__ import annotations

import pytest

from habitrun.engine.slurm.chunking import array_parts, chunk_size, split
from habitrun.spec.policy import SlurmSettings


def test_a_fixed_chunk_size_wins_over_history_and_time():
    settings = SlurmSettings(chunk_size=7, time="5", chunk_minutes=1)
    assert chunk_size(1000, 4, 2.0, settings) == 7
    assert chunk_size(1000, 4, None, settings) == 7


def test_without_history_a_stage_becomes_about_a_hundred_tasks():
    settings = SlurmSettings()
    assert chunk_size(1000, 4, None, settings) == 10
    assert chunk_size(1001, 4, None, settings) == 11
    assert chunk_size(50, 4, None, settings) == 1  # fewer subjects than 100: one each
    assert chunk_size(0, 1, None, settings) == 1


def test_with_history_a_chunk_fills_chunk_minutes_of_its_workers():
    settings = SlurmSettings(chunk_minutes=20)
    assert chunk_size(100_000, 1, 10.0, settings) == 120  # 20 min of 10 s subjects on one worker
    assert chunk_size(100_000, 4, 10.0, settings) == 479  # four workers run four at once (480, evened out)
    assert chunk_size(100_000, 4, 3600.0, settings) == 1  # a subject longer than the target: one per task
    assert chunk_size(300, 4, 10.0, settings) == 24  # 750 s of work: 13 tasks of a minute, not one of 12 min
    assert chunk_size(2000, 1, 0.05, settings) == 1000  # 100 s of work: two tasks of a minute or less, even
    assert chunk_size(50, 1, 0.05, settings) == 50  # never more than the stage has
    assert chunk_size(100_000, 1, 0.0, settings) == 50_000  # instant subjects: no division by zero (60000, evened)


def test_a_time_limit_caps_a_chunk_to_most_of_what_is_left_before_the_warning():
    # 10 min limit, warned 120 s before: 480 s left, 80% of it = 384 s of one worker = 38 subjects of 10 s
    capped = SlurmSettings(chunk_minutes=20, time="10", signal_sec=120)
    assert chunk_size(100_000, 1, 10.0, capped) == 38
    assert chunk_size(100_000, 2, 10.0, capped) == 76
    roomy = SlurmSettings(chunk_minutes=20, time="1-00:00:00")  # a day: chunk_minutes is the smaller
    assert chunk_size(100_000, 1, 10.0, roomy) == 120
    tight = SlurmSettings(chunk_minutes=20, time="1", signal_sec=120)  # warned before it starts: one subject
    assert chunk_size(100_000, 4, 10.0, tight) == 1


def test_split_keeps_the_order_and_leaves_the_rest_to_the_last_chunk():
    assert split(list("abcdefg"), 3) == [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    assert split(list("abc"), 5) == [["a", "b", "c"]]
    assert split([], 3) == []
    with pytest.raises(ValueError, match="at least 1"):
        split([1], 0)


def test_array_parts_cover_every_chunk_once_in_arrays_no_larger_than_allowed():
    assert array_parts(6, 4) == [(0, 4), (4, 2)]
    assert array_parts(8, 4) == [(0, 4), (4, 4)]
    assert array_parts(3, 1001) == [(0, 3)]
    assert array_parts(0, 4) == []
    parts = array_parts(1003, 10)
    assert [offset + i for offset, count in parts for i in range(count)] == list(range(1003))
    assert max(count for _, count in parts) == 10
    with pytest.raises(ValueError, match="at least 1"):
        array_parts(3, 0)
