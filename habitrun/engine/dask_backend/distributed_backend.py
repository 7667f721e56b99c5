"""DaskBackend: the engine's Backend on a Dask cluster (local by default, or by address, scheduler file or batch system)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from habitrun.engine.contract import Backend, OperatorRef, ReportFn, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.dask_backend.cluster import ClusterHandle
from habitrun.engine.dask_backend.dispatch import OOM_TOPIC, StageDispatch
from habitrun.engine.dask_backend.state import SharedState
from habitrun.spec.policy import RunPolicy


class DaskBackend(Backend):
    """Runs subjects on Dask workers, with habitrun's per-subject outcomes, timeouts and logs.

    The cluster is started (or connected to) on first use and lives for the
    backend's life, so workers and their bound operators are reused across
    stages. The run folder must be on a filesystem the workers share: each
    subject's log is written by the worker that runs it.
    """

    name = "dask"

    def __init__(self, policy: RunPolicy, workspace: Path | None = None) -> None:
        self.policy = policy
        self.handle = ClusterHandle(policy, workspace)
        self.shared = SharedState(policy)
        self._closed = False

    @classmethod
    def from_policy(cls, policy: RunPolicy, workspace: Path | None = None) -> DaskBackend:
        """``workspace``: the study's ``.habitrun`` folder (batch jobs' ledger and output)."""
        return cls(policy, workspace)

    def _client(self) -> Any:
        if self._closed:
            raise RuntimeError("DaskBackend used after close()")
        if self.handle.client is None:
            client = self.handle.start()
            client.subscribe_topic(OOM_TOPIC, self.shared.on_oom_event)
            self.shared.refresh_workers(self.handle)
        return self.handle.client

    @property
    def effective_workers(self) -> int:
        return self.shared.effective_workers(self.handle)

    def run_tasks(self, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        if not tasks or stop.is_set():
            return
        self._client()
        self.shared.refresh_workers(self.handle)
        StageDispatch(self.handle, self.shared, self.policy, op, tasks, report, stop).run()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"backend": self.name, "workers": self.effective_workers,
                                "cluster": self.handle.kind}
        if self.handle.client is None:
            return info
        info["address"] = self.handle.address
        if self.handle.cancelled_jobs:
            info["cancelled_leftover_jobs"] = list(self.handle.cancelled_jobs)
        try:
            self.shared.refresh_workers(self.handle)
            info["live_workers"] = self.shared.live
            info["versions_on_workers"] = self.handle.versions()
        except Exception as exc:  # noqa: BLE001 - provenance is best effort
            info["versions_error"] = str(exc)
        return info

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self.handle.close(graceful=graceful)
