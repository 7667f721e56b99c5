"""The program of one SLURM array task: run a chunk of a batch through a local process backend.

``python -m habitrun.engine.slurm.session BATCH_DIR OFFSET`` (the batch's
``job.sh`` runs it): chunk = OFFSET + ``$SLURM_ARRAY_TASK_ID`` (or
``$HABITRUN_SLURM_CHUNK`` outside SLURM). It skips the subjects an earlier
incarnation of the chunk already has an outcome for, runs the rest with the
stage's policy on a :class:`ProcessBackend`, and appends every outcome to
its own shard (:mod:`habitrun.engine.slurm.shard`). It never opens the store.

Signals: USR1 (SLURM's warning before pre-emption or the wall time) stops
taking subjects, lets the running ones finish within
``graceful_shutdown_sec``, writes ``end warned`` and, when the batch says
so, ``scontrol requeue``-s the task (a new incarnation runs the rest).
INT (``scancel --signal=INT --batch``: the runner's Ctrl-C) stops the same way but
writes ``end stopped`` and is not requeued. TERM (scancel, the time limit)
stops at once and writes ``end terminated``.
SLURM signals every process of the job, so after a stop signal a worker's
death (or a timeout, or a lost start) is nobody's failure and is not
written; a ``worker_died`` is held about a second before it is written, so
that a TERM arriving just after the deaths it caused is seen first.
Exit 0 when done or stopped; 2 with one line on stderr when the batch
cannot be read or the stage cannot run at all.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from habitrun.engine.contract import Backend, FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.invoke import one_line
from habitrun.engine.slurm.batch import BatchSpec, read_chunk, read_spec
from habitrun.engine.slurm.shard import ShardWriter, read_chunk_records
from habitrun.errors import BatchError, HabitrunError
from habitrun.spec.policy import RunPolicy

HOLD_DEATH_SEC = 1.0  # a worker_died waits this long for a TERM that would explain it
START_POLL_SEC = 0.05  # how often running subjects are looked at for start records (a shared-memory read)
REQUEUE_TIMEOUT_SEC = 60.0
NOT_CHARGED_AFTER_STOP = frozenset({FailureKind.WORKER_DIED, FailureKind.INTERRUPTED, FailureKind.TIMEOUT,
                                    FailureKind.SPAWN_TIMEOUT})
USAGE = "usage: python -m habitrun.engine.slurm.session BATCH_DIR OFFSET"


def chunk_index(offset: str, env: Mapping[str, str]) -> int:
    """OFFSET + the array task's index ($SLURM_ARRAY_TASK_ID, or $HABITRUN_SLURM_CHUNK outside SLURM)."""
    task = env.get("SLURM_ARRAY_TASK_ID") or env.get("HABITRUN_SLURM_CHUNK")
    if task is None:
        raise BatchError("neither SLURM_ARRAY_TASK_ID nor HABITRUN_SLURM_CHUNK is set: which chunk to run?")
    try:
        return int(offset) + int(task)
    except ValueError:
        raise BatchError(f"chunk offset {offset!r} and task index {task!r} must be whole numbers") from None


def slurm_gave_gpus(env: Mapping[str, str]) -> bool:
    """Did SLURM give this task GPUs (``--gres=gpu:N``)? It then names them in SLURM_JOB_GPUS (or
    SLURM_STEP_GPUS) and sets CUDA_VISIBLE_DEVICES to them."""
    return bool((env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")) and env.get("CUDA_VISIBLE_DEVICES"))


def process_policy(spec: BatchSpec, env: Mapping[str, str] | None = None) -> RunPolicy:
    """The stage's policy as this task's local process backend runs it; BatchError if it is not one.

    A task SLURM gave GPUs pins one to each worker (``cap_workers_to_gpu_pool``): workers beyond
    the GPUs it got would share them, so they are capped too, as on the process backend."""
    env = os.environ if env is None else env
    gpus = {"cap_workers_to_gpu_pool": True} if slurm_gave_gpus(env) else {}
    try:
        return RunPolicy.from_dict({**spec.policy, "backend": "process", "slurm": None, **gpus})
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        where = ".".join(str(part) for part in first["loc"])
        raise BatchError(f"the batch's policy is not valid here (another habitrun version?): "
                         f"{where + ': ' if where else ''}{first['msg']}") from None


def incarnation_name(env: Mapping[str, str]) -> str:
    """``JOBID-RESTARTS-PID``: a requeued task writes a new shard, never after a killed one's torn tail."""
    return f"{env.get('SLURM_JOB_ID') or 'local'}-{env.get('SLURM_RESTART_COUNT') or 0}-{os.getpid()}"


class Session:
    """One incarnation running its chunk: the shard, the stop flag, the held deaths, the start poller."""

    def __init__(self, batch: Path, chunk: int, spec: BatchSpec, tasks: list[SubjectTask]) -> None:
        self.batch, self.chunk, self.spec = batch, chunk, spec
        self.policy = process_policy(spec)
        done = {r.key for r in read_chunk_records(batch, chunk) if r.kind == "outcome"}
        self.todo = [task for task in tasks if task.key not in done]
        self.skipped = len(tasks) - len(self.todo)
        self.incarnation = incarnation_name(os.environ)
        self.writer = ShardWriter(batch, chunk, self.incarnation)
        self.stop = StopFlag()
        self.terminated = False  # TERM seen (over a USR1 before it)
        self._lock = threading.Lock()
        self._written: set[str] = set()  # keys with an outcome in this incarnation's shard
        self._started: set[str] = set()
        self._held: list[tuple[float, SubjectOutcome]] = []  # worker_died outcomes, with when they came
        self._finished = threading.Event()

    # -- signals (installed by main only) ----------------------------------------------------------
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """USR1: soft stop, requeued after; INT (the runner's Ctrl-C): soft stop; TERM: hard stop.
        Signal-handler safe (sets flags only)."""
        if signum == signal.SIGUSR1:
            self.stop.set("warned", signum=signum)
        elif signum == signal.SIGINT:
            self.stop.set("stopped", signum=signum)
        else:
            self.terminated = True
            self.stop.set("terminated", hard=True, signum=signum)

    # -- outcomes and starts -----------------------------------------------------------------------
    def report(self, batch: list[SubjectOutcome]) -> None:
        """The backend's report: written now, held (a death), or dropped (what a stop signal caused)."""
        now = time.monotonic()
        with self._lock:
            keep = []
            for outcome in batch:
                if not outcome.ok and outcome.kind == FailureKind.WORKER_DIED and not self.stop.is_set():
                    self._held.append((now, outcome))
                else:
                    keep.append(outcome)
            self._write_locked(keep)

    def _write_locked(self, batch: Sequence[SubjectOutcome]) -> None:
        stopped = self.stop.is_set()
        out = []
        for outcome in batch:
            key = outcome.task.key
            if key in self._written:
                continue
            if stopped and not outcome.ok and outcome.kind in NOT_CHARGED_AFTER_STOP:
                continue
            self._written.add(key)
            out.append(outcome)
        self.writer.outcomes(out)

    def flush_held(self, *, all_due: bool = False) -> None:
        """Write the held deaths that waited long enough (``all_due``: every one), unless stopped."""
        now = time.monotonic()
        with self._lock:
            due = [o for t, o in self._held if all_due or now - t >= HOLD_DEATH_SEC]
            self._held = [(t, o) for t, o in self._held if not (all_due or now - t >= HOLD_DEATH_SEC)]
            self._write_locked(due)

    def _watch(self, backend: Backend) -> None:
        """The start poller: a start record per subject newly in a worker's hands; due deaths written."""
        while not self._finished.wait(START_POLL_SEC):
            try:
                running = backend.running_subjects()
            except Exception:  # noqa: BLE001 - a hint only: never let it end the session
                running = []
            with self._lock:
                new = [r for r in running if r.task.key not in self._started]
                self._started.update(r.task.key for r in new)
            for r in new:
                self.writer.started(r.task.key, r.pid, r.started_at)
            self.flush_held()

    def _wait_out_holds(self) -> None:
        """At the chunk's end: give the last held deaths their second (a TERM may still come), then write."""
        with self._lock:
            latest = max((t for t, _ in self._held), default=None)
        if latest is None:
            return
        remaining = HOLD_DEATH_SEC - (time.monotonic() - latest)
        if remaining > 0:
            select.select([self.stop.fileno()], [], [], remaining)
        self.flush_held(all_due=True)

    def _stopped_within(self, sec: float) -> bool:
        """Is a stop signal here, or does one come within ``sec``?"""
        if not self.stop.is_set():
            select.select([self.stop.fileno()], [], [], sec)
        return self.stop.is_set()

    # -- the run -----------------------------------------------------------------------------------
    def info(self) -> dict[str, object]:
        env = os.environ
        return {"host": socket.gethostname(), "pid": os.getpid(), "job_id": env.get("SLURM_JOB_ID"),
                "array_job_id": env.get("SLURM_ARRAY_JOB_ID"), "array_task_id": env.get("SLURM_ARRAY_TASK_ID"),
                "restart": int(env.get("SLURM_RESTART_COUNT") or 0), "time": time.time(), "chunk": self.chunk,
                "incarnation": self.incarnation, "subjects": len(self.todo), "skipped": self.skipped}

    def run(self) -> tuple[str, int]:
        """Run the chunk; the end reason written and the exit code."""
        from habitrun.engine.process import ProcessBackend

        self.writer.begin(self.info())
        backend = None
        watcher = None
        reason, code = "done", 0
        try:
            backend = ProcessBackend.from_policy(self.policy)
            # a folder of its own: sessions run side by side, and a process backend removes its scratch
            # folder when it closes (when empty), under the feet of another session's starting worker
            backend.scratch_dir = (os.path.join(self.spec.scratch_dir, f"slurm-{self.incarnation}")
                                   if self.spec.scratch_dir else None)
            watcher = threading.Thread(target=self._watch, args=(backend,), name="habitrun-shard-starts",
                                       daemon=True)
            watcher.start()
            if self.todo and not self.stop.is_set():
                backend.run_tasks(self.spec.op, self.todo, self.report, self.stop)
            if not self.stop.is_set():
                self._wait_out_holds()
        except HabitrunError as exc:  # no worker could start, the operator cannot be built: the stage's error
            if not self._stopped_within(HOLD_DEATH_SEC):  # ... unless a TERM killing the workers caused it
                said = exc.message.splitlines()[0] if exc.message else ""
                reason, code = f"error: {type(exc).__name__}: {said}", exc.exit_code
        except Exception as exc:  # noqa: BLE001 - said in the shard (the runner stops on it) and on stderr
            if not self._stopped_within(HOLD_DEATH_SEC):
                reason, code = f"error: {one_line(exc)}", 2
                traceback.print_exc()
        finally:
            self._finished.set()
            if watcher is not None:
                watcher.join()
        if code == 0 and self.stop.is_set():
            with self._lock:
                unfinished = any(task.key not in self._written for task in self.todo)
            if unfinished:
                reason = "terminated" if self.terminated else str(self.stop.reason)  # warned | stopped
        try:
            self.writer.end(reason)
        finally:
            if backend is not None:
                backend.close(graceful=not self.stop.hard)
            self.writer.close()
        return reason, code


def requeue_self(job_id: str) -> None:
    """``scontrol requeue`` this task (a warned session's rest runs in a new incarnation); said, never raised."""
    try:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True,
                              timeout=REQUEUE_TIMEOUT_SEC, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"habitrun session: scontrol requeue {job_id} failed: {one_line(exc)}", file=sys.stderr)
        return
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        print(f"habitrun session: scontrol requeue {job_id} failed (exit {done.returncode})"
              f"{': ' + said[-1] if said else ''}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chunk this array task is for; the exit code (0 done or stopped, 2 the batch is unusable)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(f"habitrun session: {USAGE}", file=sys.stderr)
        return 2
    batch = Path(args[0])
    try:
        chunk = chunk_index(args[1], os.environ)
        spec = read_spec(batch)
        if not 0 <= chunk < spec.chunks:
            raise BatchError(f"chunk {chunk} is not in batch {batch} (it has {spec.chunks})")
        tasks = read_chunk(batch, chunk)
        session = Session(batch, chunk, spec, tasks)
    except (HabitrunError, OSError) as exc:
        message = exc.message if isinstance(exc, HabitrunError) else f"{batch}: {one_line(exc)}"
        print(f"habitrun session: {message}", file=sys.stderr)
        return 2
    handled = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in handled}
    try:
        for sig in handled:
            signal.signal(sig, session.on_signal)
        reason, code = session.run()
        if code != 0:
            print(f"habitrun session: chunk {chunk} of {batch}: {reason}", file=sys.stderr)
        elif reason == "warned" and spec.requeue and os.environ.get("SLURM_JOB_ID"):
            requeue_self(os.environ["SLURM_JOB_ID"])
        return code
    except OSError as exc:  # the shard cannot be written (a full or gone file system): nothing is stored
        print(f"habitrun session: chunk {chunk} of {batch}: its shard cannot be written: {one_line(exc)}",
              file=sys.stderr)
        return 2
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        session.stop.close()


if __name__ == "__main__":
    sys.exit(main())
