"""A batch Dask reran after we had its end still gets its paused worker restarted.

Dask can run a batch again when the worker it ran on is restarted before the
scheduler heard that we released it (its end, the "E" marker, already came).
If that rerun fails a subject, its worker pauses itself for a restart; left
alone it never takes another batch, and one queued there waits for ever (the
dask case of tests/engine/test_crash_safety.py hung about one run in five).
"""

from __future__ import annotations

import pickle

from habitrun.engine.dask_backend.dispatch import StageDispatch
from habitrun.engine.dask_backend.state import SharedState
from habitrun.spec.policy import RunPolicy


class _Cluster:
    """The cluster's side of a restart: what was asked of it."""

    def __init__(self) -> None:
        self.restarted: list[str] = []

    def restart_worker(self, address: str, forgotten: str | None = None) -> None:
        self.restarted.append(address)


def _dispatch() -> tuple[StageDispatch, _Cluster]:
    dispatch = object.__new__(StageDispatch)  # only the marker handling is exercised here
    cluster = _Cluster()
    dispatch.inflight = {}
    dispatch.stopping_deadline = None
    dispatch.shared = SharedState(RunPolicy())
    dispatch.handle = cluster
    return dispatch, cluster


def _end(batch: int, worker: str, restart: str | None) -> dict:
    result = {"worker": worker, "done": [], "not_run": [], "restart": restart}
    return {"b": batch, "w": worker, "m": "E", "r": pickle.dumps(result)}


def test_the_end_of_a_batch_no_longer_in_flight_restarts_the_worker_it_paused() -> None:
    dispatch, cluster = _dispatch()
    dispatch._marker(_end(1, "tcp://w2", "1 failure(s) in a row"))
    assert cluster.restarted == ["tcp://w2"]
    dispatch._marker(_end(1, "tcp://w2", "1 failure(s) in a row"))  # once per worker
    assert cluster.restarted == ["tcp://w2"]


def test_a_stray_end_without_a_restart_or_during_a_stop_changes_nothing() -> None:
    dispatch, cluster = _dispatch()
    dispatch._marker(_end(3, "tcp://w1", None))
    dispatch.stopping_deadline = 0.0
    dispatch._marker(_end(4, "tcp://w2", "timeout"))
    dispatch._marker({"b": 5, "w": "tcp://w3", "m": "E", "r": b"not a pickle"})
    assert cluster.restarted == []
