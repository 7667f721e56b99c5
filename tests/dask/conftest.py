"""Fixtures for the Dask backend tests: real local clusters, real worker processes, no mocks."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("distributed")

# multiprocessing's resource tracker is a per-process singleton that lives as long as this
# test process (the first spawn starts it); start it now so no test counts it as its leftover.
multiprocessing.resource_tracker.ensure_running()

from habitrun.engine.contract import OperatorRef, SubjectOutcome, SubjectTask  # noqa: E402
from habitrun.engine.control import StopFlag  # noqa: E402
from habitrun.engine.dask_backend import DaskBackend  # noqa: E402
from habitrun.spec.policy import RunPolicy  # noqa: E402
from tests.conftest import fail_on_leftovers, wait_gone  # noqa: E402

OPS = textwrap.dedent('''
    """Operators for the Dask backend tests."""
    import os
    import time


    def echo(subject, sleep=0.0, fail=(), hang=(), bad_result=(), die=(), hog=()):
        print(f"echo says hello from {subject.id}")
        if subject.id in hang:
            time.sleep(3600)
        if subject.id in die:
            os.kill(os.getpid(), 9)
        if subject.id in hog:
            blocks = []
            for _ in range(400):
                blocks.append(bytearray(20 * 2**20))
                time.sleep(0.02)
        if sleep:
            time.sleep(sleep)
        if subject.id in fail:
            raise ValueError(f"subject {subject.id} is broken on purpose")
        if subject.id in bad_result:
            return lambda: None
        return {"id": subject.id, "pid": os.getpid(), "attempt_inputs": dict(subject.inputs)}


    class Counter:
        """Built once per worker: every build leaves a file named after the worker's pid."""

        def __init__(self, build_dir):
            self.build_dir = build_dir
            with open(os.path.join(build_dir, f"build-{os.getpid()}-{time.time_ns()}"), "w") as f:
                f.write("built")
            self.calls = 0

        def __call__(self, subject):
            self.calls += 1
            return {"pid": os.getpid(), "calls": self.calls}
''')


@pytest.fixture(autouse=True)
def no_leftover_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """As the project-wide fixture, except that a module's shared cluster is checked when it closes."""
    if "shared_backend" in request.fixturenames:
        yield
        return
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    fail_on_leftovers(before, timeout=15.0)


@pytest.fixture(scope="module")
def ops_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dask_ops")
    (folder / "dask_test_ops.py").write_text(OPS)
    (folder / "builds").mkdir()
    return folder


def make_tasks(folder: Path, n: int, *, attempt: int = 1, prefix: str = "S") -> list[SubjectTask]:
    return [SubjectTask(key=f"key-{prefix}{i:03d}", subject_id=f"{prefix}{i:03d}", fields={"n": i}, inputs={},
                        workdir=str(folder / "work" / f"{prefix}{i:03d}"),
                        log_path=str(folder / "logs" / f"{prefix}{i:03d}.log"), attempt=attempt)
            for i in range(n)]


def echo_op(ops_dir: Path, stage: str = "echo", **params: Any) -> OperatorRef:
    return OperatorRef(stage=stage, path="dask_test_ops:echo", params=params, search_path=(str(ops_dir),))


def run_all(backend: DaskBackend, op: OperatorRef, tasks: list[SubjectTask],
            stop: StopFlag | None = None, on_report: Any = None) -> dict[str, SubjectOutcome]:
    """Run tasks; every subject must be reported exactly once."""
    seen: dict[str, SubjectOutcome] = {}
    stop = stop or StopFlag()

    def report(outcomes: list[SubjectOutcome]) -> None:
        for outcome in outcomes:
            sid = outcome.task.subject_id
            assert sid not in seen, f"{sid} reported twice"
            seen[sid] = outcome
        if on_report is not None:
            on_report(outcomes, stop)

    try:
        backend.run_tasks(op, tasks, report, stop)
    finally:
        stop.close()
    return seen


def dask_policy(**fields: Any) -> RunPolicy:
    base: dict[str, Any] = {"backend": "dask", "workers": 2, "subject_timeout_sec": 60,
                            "graceful_shutdown_sec": 2, "persistent_worker_max_consecutive_failures": 100}
    base.update(fields)
    return RunPolicy(**base)


def worker_pids(backend: DaskBackend) -> set[int]:
    client = backend.handle.client
    return set(client.run(os.getpid).values())


@pytest.fixture(scope="module")
def shared_backend() -> Iterator[DaskBackend]:
    """One 2-worker local cluster for the tests that never restart a worker."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    backend = DaskBackend.from_policy(dask_policy())
    backend._client()
    yield backend
    backend.close()
    started = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not wait_gone(started, timeout=15.0), "the shared cluster left processes behind"
