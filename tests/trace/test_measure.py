"""The trace measures each subject on its own, even in a persistent worker that ran others before."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from habitrun.engine.runner import run_study
from habitrun.spec.loader import load_recipe
from tests.trace.study import trace_rows, write_study

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="per-subject peak memory needs /proc/self/clear_refs (Linux)")


def run(recipe: Path) -> int:
    return run_study(load_recipe(recipe), install_signal_handlers=False).exit_code


def by_subject(recipe: Path) -> dict[str, dict]:
    return {row["subject"]: row for row in trace_rows(recipe)}


@linux_only
@pytest.mark.parametrize("mode", ["persistent", "isolated"])
def test_peak_memory_is_per_subject_and_charges_child_processes(tmp_path: Path, mode: str) -> None:
    recipe = write_study(tmp_path, [{"subject_id": "A", "mb": 300}, {"subject_id": "B", "mb": 10},
                                    {"subject_id": "C", "child_mb": 200}, {"subject_id": "D", "mb": 1}],
                         policy={"parallel_mode": mode})
    assert run(recipe) == 0
    rows = by_subject(recipe)
    assert rows["A"]["peak_rss_mb"] >= 280, rows["A"]
    assert rows["B"]["peak_rss_mb"] < 100, rows["B"]
    assert rows["C"]["peak_rss_mb"] >= 200, rows["C"]
    assert rows["C"]["child_peak_rss_mb"] >= 200, rows["C"]
    assert rows["D"]["peak_rss_mb"] < 100, rows["D"]  # a child of C's is not charged to D
    if mode == "persistent":
        assert len({row["pid"] for row in rows.values()}) == 1  # one worker ran them all
    else:
        assert len({row["pid"] for row in rows.values()}) == 4
    for row in rows.values():
        assert row["outcome"] == "done" and row["attempt"] == 1
        assert row["queued_at"] <= row["started_at"] <= row["ended_at"]
        assert row["host"] and row["write_bytes"] is not None and row["read_bytes"] is not None
    # the same numbers are in the run's events
    events = [json.loads(line) for line in
              next((tmp_path / ".habitrun" / "runs").glob("*/events.jsonl")).read_text().splitlines()]
    done = {e["subject"]: e for e in events if e.get("event") == "subject_done"}
    assert done["A"]["peak_rss_mb"] == rows["A"]["peak_rss_mb"]
    assert done["A"]["cpu_sec"] == rows["A"]["cpu_sec"]


def test_cpu_against_wall_for_sleeping_and_busy_subjects(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, [{"subject_id": "sleepy", "mode": "sleep", "sec": 0.6},
                                    {"subject_id": "busy", "mode": "busy", "sec": 0.6}])
    assert run(recipe) == 0
    rows = by_subject(recipe)
    sleepy, busy = rows["sleepy"], rows["busy"]
    assert sleepy["wall_sec"] >= 0.6 and sleepy["cpu_sec"] < 0.2 * sleepy["wall_sec"], sleepy
    assert busy["cpu_sec"] >= 0.55 and busy["cpu_sec"] <= busy["wall_sec"] * 1.05 + 0.02, busy


def test_serial_backend_measures_and_failures_are_traced_per_attempt(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, [{"subject_id": "ok", "mb": 1}, {"subject_id": "bad", "fail": "boom"}],
                         policy={"backend": "serial", "subject_timeout_sec": None, "auto_retry_rounds": 1,
                                 "auto_retry_on": ["exception"]})
    assert run(recipe) == 1
    rows = trace_rows(recipe)
    bad = [r for r in rows if r["subject"] == "bad"]
    assert [(r["attempt"], r["outcome"]) for r in bad] == [(1, "retried"), (2, "failed")]
    assert bad[-1]["kind"] == "exception" and "boom" in bad[-1]["error"] and bad[-1]["log"]
    ok = next(r for r in rows if r["subject"] == "ok")
    assert ok["peak_rss_mb"] > 0 and ok["cpu_sec"] is not None and ok["error"] is None


@linux_only
@pytest.mark.dask
@pytest.mark.timeout(180)
def test_dask_backend_fills_the_trace(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="dask.distributed is not installed (the dask extra)")
    recipe = write_study(tmp_path, [{"subject_id": "A", "mb": 300}, {"subject_id": "B", "mb": 5},
                                    {"subject_id": "C", "mode": "busy", "sec": 0.3}],
                         policy={"backend": "dask", "workers": 1})
    assert run(recipe) == 0
    rows = by_subject(recipe)
    # A Dask worker may hold freed memory that A's allocation reuses, so only the difference is sure.
    peaks = [(r["subject"], r["peak_rss_mb"]) for r in rows.values()]
    assert rows["A"]["peak_rss_mb"] >= 280 and rows["B"]["peak_rss_mb"] < rows["A"]["peak_rss_mb"] - 100, peaks
    assert rows["C"]["cpu_sec"] >= 0.25
    assert all(row["host"] and row["pid"] for row in rows.values())


def test_a_killed_subject_keeps_what_the_runner_saw_and_nulls_the_rest(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, [{"subject_id": "slow", "mode": "sleep", "sec": 30}, {"subject_id": "ok"}],
                         policy={"subject_timeout_sec": 1, "auto_retry_rounds": 0})
    assert run(recipe) == 1
    slow = by_subject(recipe)["slow"]
    assert slow["outcome"] == "failed" and slow["kind"] == "timeout"
    assert 1 <= slow["wall_sec"] < 20 and slow["started_at"] < slow["ended_at"]
    assert slow["cpu_sec"] is None and slow["peak_rss_mb"] is None and slow["read_bytes"] is None


def test_the_gpu_a_worker_was_pinned_to_is_traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # the pool the batch system gave (no GPU is touched)
    recipe = write_study(tmp_path, [{"subject_id": f"S{i}", "mode": "sleep", "sec": 0.05} for i in range(6)],
                         policy={"workers": 2, "cap_workers_to_gpu_pool": True})
    assert run(recipe) == 0
    rows = trace_rows(recipe)
    assert {row["gpu"] for row in rows} == {"3", "5"}
    for row in rows:  # one device per worker
        assert {r["gpu"] for r in rows if r["pid"] == row["pid"]} == {row["gpu"]}


@linux_only
def test_a_worker_started_by_a_large_runner_still_measures_each_subject(tmp_path: Path) -> None:
    # A process started by fork+exec inherits its parent's peak as getrusage's ru_maxrss floor,
    # which no reset lowers; VmHWM does not. Make the runner (this process) large first.
    block = bytearray(400 * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    del block
    recipe = write_study(tmp_path, [{"subject_id": "A", "mb": 50}, {"subject_id": "B", "mb": 5}],
                         policy={"start_method": "spawn"})
    assert run(recipe) == 0
    rows = by_subject(recipe)
    assert rows["A"]["peak_rss_mb"] < 300 and rows["B"]["peak_rss_mb"] < rows["A"]["peak_rss_mb"] - 30, rows


@linux_only
def test_a_small_child_of_a_large_subject_is_not_charged_its_parents_memory(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, [{"subject_id": "big", "mode": "hold_child", "mb": 250}],
                         policy={"parallel_mode": "isolated"})
    assert run(recipe) == 0
    row = by_subject(recipe)["big"]
    # the child's own ru_maxrss starts at the 250 MB its parent had when it forked: not added twice
    assert 250 <= row["peak_rss_mb"] < 400 and row["child_peak_rss_mb"] is None, row
