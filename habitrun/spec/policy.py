"""RunPolicy: how a study's subjects are run, with every field defaulted.

The field names and defaults are those of the process-pool backend habitrun
grew from, so a policy written for that toolkit reads the same here. The
model is frozen and forbids unknown keys; a backend is built from it
one-to-one.

Backend rule: ``backend`` defaults to ``process``. ``serial`` runs subjects
in the runner's own process, which cannot enforce a timeout, isolate a
subject, cap memory or run several workers; a policy that asks for any of
those together with ``serial`` is rejected rather than run without them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from habitrun.spec.failures import FailureKind
from habitrun.spec.located import LocatedError

Backend = Literal["serial", "process", "dask", "slurm"]
ParallelMode = Literal["persistent", "isolated"]
FailureMode = Literal["continue", "fail_fast"]
StartMethod = Literal["forkserver", "spawn", "fork"]
CacheMode = Literal["standard", "deep", "lenient"]
RetryKind = Literal["worker_died", "oom", "timeout", "exception"]
RETRY_KINDS: tuple[str, ...] = ("worker_died", "oom", "timeout", "exception")
DEFAULT_RETRY_ON: tuple[RetryKind, ...] = ("worker_died", "oom")
"""Retried by default: what is likely transient. A worker killed from outside or
run out of memory (often because of what ran beside it; OOM backoff also runs
fewer at once) may well succeed again. An exception or a timeout of the same
code on the same input will almost always repeat, and a retried timeout costs
the whole budget again (900 s by default, per round)."""

# Every failure kind, grouped under the name auto_retry_on takes for it; None: never retried
# (a test fails when a kind has no entry, so a new kind is never retried by accident).
RETRY_GROUP: dict[str, RetryKind | None] = {
    FailureKind.WORKER_DIED: "worker_died",
    FailureKind.OOM: "oom",
    FailureKind.TIMEOUT: "timeout",
    FailureKind.SPAWN_TIMEOUT: "timeout",
    FailureKind.EXCEPTION: "exception",
    FailureKind.NO_REPORT: "exception",
    FailureKind.UNPICKLABLE: "exception",
    FailureKind.DISK_FULL: None,  # the machine's fault: the run stops, nothing is recorded
    FailureKind.SKIPPED: None,  # its upstream failed: running it again changes nothing
    FailureKind.INTERRUPTED: None,  # stopped on purpose
}

MAX_WAIT_SEC = 2_073_600
"""Upper bound (24 days) of every *_sec field that reaches a wait. The workers
are waited on with poll(), whose timeout is a 32-bit count of milliseconds:
past 2,147,483 s (24.8 days; so not 30 days) it raises OverflowError, and only
once the run is under way. A longer budget is better written as null."""


_RETRY_ON_SCHEMA = {"anyOf": [
    {"const": "all"},
    {"type": "array", "items": {"enum": list(RETRY_KINDS)}, "uniqueItems": True},
]}


def ids_as_strings(value: Any) -> Any:
    """A list of subject ids as a tuple of strings (an id the YAML gives as a number counts as its text)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            if not isinstance(item, (str, int)) or isinstance(item, bool):
                raise ValueError(f"subject ids must be strings, got {item!r}")
        return tuple(str(item) for item in value)
    return value


def expand_retry_kinds(value: Any) -> Any:
    """``auto_retry_on: all`` is every kind (HABIT's behaviour: every failure is retried)."""
    return RETRY_KINDS if value == "all" else value


class TLSSettings(BaseModel):
    """TLS files for connecting to a remote Dask scheduler."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ca_file: str = Field(description="CA certificate (PEM) that signed the scheduler's certificate.")
    cert: str = Field(description="This client's certificate (PEM).")
    key: str | None = Field(default=None, description="This client's private key (PEM), if not inside `cert`.")


class JobqueueSettings(BaseModel):
    """A batch-system cluster started through dask-jobqueue.

    habitrun runs one subject at a time per Dask worker process, so a job of
    ``cores`` cores runs ``cores`` single-threaded workers (``processes``
    defaults to ``cores``); BLAS threads per worker come from ``worker_threads``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    system: Literal["slurm", "pbs", "sge", "lsf", "htcondor", "moab", "oar"] = "slurm"
    cores: int = Field(default=1, ge=1, description="Cores per job.")
    memory: str = Field(default="4GB", description="Memory per job, e.g. '16GB'.")
    walltime: str | None = Field(default=None, description="Wall time per job, e.g. '02:00:00'.")
    queue: str | None = Field(default=None, description="Partition or queue.")
    account: str | None = Field(default=None, description="Account/project to charge.")
    processes: int | None = Field(default=None, ge=1, description="Dask worker processes per job (default and only allowed value: cores).")
    job_extra_directives: tuple[str, ...] = Field(default=(), description="Extra #SBATCH (or #PBS ...) lines.")
    job_script_prologue: tuple[str, ...] = Field(default=(), description="Shell lines run before the worker starts.")
    python: str | None = Field(default=None, description="Python executable on the compute nodes.")
    local_directory: str | None = Field(default=None, description="Worker scratch folder on the nodes.")
    death_timeout_sec: float = Field(default=120.0, gt=0, le=MAX_WAIT_SEC, description="A worker whose scheduler (the runner) is gone exits after this long, ending its job.")

    @model_validator(mode="after")
    def _one_subject_per_worker(self) -> JobqueueSettings:
        if self.processes is not None and self.processes != self.cores:
            raise ValueError(
                f"processes={self.processes} with cores={self.cores}: habitrun runs one subject per "
                "single-threaded Dask worker, so processes must equal cores (leave it out); "
                "use worker_threads for BLAS threads"
            )
        if self.system == "htcondor" and (self.queue or self.account):
            raise ValueError("htcondor takes no queue or account; put them in job_extra_directives")
        return self


class DaskSettings(BaseModel):
    """Where the Dask engine runs: a local cluster (default), an address, or a batch system."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = Field(default=None, description="Scheduler address, e.g. 'tls://10.0.0.5:8786'.")
    scheduler_file: str | None = Field(default=None, description="Scheduler file written by `dask scheduler --scheduler-file`.")
    jobqueue: JobqueueSettings | None = None
    tls: TLSSettings | None = None
    dashboard: bool = Field(default=False, description="Serve the dashboard of a local cluster (loopback only).")
    batch_target_sec: float = Field(default=0.05, gt=0, le=60, description="Aim for micro-batches of about this much work per Dask task (fast subjects travel together; slow ones alone).")

    @model_validator(mode="after")
    def _one_way_to_reach_a_cluster(self) -> DaskSettings:
        given = [n for n in ("address", "scheduler_file", "jobqueue") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(
                f"give at most one of address, scheduler_file, jobqueue (got {', '.join(given)})"
            )
        if self.address is not None and "://" in self.address:
            scheme = self.address.split("://", 1)[0]
            if scheme not in ("tcp", "tls", "inproc", "ucx", "ws", "wss"):
                raise ValueError(f"address {self.address!r}: unknown protocol {scheme!r} (use tcp:// or tls://)")
        if self.tls is not None and self.address is not None and self.address.startswith("tcp://"):
            raise ValueError("tls settings with a tcp:// address: use tls://host:port")
        return self


SLURM_OWN_OPTIONS = ("--array", "--output", "--error", "--parsable", "--signal", "--requeue", "--no-requeue",
                      "--wrap", "--chdir", "--export", "--open-mode")
"""sbatch options habitrun sets itself for an array of worker sessions; ``slurm.extra`` may not give them."""

_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_time_sec(text: str) -> int:
    """A SLURM time limit in seconds ("30", "30:00", "2:30:00", "1-12", "1-12:30", "1-12:30:00"); ValueError else."""
    match = _SLURM_TIME.match(text.strip())
    if match is None:
        raise ValueError(f"time {text!r} is no SLURM time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    days, first, second, third = match.groups()
    if days is None:  # minutes | minutes:seconds | hours:minutes:seconds
        if third is not None:
            return int(first) * 3600 + int(second) * 60 + int(third)
        if second is not None:
            return int(first) * 60 + int(second)
        return int(first) * 60
    hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds


class SlurmSettings(BaseModel):
    """SLURM job arrays of warm worker sessions (``backend: slurm``): what each array task asks for.

    Each array task runs one habitrun worker session with ``workers`` worker
    processes on its node, through a chunk of the stage's subjects. Given in
    the policy or per stage (a stage's ``slurm:`` is merged over the policy's).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: str | None = Field(default=None, description="Partition (sbatch --partition); null: the cluster's default.")
    time: str | None = Field(default=None, description="Wall time per array task, in SLURM's form ('30', '2:00:00', '1-12'); chunks are sized to fit in it. null: the partition's default.")
    mem: str | None = Field(default=None, description="Memory per array task (sbatch --mem, e.g. '8G'); null: the cluster's default per CPU.")
    cpus_per_task: int | None = Field(default=None, ge=1, description="CPUs per array task; default: workers × worker_threads.")
    gres: str | None = Field(default=None, description="Generic resources per array task, e.g. 'gpu:1' (the session pins its workers to the GPUs SLURM gives it).")
    account: str | None = Field(default=None, description="Account to charge (sbatch --account).")
    qos: str | None = Field(default=None, description="Quality of service (sbatch --qos).")
    extra: tuple[str, ...] = Field(default=(), description="More sbatch options, each one argument, e.g. '--constraint=avx2'.")
    setup: tuple[str, ...] = Field(default=(), description="Shell lines run in the job before the session starts (e.g. 'module load python/3.11').")
    python: str | None = Field(default=None, description="The Python (with habitrun) on the compute nodes; default: the runner's own.")
    chunk_minutes: float = Field(default=20.0, gt=0, le=MAX_WAIT_SEC / 60, description="Aim for array tasks of about this long, from the stage's learned subject durations (first run: up to 100 tasks per stage).")
    chunk_size: int | None = Field(default=None, ge=1, description="Subjects per array task, fixed (overrides chunk_minutes).")
    max_running: int | None = Field(default=None, ge=1, description="Array tasks running at once (sbatch --array=...%N); null: as many as the cluster gives.")
    signal_sec: int = Field(default=120, ge=1, le=65535, description="Seconds before a task's end (wall time or pre-emption) that SLURM warns it (--signal=B:USR1@N): the session stops taking subjects and requeues itself.")
    requeue: bool = Field(default=True, description="Submit with --requeue: a pre-empted or node-failed task runs again (its finished subjects skipped).")
    poll_sec: float = Field(default=2.0, gt=0, le=600, description="How often the runner reads the shards and asks squeue.")
    max_array_size: int | None = Field(default=None, ge=1, description="Largest array to submit; default: the cluster's MaxArraySize (scontrol show config).")

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        if value is not None:
            slurm_time_sec(value)
        return value

    @field_validator("extra")
    @classmethod
    def _not_ours(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item.startswith("-"):
                raise ValueError(f"extra option {item!r}: give each as one sbatch option, e.g. '--constraint=avx2'")
            name = item.split("=", 1)[0]
            if name in SLURM_OWN_OPTIONS:
                raise ValueError(f"extra option {item!r}: habitrun sets {name} itself for its arrays")
        return value

    def time_sec(self) -> int | None:
        """The wall time per task in seconds, if given."""
        return None if self.time is None else slurm_time_sec(self.time)


class RunPolicy(BaseModel):
    """How subjects run: workers, timeouts, failure handling, retries, resume.

    Cross-field rules (each rejected with a message, because the combination
    would silently not do what it says):

    * ``backend: serial`` with ``workers > 1``, a ``subject_timeout_sec``,
      ``parallel_mode: isolated`` or ``worker_memory_limit_mb``: all of these
      need a process boundary that the serial backend does not have.
    * ``persistent_worker_recycle_after_tasks > 0`` with ``isolated`` mode:
      an isolated worker serves one subject, there is nothing to recycle.
    * ``dask`` settings with a backend other than ``dask``; ``dask`` with
      ``cap_workers_to_gpu_pool`` (Dask workers get their GPUs when started).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: int = Field(default=1, ge=1, description="Worker processes (slots) running subjects at once (backend slurm: in each array task).")
    backend: Backend = Field(default="process", description="serial (in-process), process (worker processes on this machine), dask (a Dask cluster), slurm (SLURM job arrays of worker sessions; see slurm settings).")
    subject_timeout_sec: float | None = Field(default=900.0, gt=0, le=MAX_WAIT_SEC, description="Wall-clock budget per subject; null turns it off.")
    subject_spawn_timeout_sec: float | None = Field(default=120.0, gt=0, le=MAX_WAIT_SEC, description="Budget for a worker to start and import the operator; null turns it off.")
    graceful_shutdown_sec: float = Field(default=15.0, ge=0, le=MAX_WAIT_SEC, description="Between SIGTERM and SIGKILL when a worker is stopped.")
    on_subject_failure: FailureMode = Field(default="continue", description="continue: record and go on; fail_fast: stop the run at the first failure.")
    oom_backoff: bool = Field(default=True, description="Reduce the worker count after an out-of-memory failure.")
    oom_reduce_workers_by: int = Field(default=1, ge=1, description="Workers removed per out-of-memory failure (never below 1).")
    cap_workers_to_gpu_pool: bool = Field(default=False, description="Clamp workers to the GPUs detected and pin one GPU per worker.")
    resume: bool = Field(default=True, description="Skip subjects already stored as done.")
    checkpoint_dir: str | None = Field(default=None, description="Checkpoint store folder; null: `.habitrun/` beside the recipe.")
    parallel_mode: ParallelMode = Field(default="persistent", description="persistent: long-lived workers; isolated: a fresh process per subject.")
    auto_retry_rounds: int = Field(default=2, ge=0, description="Extra rounds for subjects that failed, within one run.")
    auto_retry_on: Annotated[tuple[RetryKind, ...], WithJsonSchema(_RETRY_ON_SCHEMA)] = Field(default=DEFAULT_RETRY_ON, description="Failure kinds the retry rounds retry: worker_died, oom, timeout, exception, or 'all'. Default: the transient ones (worker_died, oom).")
    retry_failed_subjects: bool = Field(default=False, description="Rerun subjects whose failure is recorded in the store.")
    force_rerun_subjects: tuple[str, ...] = Field(default=(), description="Subject ids to rerun even when stored as done.")
    clear_checkpoint_on_success: bool = Field(default=False, description="Delete the stage's stored results once every subject succeeded.")
    strict_checkpoint_hash: bool = Field(default=False, description="Refuse (instead of warn) a store written by a different recipe.")
    persistent_worker_max_consecutive_failures: int = Field(default=1, ge=1, description="Restart a persistent worker after this many failures in a row.")
    persistent_worker_recycle_after_tasks: int = Field(default=0, ge=0, description="Replace a persistent worker after this many subjects (0: never).")
    worker_threads: int = Field(default=1, ge=1, description="BLAS/OpenMP threads per worker (OMP_NUM_THREADS and friends).")
    worker_memory_limit_mb: int | None = Field(default=None, gt=0, description="Resident memory per worker (with its children) past which it is stopped as out of memory.")
    memory_budget_mb: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(default="auto", description="Process backend: subjects start only while the predicted peak memory of those running (learned from the trace, see memory_hint) plus their workers' own fits this many MB; 'auto' (the default): 85 % of the memory the run may use (its cgroup's limit when there is one, else MemAvailable), less what the runner itself holds; with the serial and dask backends 'auto' does not apply (a number is refused there); null: no budget (workers alone decide, OOM backoff as before).")
    memory_hint: str | None = Field(default=None, description="A numeric manifest column that grows with a subject's memory (e.g. voxels): what memory_budget_mb predicts from for subjects with no history (default: the size of the subject's input files).")
    log_max_mb: float = Field(default=10.0, gt=0, le=1_000_000, description="A subject's log keeps at most this much of what it printed: the head and the tail, with a line saying how much was cut.")
    start_method: StartMethod = Field(default="forkserver", description="How worker processes start: forkserver (operator module preloaded), spawn, or fork.")
    dask: DaskSettings | None = Field(default=None, description="Dask cluster settings (backend: dask only).")
    slurm: SlurmSettings | None = Field(default=None, description="SLURM job-array settings (backend: slurm only; may be given per stage, merged over the policy's).")
    cache: CacheMode = Field(default="standard", description="How input files enter keys: standard (content; a file whose size, mtime and inode are unchanged is not read again), deep (content, every file read every plan), lenient (path and size only, never read).")
    rerun_on_package_change: bool = Field(default=False, description="Put the versions of the third-party packages a stage's code imports into its keys (default: a change is only reported by plan and status).")
    report: bool = Field(default=False, description="Write report.html (habitrun report) into the run folder at the end of every run.")
    require_complete_cohort: bool = Field(default=False, description="Refuse to run a collect or train stage on a partial cohort (a subject found incomplete, or failed or skipped upstream): the stage fails with the missing subjects listed and the run exits 1; map stages still run. Default: the stage runs on the subjects it has, and the summary, status and report name those missing.")

    @field_validator("force_rerun_subjects", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else ids_as_strings(value)

    @field_validator("auto_retry_on", mode="before")
    @classmethod
    def _all_kinds(cls, value: Any) -> Any:
        return expand_retry_kinds(value)

    def retries(self, kind: str | None) -> bool:
        """Do retry rounds rerun a subject that failed with this recorded kind? (A failure without
        a kind counts as an exception; a kind that is no FailureKind is a KeyError: a bug.)"""
        group = RETRY_GROUP[kind] if kind is not None else "exception"
        return group is not None and group in self.auto_retry_on

    @model_validator(mode="after")
    def _combinations_that_make_sense(self) -> RunPolicy:
        problems: list[tuple[tuple[str, ...], str]] = []
        if self.backend == "serial":
            needs_process = []
            if self.workers > 1:
                needs_process.append(f"workers={self.workers}")
            if self.subject_timeout_sec is not None:
                needs_process.append("subject_timeout_sec (set it to null)")
            if self.parallel_mode == "isolated":
                needs_process.append("parallel_mode=isolated")
            if self.worker_memory_limit_mb is not None:
                needs_process.append("worker_memory_limit_mb")
            if needs_process:
                problems.append((
                    ("backend",),
                    "backend 'serial' runs subjects in-process and cannot honour "
                    + ", ".join(needs_process)
                    + "; use backend 'process' or drop them",
                ))
        if self.parallel_mode == "isolated" and self.persistent_worker_recycle_after_tasks > 0:
            problems.append((
                ("persistent_worker_recycle_after_tasks",),
                "persistent_worker_recycle_after_tasks only applies to parallel_mode 'persistent'",
            ))
        if isinstance(self.memory_budget_mb, int) and self.backend not in ("process", "slurm"):  # 'auto' (the default) just does not apply
            problems.append((("memory_budget_mb",), "a memory_budget_mb in MB applies to backend 'process' (it admits "
                             "subjects into that backend's workers by their predicted memory) and 'slurm' (per array "
                             "task); drop it or use backend 'process'"))
        if self.slurm is not None and self.backend != "slurm":
            problems.append((("slurm",), "the 'slurm' settings need backend 'slurm'"))
        if self.slurm is not None and self.slurm.time is not None and self.slurm.time_sec() <= self.slurm.signal_sec:  # type: ignore[operator]
            problems.append((("slurm", "time"), f"slurm.time {self.slurm.time!r} is not longer than slurm.signal_sec "
                             f"({self.slurm.signal_sec} s): a task would be warned before it starts"))
        if self.dask is not None and self.backend != "dask":
            problems.append((("dask",), "the 'dask' settings need backend 'dask'"))
        if self.backend == "dask" and self.cap_workers_to_gpu_pool:
            problems.append((("cap_workers_to_gpu_pool",),
                             "cap_workers_to_gpu_pool does not apply to backend 'dask': start each Dask "
                             "worker with its GPU (CUDA_VISIBLE_DEVICES) instead"))
        if problems:
            raise LocatedError(problems)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML/JSON-safe dict (tuples as lists) that :meth:`from_dict` reads back."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPolicy:
        """Validate a dict (e.g. from YAML) into a policy."""
        return cls.model_validate(data)

    def merged(self, override: dict[str, Any] | None) -> RunPolicy:
        """This policy with a stage's partial override applied over it."""
        if not override:
            return self
        data = self.model_dump()
        slurm = override.get("slurm")
        if isinstance(slurm, dict) and isinstance(data.get("slurm"), dict):  # a stage's resources over the policy's
            override = {**override, "slurm": {**data["slurm"], **slurm}}
        data.update(override)
        return type(self).model_validate(data)

