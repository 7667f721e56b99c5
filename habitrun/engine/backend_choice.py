"""Choosing and reusing a backend for a stage's policy.

One backend lives across stages so persistent workers are reused; a stage
whose policy changes what the workers are (mode, count, limits, backend)
gets a fresh one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from habitrun.engine.contract import Backend
from habitrun.spec.policy import RunPolicy

log = logging.getLogger(__name__)

# Policy fields the engine applies itself; a change in these keeps the workers.
ENGINE_ONLY_FIELDS = frozenset({
    "on_subject_failure", "auto_retry_rounds", "auto_retry_on", "resume", "retry_failed_subjects",
    "force_rerun_subjects", "clear_checkpoint_on_success", "strict_checkpoint_hash",
    "checkpoint_dir", "memory_hint",
})


def worker_shape(policy: RunPolicy) -> dict[str, Any]:
    """The part of a policy that decides what the worker processes are."""
    return {k: v for k, v in policy.model_dump().items() if k not in ENGINE_ONLY_FIELDS}


def make_backend(policy: RunPolicy, workspace: Path | None = None, *, detach: bool = False) -> Backend:
    """Build the backend the policy names (heavy ones imported only when asked for).

    ``workspace`` is the study's ``.habitrun`` folder, where a batch-system cluster keeps its jobs' ledger
    (and the slurm backend its batch folders). ``detach``: the slurm backend submits and ends the run.
    """
    if policy.backend == "serial":
        from habitrun.engine.serial import SerialBackend

        return SerialBackend.from_policy(policy)
    if policy.backend == "process":
        from habitrun.engine.process import ProcessBackend

        return ProcessBackend.from_policy(policy)
    if policy.backend == "dask":
        from habitrun.engine.dask_backend import DaskBackend

        return DaskBackend.from_policy(policy, workspace)
    if policy.backend == "slurm":
        from habitrun.engine.slurm.backend import SlurmBackend

        return SlurmBackend.from_policy(policy, workspace, detach=detach)
    raise ValueError(f"unknown backend {policy.backend!r}")


class BackendPool:
    """Holds the current backend and swaps it only when a stage needs different workers."""

    def __init__(self, workspace: Path | None = None, *, detach: bool = False) -> None:
        self.workspace = workspace
        self.detach = detach  # a detached run: the slurm backend submits, then ends the run
        self.current: Backend | None = None
        self._shape: dict[str, Any] | None = None
        self.described: list[dict[str, Any]] = []
        self.notes: list[str] = []  # each new backend's notes, until taken (see take_notes)

    def for_policy(self, policy: RunPolicy) -> Backend:
        shape = worker_shape(policy)
        if self.current is not None and shape == self._shape:
            log.debug("backend: the %s backend kept (same worker shape)", self.current.name)
            return self.current
        if self.current is not None:
            changed = sorted(k for k in shape if self._shape is not None and shape[k] != self._shape.get(k))
            log.debug("backend: the %s backend closed: %s changed", self.current.name, ", ".join(changed))
        self.close()
        self.current = make_backend(policy, self.workspace, detach=self.detach)
        self._shape = shape
        log.debug("backend: %s with %d worker(s) (backend=%s, workers=%d, parallel_mode=%s, start_method=%s)",
                  self.current.name, self.current.effective_workers, policy.backend, policy.workers,
                  policy.parallel_mode, policy.start_method)
        self.notes += self.current.notes()
        return self.current

    def take_notes(self) -> list[str]:
        """The notes of the backends made since the last call (each said once, when its stage starts)."""
        notes, self.notes = self.notes, []
        return notes

    def warm(self, policy: RunPolicy) -> None:
        """Have the process backend for ``policy`` start booting its workers' fork server now.

        Only the process backend: building another one may start a cluster,
        which a run stopped by its operator check should never have done.
        """
        if policy.backend == "process":
            self.for_policy(policy).warm()

    def close(self, graceful: bool = True) -> None:
        if self.current is not None:
            try:
                self.described.append(self.current.describe())
            except Exception:  # noqa: BLE001 - describing is best effort
                pass
            self.current.close(graceful=graceful)
        self.current = None
        self._shape = None
