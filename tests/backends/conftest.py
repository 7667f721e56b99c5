"""Fixtures of the backend behaviour suite: one backend per variant, built from its policy.

Backends are built the way the engine builds them (``make_backend(policy)``).
The local Dask cluster is slow to start, so tests that never restart a worker
share one per module (``shared_dask``); the others get their own.
"""

from __future__ import annotations

import multiprocessing.resource_tracker
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from habitrun.engine.backend_choice import make_backend
from habitrun.engine.contract import Backend, OperatorRef
from habitrun.spec.policy import RunPolicy
from tests.backends.variants import Variant
from tests.conftest import fail_on_leftovers, wait_gone
from tests.process.conftest import Tasks, run

OPS_DIR = Path(__file__).parent / "ops"
OPS_MODULE = "backend_suite_ops"

# Timeouts bound "did not hang", never a budget a subject meets (workers start slowly on a busy
# machine). A subject's exception keeps its worker (no restart after 1 failure): the shared
# Dask cluster must never restart a worker behind a test's back.
BASE_POLICY: dict[str, Any] = {"subject_timeout_sec": 60, "subject_spawn_timeout_sec": 60,
                               "graceful_shutdown_sec": 2, "persistent_worker_max_consecutive_failures": 100}

multiprocessing.resource_tracker.ensure_running()  # lives as long as the session: nobody's leftover


def policy_for(variant: Variant, **overrides: Any) -> RunPolicy:
    """The variant's policy over the suite's base, with a test's own fields on top."""
    return RunPolicy(**{**BASE_POLICY, **variant.policy, **overrides})


def suite_op(attr: str = "act", stage: str = "s", **params: Any) -> OperatorRef:
    return OperatorRef(stage=stage, path=f"{OPS_MODULE}:{attr}", params=params, search_path=(str(OPS_DIR),))


def _uses_shared_dask(request: pytest.FixtureRequest) -> bool:
    callspec = getattr(request.node, "callspec", None)
    variant = callspec.params.get("variant") if callspec else None
    return isinstance(variant, Variant) and variant.backend == "dask" and "backends" in request.fixturenames


@pytest.fixture(autouse=True)
def no_leftover_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """The project-wide check, with the module's shared cluster started before the snapshot."""
    if _uses_shared_dask(request):
        request.getfixturevalue("shared_dask")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    fail_on_leftovers(before, timeout=15.0)


@pytest.fixture(scope="module")
def shared_dask(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """One local cluster (the dask variant's base policy) for a module's tests that restart no worker."""
    from tests.backends.variants import VARIANTS

    dask = next(v for v in VARIANTS if v.backend == "dask")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    backend = make_backend(policy_for(dask))
    warm = Tasks(tmp_path_factory.mktemp("warm"))({"do": "ok"})
    assert run(backend, suite_op(), warm)["S0"].ok  # started now, outside any test's leftover check
    yield backend
    backend.close()
    started = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not wait_gone(started, timeout=15.0), "the shared Dask cluster left processes behind"


BackendFactory = Callable[..., Backend]


@pytest.fixture
def backends(request: pytest.FixtureRequest) -> Iterator[BackendFactory]:
    """``backends(variant, **policy_fields)``: a backend, closed at teardown.

    The dask variant with no extra fields gets the module's shared cluster;
    ``own=True`` asks for a backend of its own (a test that kills or restarts workers).
    """
    made: list[Backend] = []

    def factory(variant: Variant, *, own: bool = False, **overrides: Any) -> Backend:
        if variant.backend == "dask" and not overrides and not own:
            return request.getfixturevalue("shared_dask")
        workspace = None
        if variant.backend == "slurm":  # the real one-node SLURM; its batch folders in the test's own folder
            request.getfixturevalue("slurm")
            workspace = request.getfixturevalue("tmp_path") / "workspace"
        backend = make_backend(policy_for(variant, **overrides), workspace)
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()



@pytest.fixture
def tasks(tmp_path: Path) -> Tasks:
    """``tasks({"do": ...}, ...)``: SubjectTasks S0, S1, ... with work folders and logs under tmp_path."""
    return Tasks(tmp_path)


@pytest.fixture
def marker_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir()
    return folder


def started(marker_dir: Path) -> dict[str, int]:
    """How many times each subject's operator was called."""
    return {f.stem: len(f.read_text().splitlines()) for f in marker_dir.glob("*.log")}
