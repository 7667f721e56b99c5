"""Which backend variants the behaviour suite runs, and which behaviour applies to which.

A behaviour that cannot apply to a backend is left out of its parametrisation
(never skipped): the serial backend runs subjects in the test's own process,
so the policy forbids it a timeout or a memory cap, a death would end the
test, and it has no separate worker to isolate. ``isolation`` (a fresh
process per subject) is what isolated mode promises instead of ``reuse``.

Adding a backend: implement ``habitrun.engine.contract.Backend``, make
``make_backend`` build it from its policy, and add a :class:`Variant` here
with the behaviours it supports; the suite then runs against it.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

BACKEND_LEVEL = ("success", "raise", "timeout", "death", "oom", "stop", "reuse", "isolation", "bind_error")
ENGINE_LEVEL = ("retry", "retry_death", "fail_fast", "resume", "stop_resume")
BEHAVIOURS = BACKEND_LEVEL + ENGINE_LEVEL
NEED_A_WORKER_PROCESS = frozenset({"timeout", "death", "oom", "isolation", "retry_death"})


@dataclass(frozen=True)
class Variant:
    """One backend configuration: the policy fields that select it and what it must do."""

    id: str
    policy: dict[str, Any]
    behaviours: frozenset[str]
    marks: tuple[Any, ...] = field(default=())

    @property
    def backend(self) -> str:
        return str(self.policy["backend"])


def _process(method: str, mode: str) -> Variant:
    skip = {"isolation" if mode == "persistent" else "reuse"}
    if method == "spawn":
        # spawn differs from forkserver only in how a worker process starts, which the backend-level
        # rows cover; an engine-level row costs whole runs (CI time). fork keeps them: its workers are
        # forked from the runner with the engine's threads running, which run_tasks alone never shows.
        skip |= set(ENGINE_LEVEL)
    return Variant(f"process-{method}-{mode}",
                   {"backend": "process", "workers": 2, "start_method": method, "parallel_mode": mode},
                   frozenset(BEHAVIOURS) - skip)


_NO_DASK = importlib.util.find_spec("distributed") is None

VARIANTS: tuple[Variant, ...] = (
    Variant("serial", {"backend": "serial", "workers": 1, "subject_timeout_sec": None},
            frozenset(BEHAVIOURS) - NEED_A_WORKER_PROCESS),
    *(_process(method, mode) for mode in ("persistent", "isolated") for method in ("forkserver", "spawn", "fork")),
    Variant("dask", {"backend": "dask", "workers": 2}, frozenset(BEHAVIOURS) - {"isolation"},
            marks=(pytest.mark.dask,
                   pytest.mark.skipif(_NO_DASK, reason="dask.distributed is not installed (habitrun[dask])"))),
    # SLURM arrays on the one-node cluster of tests/cluster (the `slurm` fixture starts it): one session of
    # one worker per array task, all of a test's subjects in one chunk. Left out: oom (the memory cap is the
    # session's process backend's, whose backoff lives and ends inside one array task), reuse and isolation
    # (each stage gets sessions of its own), and the engine-level rows (whole runs on SLURM: tests/slurm).
    Variant("slurm", {"backend": "slurm", "workers": 1,
                      "slurm": {"partition": "debug", "time": "00:10:00", "mem": "500M", "poll_sec": 0.2,
                                "chunk_size": 20}},
            frozenset({"success", "raise", "timeout", "death", "stop", "bind_error"}),
            marks=(pytest.mark.slurm,)),
)


def for_backends(behaviour: str) -> pytest.MarkDecorator:
    """Run the test once per variant that ``behaviour`` applies to (the ``variant`` argument)."""
    assert behaviour in BEHAVIOURS, behaviour
    params = [pytest.param(v, id=v.id, marks=v.marks) for v in VARIANTS if behaviour in v.behaviours]
    return pytest.mark.parametrize("variant", params)


@contextlib.contextmanager
def known_gap(variant: Variant, gaps: dict[str, str]) -> Iterator[None]:
    """Assertions that the variants in ``gaps`` (id -> reason) are known to fail: an inconsistency
    between backends, reported and not yet fixed. For those the test ends as xfail; once the
    assertions pass, the test fails until the gap is taken off the list (as a strict xfail does)."""
    assert set(gaps) <= {v.id for v in VARIANTS}, gaps
    reason = gaps.get(variant.id)
    if reason is None:
        yield
        return
    try:
        yield
    except AssertionError:
        pytest.xfail(reason)
    pytest.fail(f"known gap no longer there, take {variant.id} off its list: {reason}")


def behaviour_table() -> str:
    """The table docs/backends.md shows (a test checks the two agree): variants that differ only
    in start method share a column."""
    columns: dict[tuple[str, str, frozenset[str]], list[str]] = {}
    for v in VARIANTS:
        columns.setdefault((v.backend, str(v.policy.get("parallel_mode", "")), v.behaviours), []).append(
            str(v.policy.get("start_method", "")))
    names = [" ".join(filter(None, (backend, mode))) + (f" ({', '.join(methods)})" if any(methods) else "")
             for (backend, mode, _), methods in columns.items()]
    rows = ["| behaviour | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    rows += [f"| {b} | " + " | ".join("yes" if b in key[2] else "-" for key in columns) + " |" for b in BEHAVIOURS]
    return "\n".join(rows)
