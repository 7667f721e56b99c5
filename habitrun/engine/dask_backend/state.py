"""What one DaskBackend remembers across stages and retry rounds.

Batch sizes learned for an operator, workers being restarted on purpose,
nanny out-of-memory kills, the out-of-memory backoff, and the live worker
count: facts about the cluster, not about one ``run_tasks`` call.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from habitrun.engine.contract import OperatorRef
from habitrun.engine.dask_backend.batching import BatchSizer
from habitrun.engine.dask_backend.cluster import ClusterHandle
from habitrun.spec.policy import RunPolicy


class SharedState:
    """Cluster facts shared by every StageDispatch of one backend."""

    def __init__(self, policy: RunPolicy) -> None:
        self.policy = policy
        self.restarting: set[str] = set()
        self.backoff = 0
        self.live = 0
        self.listeners: list[queue.SimpleQueue[tuple[Any, ...]]] = []
        self._sizers: dict[str, BatchSizer] = {}
        self._oom: dict[str, int] = {}
        self.host_losses: dict[str, int] = {}  # subject key -> times its worker's job/host ended under it
        self._oom_seen = threading.Condition()

    @property
    def backed_off(self) -> bool:
        return self.backoff > 0

    def sizer_for(self, op: OperatorRef, target_sec: float) -> BatchSizer:
        """One duration estimate per stage, kept across its retry rounds."""
        key = f"{op.stage}\0{op.path}"
        if key not in self._sizers:
            self._sizers[key] = BatchSizer(target_sec)
        return self._sizers[key]

    def base_workers(self, handle: ClusterHandle) -> int:
        """A cluster habitrun started has ``workers``; a connected one has whatever it has now."""
        if handle.kind == "local" or handle.kind.startswith("jobqueue"):
            return self.policy.workers
        return max(1, self.live)

    def effective_workers(self, handle: ClusterHandle) -> int:
        return max(1, self.base_workers(handle) - self.backoff)

    def slots(self, handle: ClusterHandle) -> int:
        """Subjects that may run at once now: effective workers, never more than are alive."""
        eff = self.effective_workers(handle)
        return max(1, min(eff, self.live)) if self.live else eff

    def refresh_workers(self, handle: ClusterHandle) -> None:
        try:
            workers = handle.live_workers()
        except Exception:  # noqa: BLE001 - keep the last count
            return
        self.live = len(workers)

    def restart(self, handle: ClusterHandle, address: str, forgotten: str | None = None) -> None:
        """Restart a worker once (a timed-out subject, a recycle, the end of a grace period);
        with ``forgotten``, once the scheduler has let go of that batch's key (see restart_worker)."""
        if address in self.restarting:
            return
        self.restarting.add(address)
        handle.restart_worker(address, forgotten=forgotten)

    def note_oom(self, policy: RunPolicy) -> None:
        """Out-of-memory backoff: fewer subjects at once from now on (never below one)."""
        if policy.oom_backoff:
            self.backoff += policy.oom_reduce_workers_by

    def on_oom_event(self, event: tuple[float, dict[str, Any]]) -> None:
        """Handler for the nanny's ``worker-restart-memory`` topic (runs on the client's loop)."""
        msg = event[1] if isinstance(event, tuple) else event
        with self._oom_seen:
            self._oom[str(msg.get("worker"))] = int(msg.get("rss") or 0)
            self._oom_seen.notify_all()
        for q in list(self.listeners):
            q.put(("oom",))

    def oom_kill(self, address: str, wait: float) -> int | None:
        """Resident bytes at which the nanny killed ``address`` for memory, or None if it did not."""
        deadline = time.monotonic() + wait
        with self._oom_seen:
            while address not in self._oom:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._oom_seen.wait(remaining)
            return self._oom[address]
