"""Reaching a Dask cluster: start a local one, connect by address or scheduler file, or start a batch-system one.

habitrun decides retries itself, so the scheduler must not silently rerun a
batch whose worker died (``allowed-failures: 0``), and a worker must never
pause or spill because of a subject's memory: past ``worker_memory_limit_mb``
the nanny kills it and habitrun records that subject as out of memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import psutil

from habitrun.engine.dask_backend.jobs import (
    JobLedger,
    nanny_gone,
    recorded_job_class,
    replacing_cluster_class,
)
from habitrun.engine.process.threads import thread_env
from habitrun.errors import HabitrunError
from habitrun.spec.policy import DaskSettings, JobqueueSettings, RunPolicy

MEMORY_CONFIG: dict[str, Any] = {
    "distributed.worker.memory.target": False,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": 1.0,
}
SCHEDULER_CONFIG: dict[str, Any] = {"distributed.scheduler.allowed-failures": 0}
FORGET_WAIT_SEC = 2.0  # how long a restart waits for the scheduler to let go of its batch's key
JOB_NAME = "habitrun-worker"  # what a batch-system cluster's jobs are called in squeue/qstat

_log = logging.getLogger(__name__)


class _QuietExpectedDeaths(logging.Filter):
    """The scheduler logs an ERROR for every batch whose worker died; habitrun reports those itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "workers died while trying to run it" not in record.getMessage()


class _QuietCancelledRestarts(logging.Filter):
    """A nanny restarting a worker that a subject killed logs an ERROR with a traceback when the cluster
    closes mid-restart (the restart is cancelled): expected at the end of a run, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


logging.getLogger("distributed.scheduler").addFilter(_QuietExpectedDeaths())
logging.getLogger("distributed.nanny").addFilter(_QuietCancelledRestarts())


class DaskClusterError(HabitrunError):
    """The Dask cluster cannot be started, reached or used (exit 2: fix the settings or the cluster)."""


def security_for(settings: DaskSettings, *, local: bool) -> Any:
    """TLS from the policy (CA, certificate, key), else whatever Dask's own config says."""
    from distributed.security import Security

    tls = settings.tls
    if tls is None:
        return Security()
    files = {"tls_ca_file": tls.ca_file, "tls_client_cert": tls.cert, "tls_client_key": tls.key}
    if local:  # a local TLS cluster: scheduler and workers present the same certificate
        files.update(tls_scheduler_cert=tls.cert, tls_scheduler_key=tls.key,
                     tls_worker_cert=tls.cert, tls_worker_key=tls.key)
    return Security(require_encryption=True, **files)


_JOBQUEUE_CLASSES = {
    "slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster", "lsf": "LSFCluster",
    "htcondor": "HTCondorCluster", "moab": "MoabCluster", "oar": "OARCluster",
}
_ACCOUNT_WORD = {"slurm": "account", "pbs": "account", "moab": "account", "sge": "project",
                 "lsf": "project", "oar": "project"}


def jobqueue_kwargs(jq: JobqueueSettings, policy: RunPolicy) -> dict[str, Any]:
    """Arguments for the dask-jobqueue cluster class: one single-threaded worker per core."""
    processes = jq.processes or jq.cores
    kwargs: dict[str, Any] = {
        "cores": jq.cores,
        "memory": jq.memory,
        "processes": processes,
        "walltime": jq.walltime,
        "job_extra_directives": list(jq.job_extra_directives),
        "job_script_prologue": [f"export {k}={v}" for k, v in thread_env(policy.worker_threads).items()]
        + list(jq.job_script_prologue),
        "python": jq.python,
        "local_directory": jq.local_directory,
        "death_timeout": jq.death_timeout_sec,
    }
    if jq.system != "htcondor":
        kwargs["queue"] = jq.queue
    if jq.account is not None:
        kwargs[_ACCOUNT_WORD[jq.system]] = jq.account
    return {k: v for k, v in kwargs.items() if v is not None}


def make_jobqueue_cluster(jq: JobqueueSettings, policy: RunPolicy, security: Any,
                          workspace: Path | None = None) -> tuple[Any, list[str]]:
    """The dask-jobqueue cluster (its scheduler runs here; jobs are submitted once scaled).

    With a ``workspace`` (the study's ``.habitrun`` folder) the jobs' output goes to
    ``dask-jobs/logs/`` there and every job is kept in a ledger, so the next run
    cancels the jobs of a runner that was killed; returns the cluster and the ids
    of such leftover jobs it cancelled.
    """
    import dask
    import dask_jobqueue

    base = getattr(dask_jobqueue, _JOBQUEUE_CLASSES[jq.system])
    extra: dict[str, Any] = {"job_name": JOB_NAME}
    if security.require_encryption:
        extra.update(security=security, protocol="tls://")
    cancelled: list[str] = []
    if workspace is not None:
        ledger = JobLedger(workspace / "dask-jobs" / "ledger.json", base.job_cls.cancel_command)
        cancelled = ledger.cancel_leftovers()
        extra["job_cls"] = recorded_job_class(base.job_cls, ledger)
        extra.setdefault("log_directory", str(workspace / "dask-jobs" / "logs"))
    cls = replacing_cluster_class(base)
    with dask.config.set({**SCHEDULER_CONFIG, **MEMORY_CONFIG}):
        return cls(**jobqueue_kwargs(jq, policy), silence_logs=logging.ERROR, **extra), cancelled


class ClusterHandle:
    """The client (and, for a cluster habitrun started, the cluster) behind one DaskBackend."""

    def __init__(self, policy: RunPolicy, workspace: Path | None = None) -> None:
        self.policy = policy
        self.workspace = workspace
        self.cancelled_jobs: list[str] = []  # left by an earlier, killed runner of this study
        self.security: Any = None
        self.settings = policy.dask or DaskSettings()
        self.cluster: Any = None
        self.client: Any = None
        if self.settings.address:
            self.kind = "address"
        elif self.settings.scheduler_file:
            self.kind = "scheduler_file"
        elif self.settings.jobqueue is not None:
            self.kind = f"jobqueue:{self.settings.jobqueue.system}"
        else:
            self.kind = "local"
        self._restored_allowed_failures: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="habitrun-dask-admin")
        self._pending: list[concurrent.futures.Future[Any]] = []
        self._children_before: set[int] = set()

    def start(self) -> Any:
        """Start or connect once; every failure is a DaskClusterError saying what to check."""
        if self.client is not None:
            return self.client
        try:
            self.client = self._connect()
        except HabitrunError:
            raise
        except Exception as exc:  # noqa: BLE001 - a cluster that cannot be reached is a usage problem
            self.close(graceful=False)
            raise DaskClusterError(f"cannot start or reach the Dask cluster ({self.kind}): "
                                   f"{type(exc).__name__}: {exc}") from None
        return self.client

    def _connect(self) -> Any:
        from distributed import Client, LocalCluster

        # a local or jobqueue cluster's scheduler runs here and presents the same certificate
        security = security_for(self.settings, local=self.kind == "local" or self.kind.startswith("jobqueue"))
        self.security = security
        if self.kind == "address":
            client = Client(self.settings.address, security=security, timeout=self._connect_timeout())
            self._forbid_scheduler_retries(client)
            return client
        if self.kind == "scheduler_file":
            client = Client(scheduler_file=self.settings.scheduler_file, security=security,
                            timeout=self._connect_timeout())
            self._forbid_scheduler_retries(client)
            return client
        if self.settings.jobqueue is not None:
            self.cluster, self.cancelled_jobs = make_jobqueue_cluster(self.settings.jobqueue, self.policy,
                                                                      security, self.workspace)
            if self.cancelled_jobs:
                _log.warning("cancelled %d batch job(s) left by an earlier, killed run of this study: %s",
                             len(self.cancelled_jobs), " ".join(self.cancelled_jobs))
            self.cluster.scale(n=self.policy.workers)
            return Client(self.cluster, security=security)
        import dask

        self._children_before = {p.pid for p in psutil.Process().children()}
        memory = f"{self.policy.worker_memory_limit_mb}MB" if self.policy.worker_memory_limit_mb else 0
        extra: dict[str, Any] = {}
        if security.require_encryption:
            extra.update(security=security, protocol="tls://")
        with dask.config.set({**SCHEDULER_CONFIG, **MEMORY_CONFIG}):
            self.cluster = LocalCluster(
                n_workers=self.policy.workers, threads_per_worker=1, processes=True,
                host="127.0.0.1", memory_limit=memory,
                dashboard_address="127.0.0.1:0" if self.settings.dashboard else None,
                # without a dashboard the scheduler still serves health checks: loopback, any port
                scheduler_kwargs={"dashboard": self.settings.dashboard, "dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.ERROR, env=thread_env(self.policy.worker_threads),
                **extra,
            )
        client = Client(self.cluster, security=security)
        client.wait_for_workers(self.policy.workers, timeout=self.policy.subject_spawn_timeout_sec)
        return client

    def _connect_timeout(self) -> float:
        return float(self.policy.subject_spawn_timeout_sec or 60)

    def _forbid_scheduler_retries(self, client: Any) -> None:
        """A worker death must reach habitrun, not be retried by the scheduler on another worker."""
        try:
            old = client.run_on_scheduler(_set_allowed_failures, 0)
        except Exception as exc:  # noqa: BLE001 - a scheduler that refuses remote calls still works
            _log.warning("could not set the scheduler's allowed_failures to 0 (%s); a batch whose "
                         "worker dies may be rerun by Dask", exc)
            return
        self._restored_allowed_failures = old

    def nanny_gone(self, nanny: str, wait: float) -> bool:
        """Has the nanny at ``nanny`` gone too (the worker's job or host ended, not just the worker)?"""
        from distributed.utils import sync

        try:
            return bool(sync(self.client.loop, nanny_gone, nanny, self.security, wait))
        except Exception:  # noqa: BLE001 - cannot tell: treat the death as the subject's
            return False

    @property
    def address(self) -> str | None:
        return None if self.client is None else self.client.scheduler.address

    def live_workers(self) -> dict[str, Any]:
        """Scheduler's view of the workers now (address -> info)."""
        return dict(self.client.scheduler_info(n_workers=-1).get("workers", {}))

    def restart_worker(self, address: str, forgotten: str | None = None) -> None:
        """Kill and respawn one worker through its nanny, in the background.

        ``forgotten``: the key of the batch that asked for it, released already. The restart waits
        (at most FORGET_WAIT_SEC) until the scheduler has heard of that release: a worker restarted
        while it holds the result of a key still wanted makes Dask run that batch again elsewhere,
        so its subjects would run twice (and a failing one pause a second worker).
        """
        self._submit(self._restart_workers, address, forgotten)

    def _restart_workers(self, address: str, forgotten: str | None) -> None:
        if forgotten is not None:
            self._wait_forgotten(forgotten)
        self.client.restart_workers([address], timeout=max(30.0, self.policy.graceful_shutdown_sec * 2),
                                    raise_for_error=False)

    def _wait_forgotten(self, key: str) -> None:
        deadline = time.monotonic() + FORGET_WAIT_SEC
        while time.monotonic() < deadline:
            try:
                held = self.client.sync(self.client.scheduler.who_has, keys=[key])
            except Exception:  # noqa: BLE001 - a scheduler that cannot say: restart anyway
                return
            if not held.get(key):
                return
            time.sleep(0.005)

    def scale(self, n: int) -> None:
        """Shrink (out-of-memory backoff) a cluster habitrun started; connected clusters are left alone."""
        if self.cluster is not None:
            self._submit(self.cluster.scale, n)

    def _submit(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        def quiet() -> None:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the dispatch loop sees the effect (a lost worker)
                _log.warning("Dask admin call %s failed: %s", getattr(fn, "__name__", fn), exc)

        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(quiet))

    def versions(self) -> dict[str, Any]:
        """dask/distributed/python versions on the workers (sets of distinct values)."""
        info = self.client.get_versions()
        found: dict[str, set[str]] = {"dask": set(), "distributed": set(), "python": set()}
        for worker in (info.get("workers") or {}).values():
            packages = (worker or {}).get("packages", {})
            for name in found:
                if packages.get(name):
                    found[name].add(str(packages[name]))
        return {name: sorted(values) for name, values in found.items()}

    def close(self, graceful: bool = True) -> None:
        """Wait for pending restarts, shut down what habitrun started, disconnect from the rest."""
        for fut in self._pending:
            with contextlib.suppress(Exception):
                fut.result(timeout=60 if graceful else 5)
        self._pool.shutdown(wait=graceful, cancel_futures=True)
        timeout = max(5.0, self.policy.graceful_shutdown_sec) if graceful else 5.0
        client, cluster = self.client, self.cluster
        self.client = self.cluster = None
        if client is not None and self._restored_allowed_failures is not None:
            with contextlib.suppress(Exception):
                client.run_on_scheduler(_set_allowed_failures, self._restored_allowed_failures)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=timeout)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=timeout)
            if self.kind == "local":
                _reap_stray_workers(self._children_before, wait=5.0 if graceful else 1.0)


def _reap_stray_workers(before: set[int], wait: float) -> None:
    """Kill local worker processes a nanny was still starting when the cluster closed.

    A worker the nanny respawns (after a kill) while the cluster shuts down is
    not yet registered and can outlive the close; it is a multiprocessing
    spawn child of this process that was not there before the cluster.
    """
    strays = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                strays.append(child)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(strays, timeout=wait)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=5)


def _set_allowed_failures(value: int, dask_scheduler: Any = None) -> int:
    """Runs on the scheduler: set ``allowed_failures``, return the old value."""
    old = dask_scheduler.allowed_failures
    dask_scheduler.allowed_failures = value
    return old

