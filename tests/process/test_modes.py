"""Behaviours 1, 13 and the start methods: persistent vs isolated workers, reuse across stages."""

from __future__ import annotations

import pytest

from tests.process.conftest import op, run


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_persistent_workers_build_a_class_operator_once_each(make_backend, tasks, method):
    b = make_backend(workers=2, start_method=method)
    got = run(b, op("Built", {"tag": "t"}), tasks(*[{"do": "ok"}] * 12))
    assert len(got) == 12 and all(o.ok for o in got.values())
    pids = {o.result["pid"] for o in got.values()}
    assert 1 <= len(pids) <= 2
    assert {o.result["builds"] for o in got.values()} == {1}  # built once per worker process
    assert {o.result["tag"] for o in got.values()} == {"t"}
    assert {o.worker_pid for o in got.values()} == pids


def test_isolated_mode_runs_each_subject_in_a_fresh_process(make_backend, tasks):
    b = make_backend(workers=2, parallel_mode="isolated")
    got = run(b, op("Built"), tasks(*[{"do": "ok"}] * 6))
    assert all(o.ok for o in got.values())
    assert len({o.result["pid"] for o in got.values()}) == 6
    assert {o.result["builds"] for o in got.values()} == {1}
    assert len(b.started_pids) == 6


def test_consecutive_stages_reuse_workers_with_each_stages_operator(make_backend, tasks):
    b = make_backend(workers=2)
    first = run(b, op("act", stage="one"), tasks(*[{"do": "ok"}] * 8, stage="one"))
    second = run(b, op("second_stage", stage="two"), tasks(*[{"do": "ok"}] * 8, stage="two"))
    assert all(o.ok for o in first.values()) and all(o.ok for o in second.values())
    assert all(o.result["stage"] == 2 for o in second.values())  # never the previous operator
    assert {o.worker_pid for o in second.values()} <= set(b.started_pids[:2])
    assert len(b.started_pids) == 2


def test_collect_task_runs_on_a_worker(make_backend, tasks):
    b = make_backend(workers=1)
    [task] = tasks({"id": "__collect__"})
    task.inputs = {"a": 1, "b": 2, "c": 3}
    got = run(b, op("total", kind="collect"), [task])
    assert got["__collect__"].ok and got["__collect__"].result == 6
