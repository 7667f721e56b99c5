"""Batch-system jobs of a dask-jobqueue cluster: a ledger of submitted jobs, and replacing lost ones.

Two things dask-jobqueue does not do for habitrun:

- **Orphans.** A runner killed with SIGKILL cannot cancel its jobs; their
  workers idle until ``death_timeout_sec``. Every job id is written to a
  ledger in the study's ``.habitrun`` folder the moment it is submitted and
  struck when its job is cancelled; the next run of the study (``resume``)
  cancels whatever the ledger still lists (the study lock guarantees no other
  runner owns them).
- **Lost jobs.** dask's SpecCluster cancels a job whose worker has been gone
  for ``lost-worker-timeout``, and races habitrun's own nanny restarts (a
  timed-out subject, a recycle): a worker that is restarting at that moment
  gets its whole job cancelled, and nothing submits a replacement. Here a
  job counts as lost only when its worker's *nanny* no longer answers (the
  job ended: ``scancel``, pre-emption, wall time); it is then replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

LOST_CHECK_SEC = 2.0  # how often a missing worker's nanny is asked whether it is still there
_log = logging.getLogger(__name__)


class JobLedger:
    """Job ids submitted by this study's runner and not yet cancelled (a small JSON file)."""

    def __init__(self, path: Path, cancel_command: str) -> None:
        self.path = path
        self.cancel_command = cancel_command
        self._lock = threading.Lock()

    def _read(self) -> list[str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return [str(i) for i in data.get("jobs", [])] if isinstance(data, dict) else []

    def _write(self, ids: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"cancel_command": self.cancel_command, "jobs": ids}), encoding="utf-8")
        os.replace(tmp, self.path)

    def add(self, job_id: str) -> None:
        with self._lock:
            ids = self._read()
            if job_id not in ids:
                self._write([*ids, job_id])

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._write([i for i in self._read() if i != job_id])

    def cancel_leftovers(self) -> list[str]:
        """Cancel the jobs an earlier runner of this study left (killed before it could); their ids."""
        with self._lock:
            ids = self._read()
            if ids:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    # one call for all; ids already gone make it complain, which changes nothing
                    subprocess.run([*shlex.split(self.cancel_command), *ids], capture_output=True, timeout=60)
                self._write([])
            return ids


def recorded_job_class(base: type, ledger: JobLedger) -> type:
    """The cluster's job class, writing each submitted job to ``ledger`` and striking it when cancelled."""

    class RecordedJob(base):
        async def start(self) -> None:
            try:
                await super().start()
            finally:
                if getattr(self, "job_id", None):
                    ledger.add(str(self.job_id))

        async def close(self) -> None:
            await super().close()
            if getattr(self, "job_id", None):
                ledger.remove(str(self.job_id))

    RecordedJob.__name__ = RecordedJob.__qualname__ = base.__name__  # names in logs stay dask-jobqueue's
    return RecordedJob


def replacing_cluster_class(base: type) -> type:
    """The jobqueue cluster class, replacing a job only once its worker's nanny is gone."""

    class ReplacingCluster(base):
        def _update_worker_status(self, op: str, msg: Any) -> None:
            if op == "remove":
                info = self.scheduler_info["workers"].get(msg, {})
                name, nanny = info.get("name"), info.get("nanny")
                if name is not None:
                    self._futures.add(asyncio.ensure_future(self._watch_missing(name, nanny)))
            # skip SpecCluster's timer (it cancels jobs whose worker is merely restarting)
            super(_spec_cluster(), self)._update_worker_status(op, msg)  # type: ignore[arg-type]  # a class found at run time

        def _job_of(self, worker_name: Any) -> Any:
            """The job (worker_spec name) a worker belongs to: itself, or a job with ``processes`` > 1."""
            if worker_name in self.worker_spec:
                return worker_name
            for job, spec in self.worker_spec.items():
                if any(f"{job}{suffix}" == str(worker_name) for suffix in spec.get("group", ())):
                    return job
            return worker_name

        def _name_connected(self, worker_name: Any) -> bool:
            return any(d.get("name") == worker_name for d in self.scheduler_info["workers"].values())

        async def _watch_missing(self, worker_name: Any, nanny: str | None) -> None:
            from distributed.core import Status

            name = self._job_of(worker_name)
            while True:
                await asyncio.sleep(LOST_CHECK_SEC)
                if self.status != Status.running or name not in self.workers or self._name_connected(worker_name):
                    return
                if nanny is not None and await _answers(nanny, self.security):
                    continue  # the nanny is restarting its worker: the job is alive
                job = self.workers.pop(name)
                _log.warning("the batch job of Dask worker %s (job %s) is gone; submitting a replacement",
                             name, getattr(job, "job_id", "?"))
                with contextlib.suppress(Exception):
                    await job.close()  # cancel (it is gone already) and strike it from the ledger
                if name in self.worker_spec:
                    await self._correct_state()
                return

    ReplacingCluster.__name__ = ReplacingCluster.__qualname__ = base.__name__  # workers: SLURMCluster-<n>
    return ReplacingCluster


def _spec_cluster() -> type:
    from distributed.deploy.spec import SpecCluster

    return SpecCluster


async def nanny_gone(address: str, security: Any, wait: float) -> bool:
    """Does the nanny at ``address`` stop answering within ``wait`` seconds (its job or host ended)?

    A nanny outlives its worker's deaths (it restarts the worker); when a batch
    job is cancelled or pre-empted, the nanny goes down with the worker.
    """
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        if not await _answers(address, security, timeout=0.5):
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.1)


async def _answers(address: str, security: Any, timeout: float = 5.0) -> bool:
    """Does anything accept a Dask connection at ``address`` now?"""
    from distributed.comm import connect

    try:
        comm = await connect(address, timeout=timeout, **security.get_connection_args("client"))
    except Exception:  # noqa: BLE001 - refused, timed out, unreachable: all mean gone
        return False
    comm.abort()
    return True
