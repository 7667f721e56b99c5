"""Fixtures for the process-backend tests: real workers, real faults, nothing left behind."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from habitrun.engine.contract import OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.process import ProcessBackend
from habitrun.spec.policy import RunPolicy

OPS_DIR = str(Path(__file__).parent / "ops")


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker_started_early() -> None:
    """multiprocessing's resource tracker lives as long as the test session; start it
    before any test so the no-leftover check does not blame the first test for it."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left


def op(attr: str, params: dict[str, Any] | None = None, stage: str = "s", kind: str = "map",
       module: str = "faults") -> OperatorRef:
    return OperatorRef(stage=stage, path=f"{module}:{attr}", params=params or {}, kind=kind,
                       search_path=(OPS_DIR,))


class Tasks:
    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, *fields: dict[str, Any], attempt: int = 1, stage: str = "s") -> list[SubjectTask]:
        out = []
        for i, f in enumerate(fields):
            sid = str(f.get("id", f"S{i}"))
            out.append(SubjectTask(key=f"{stage}-{sid}", subject_id=sid, fields=dict(f), inputs={},
                                   workdir=str(self.root / stage / sid), attempt=attempt,
                                   log_path=str(self.root / "logs" / stage / f"{sid}.log")))
        return out


@pytest.fixture
def tasks(tmp_path: Path) -> Tasks:
    return Tasks(tmp_path)


def run(backend: ProcessBackend, ref: OperatorRef, tasks: list[SubjectTask],
        stop: StopFlag | None = None,
        on_batch: Callable[[list[SubjectOutcome]], None] | None = None) -> dict[str, SubjectOutcome]:
    got: dict[str, SubjectOutcome] = {}

    def report(batch: list[SubjectOutcome]) -> None:
        for o in batch:
            assert o.task.subject_id not in got, f"{o.task.subject_id} reported twice"
            got[o.task.subject_id] = o
        if on_batch:
            on_batch(batch)

    backend.run_tasks(ref, tasks, report, stop or StopFlag())
    return got


@pytest.fixture
def make_backend() -> Iterator[Callable[..., ProcessBackend]]:
    """Build backends from policy fields; on teardown close them and prove every worker is gone."""
    made: list[ProcessBackend] = []

    def factory(**fields: Any) -> ProcessBackend:
        # "did not hang" bounds: a worker starting on a starved machine can take many seconds
        fields.setdefault("subject_timeout_sec", 60)
        fields.setdefault("subject_spawn_timeout_sec", 60)
        fields.setdefault("graceful_shutdown_sec", 2)
        b = ProcessBackend.from_policy(RunPolicy(**fields))
        made.append(b)
        return b

    yield factory
    for b in made:
        b.close()
        left = wait_gone(list(b.started_pids), timeout=5)
        assert not left, f"workers survived close(): {left}"
