"""SlurmBackend: a stage's subjects as SLURM job arrays of warm worker sessions, merged back from shards.

The runner side of ``backend: slurm``. For a stage's tasks it first takes what
earlier batches of the same stage already hold (a detached or killed run's
shards: their outcomes are reported as if they had just arrived, and their
array tasks still queued or running are waited for, not submitted again),
then chunks the rest, writes one batch folder and submits it as ``sbatch
--array`` calls (split at the cluster's ``MaxArraySize``). While waiting it
reads the shards' new lines (each outcome reported once) and asks ``squeue``
which array tasks live. A task that is gone without its session saying its
chunk is done lost its subjects, which are submitted again, uncharged; only a
subject that was running in two sessions that died without a word is charged
``worker_died``. A stop (Ctrl-C) cancels what this runner submitted; a
detached run leaves it running and ends the run (``habitrun resume`` comes
back for it).
"""

from __future__ import annotations

import json
import logging
import os
import select
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from habitrun.engine.contract import (
    Backend,
    OperatorRef,
    ReportFn,
    RunningSubject,
    SubjectOutcome,
    SubjectTask,
)
from habitrun.engine.control import DETACHED, StopFlag
from habitrun.engine.slurm import batch as batches
from habitrun.engine.slurm import commands
from habitrun.engine.slurm.chunking import array_parts, chunk_size, split
from habitrun.engine.slurm.shard import ShardFollower, ShardRecord, outcome_wire_of
from habitrun.engine.wire import outcome_from_wire
from habitrun.errors import OperatorBindError, SlurmError, WorkerStartError
from habitrun.spec.failures import FailureKind
from habitrun.spec.policy import RunPolicy, SlurmSettings

log = logging.getLogger(__name__)

SLURM_FOLDER = "slurm"  # under the study's run root: one folder per batch
ARRAYS_FILE = "arrays.json"  # in a batch folder: the stage, its chunks' array tasks, who submitted them
CLOSED_FILE = "closed"  # in a batch folder: everything it holds was merged by a run that ended cleanly
SQUEUE_FAILURES_TOLERATED = 5  # squeue failing this many polls in a row ends the stage with a SlurmError


def slurm_folder(workspace: Path) -> Path:
    """Where a study's batch folders live (status reads them too)."""
    return workspace / SLURM_FOLDER


@dataclass
class Incarnation:
    """One session of one chunk, as its shard tells it."""

    started: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (worker pid, time)
    finished: set[str] = field(default_factory=set)
    end: str | None = None  # the reason it gave when it ended cleanly


@dataclass
class ChunkState:
    """A chunk of a batch: its array task, its keys, what each session of it did."""

    batch: Path
    index: int
    task_id: tuple[str, int] | None  # (array job id, array index); None until submitted
    keys: list[str]
    sessions: dict[str, Incarnation] = field(default_factory=dict)
    resolved: bool = False  # its task ended and what it left was dealt with


class SlurmBackend(Backend):
    """Runs each stage's tasks as job arrays on a SLURM cluster (see the module docstring)."""

    name = "slurm"

    def __init__(self, policy: RunPolicy, workspace: Path | None = None, *, detach: bool = False) -> None:
        self.policy = policy
        self.settings = policy.slurm or SlurmSettings()
        self.root = slurm_folder(workspace if workspace is not None else Path.cwd() / ".habitrun")
        self.detach = detach
        self.wants_durations = True  # map_stage sets typical_sec before each stage
        self.run_id: str | None = None
        self.submitted: list[str] = []  # array job ids this backend submitted
        self.batches: list[Path] = []  # batch folders this backend submitted
        self.left_running: list[str] = []
        self.left_subjects = 0
        self.jobs = 0  # array tasks submitted
        self._live: dict[tuple[str, int], str] = {}
        self._running: dict[str, RunningSubject] = {}
        self._unstarted: dict[str, int] = {}  # key -> array tasks of its that ended before their session began
        self._consumed: dict[Path, bool] = {}  # batch -> every outcome it holds was reported
        self._closed = False
        reason = commands.why_unavailable()
        if reason is not None:  # the run's error (recorded as its end, exit 2), before anything is submitted
            raise WorkerStartError(reason)

    @classmethod
    def from_policy(cls, policy: RunPolicy, workspace: Path | None = None, *, detach: bool = False) -> SlurmBackend:
        return cls(policy, workspace, detach=detach)

    @property
    def effective_workers(self) -> int:
        return self.policy.workers

    def running(self) -> int | None:
        return len(self._running)

    def running_subjects(self) -> list[RunningSubject]:
        return list(self._running.values())

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "workers": self.policy.workers, "arrays": list(self.submitted),
                "array_tasks": self.jobs, "batches": [p.name for p in self.batches],
                **({"detached": list(self.left_running)} if self.left_running else {})}

    # ------------------------------------------------------------------ one stage
    def run_tasks(self, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        self.left_running, self.left_subjects = [], 0
        try:
            self._run(op, tasks, report, stop)
        except SlurmError as exc:  # the cluster refused or lost the means to run anything: the run's error
            raise WorkerStartError(f"stage {op.stage!r} on backend slurm: {exc.message}") from None

    def _run(self, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        wanted = {t.key: t for t in tasks}
        self._close_consumed()
        if self.scratch_dir:
            self.run_id = Path(self.scratch_dir).parent.name  # the run folder's name
        looked: list[Path] = []
        chunks = self._adopt(op.stage, wanted, report, looked)
        waited = {k for c in chunks if not c.resolved for k in c.keys}
        left = [t for t in tasks if t.key in wanted and t.key not in waited]
        if left and not stop.is_set():
            chunks += self._submit(op, left)
        if self._wait(op, chunks, wanted, report, stop):
            for folder in looked:  # every outcome they held for this stage was reported
                self._consumed.setdefault(folder, True)

    def _wait(self, op: OperatorRef, chunks: list[ChunkState], wanted: dict[str, SubjectTask], report: ReportFn,
              stop: StopFlag) -> bool:
        """Follow the shards and the queue until every wanted subject is reported (True), or the stop."""
        followers = {c.batch: ShardFollower(c.batch) for c in chunks}
        by_chunk = {(c.batch, c.index): c for c in chunks}
        deaths: dict[str, int] = {}
        squeue_failures = 0
        while wanted:
            self._read(followers, by_chunk, wanted, report, op)
            if not wanted:
                break
            if stop.is_set():
                if stop.reason != DETACHED:
                    self._stopped(stop, chunks, followers, by_chunk, wanted, report, op)
                return False
            if self.detach:
                self._detached(stop, chunks, len(wanted))
                return False
            try:
                self._live = commands.live_tasks(sorted({c.task_id[0] for c in chunks
                                                         if c.task_id is not None and not c.resolved}))
                squeue_failures = 0
            except SlurmError as exc:
                squeue_failures += 1
                log.debug("stage %s: squeue failed (%d in a row): %s", op.stage, squeue_failures, exc)
                if squeue_failures >= SQUEUE_FAILURES_TOLERATED:
                    raise
                self._pause(stop)
                continue
            ended = [c for c in chunks if not c.resolved and c.task_id is not None and c.task_id not in self._live]
            if ended:
                self._read(followers, by_chunk, wanted, report, op)  # what they wrote before they ended
                lost: list[SubjectTask] = []
                alone: list[SubjectTask] = []
                for chunk in ended:
                    again, suspects = self._settle(chunk, wanted, deaths, report)
                    lost += again
                    alone += suspects
                fresh: list[ChunkState] = []
                if lost and not stop.is_set():
                    fresh += self._submit(op, lost)
                if alone and not stop.is_set():
                    fresh += self._submit(op, alone, size=1)
                if fresh:
                    chunks += fresh
                    for c in fresh:
                        by_chunk[(c.batch, c.index)] = c
                        followers.setdefault(c.batch, ShardFollower(c.batch))
                continue
            self._pause(stop)
        for chunk in chunks:
            self._consumed.setdefault(chunk.batch, True)
        return True

    def _pause(self, stop: StopFlag) -> None:
        """Wait one poll interval, waking at once on a stop."""
        try:
            select.select([stop.fileno()], [], [], self.settings.poll_sec)
        except (OSError, ValueError):
            time.sleep(self.settings.poll_sec)

    def _read(self, followers: dict[Path, ShardFollower], by_chunk: dict[tuple[Path, int], ChunkState],
              wanted: dict[str, SubjectTask], report: ReportFn, op: OperatorRef) -> None:
        """New shard lines: outcomes reported (once per subject), sessions' starts and ends noted."""
        outcomes: list[SubjectOutcome] = []
        for batch, follower in followers.items():
            for record in follower.poll():
                chunk = by_chunk.get((batch, record.chunk))
                self._note(record, chunk, wanted, outcomes, op)
        if outcomes:
            report(outcomes)

    def _note(self, record: ShardRecord, chunk: ChunkState | None, wanted: dict[str, SubjectTask],
              outcomes: list[SubjectOutcome], op: OperatorRef) -> None:
        session = None
        if chunk is not None:
            session = chunk.sessions.setdefault(record.incarnation, Incarnation())
        if record.kind == "outcome" and record.key is not None:
            if session is not None:
                session.finished.add(record.key)
            self._running.pop(record.key, None)
            task = wanted.pop(record.key, None)
            if task is not None:
                outcomes.append(outcome_from_wire(outcome_wire_of(record), task))
        elif record.kind == "start" and record.key is not None:
            pid, started = record.data
            if session is not None:
                session.started[record.key] = (pid, started)
            task = wanted.get(record.key)
            if task is not None:
                self._running[record.key] = RunningSubject(task, int(pid), float(started))
        elif record.kind == "end":
            reason = str(record.data[0])
            if session is not None:
                session.end = reason
                for key in session.started:
                    if key not in session.finished:
                        self._running.pop(key, None)
            if reason.startswith("error:"):  # the session could not run the stage at all
                raise session_error(op, reason[len("error:"):].strip())

    def _settle(self, chunk: ChunkState, wanted: dict[str, SubjectTask], deaths: dict[str, int],
                report: ReportFn) -> tuple[list[SubjectTask], list[SubjectTask]]:
        """A chunk whose task ended: its unreported subjects to submit again, in chunks as usual and
        alone (suspects), or charged after two deaths.

        A session that died without a word (SIGKILL, node failure, a subject that killed it) counts a
        death for the subjects its start records show in flight. When they show none (the subject
        killed it faster than starts are noted, every 0.05 s), every unfinished subject of the chunk is a
        suspect (a worker holds the replies of subjects under 5 ms back, so the first unfinished one
        need not be the one that ran). A subject with a death or under suspicion is submitted alone,
        where a session dying without a word can only be its subject's doing: a subject that kills its
        task is charged at its second recorded death (its third task if it killed the first at once)."""
        chunk.resolved = True
        left = [k for k in chunk.keys if k in wanted]
        if not left:
            return [], []
        if not chunk.sessions:  # its session never began: the job could not start habitrun there
            for key in left:
                self._unstarted[key] = self._unstarted.get(key, 0) + 1
            if any(self._unstarted[key] >= 2 for key in left):
                raise SlurmError(never_started(chunk))
        suspects: set[str] = set()
        for session in chunk.sessions.values():
            if session.end is not None:  # it ended cleanly (done, warned, stopped, terminated): nobody's fault
                continue
            in_flight = [k for k in session.started if k not in session.finished and k in wanted]
            if not in_flight and len(chunk.keys) == 1:
                in_flight = left  # alone in its chunk: it was the one running
            if in_flight:
                for key in in_flight:
                    deaths[key] = deaths.get(key, 0) + 1
            else:  # any unfinished one may have been running (or finished, its reply held back): suspects
                suspects.update(left)
        charged: list[SubjectOutcome] = []
        again: list[SubjectTask] = []
        alone: list[SubjectTask] = []
        job = f"{chunk.task_id[0]}_{chunk.task_id[1]}" if chunk.task_id is not None else "?"
        for key in left:
            task = wanted[key]
            self._running.pop(key, None)
            if deaths.get(key, 0) >= 2:
                wanted.pop(key)
                charged.append(SubjectOutcome(
                    task=task, ok=False, kind=FailureKind.WORKER_DIED,
                    error=f"WorkerDied: the SLURM array task running it died without a word twice "
                          f"(the last: {job}; its output: {chunk.batch / 'out'})"))
            elif key in suspects or deaths.get(key, 0):
                alone.append(task)
            else:
                again.append(task)
        log.debug("batch %s chunk %d ended: %d subject(s) submitted again, %d alone, %d charged", chunk.batch.name,
                  chunk.index, len(again), len(alone), len(charged))
        if charged:
            report(charged)
        return again, alone

    def _stopped(self, stop: StopFlag, chunks: list[ChunkState], followers: dict[Path, ShardFollower],
                 by_chunk: dict[tuple[Path, int], ChunkState], wanted: dict[str, SubjectTask], report: ReportFn,
                 op: OperatorRef) -> None:
        """Ctrl-C (or fail-fast) of an attached run: as on the process backend, a first stop lets the
        running subjects finish within graceful_shutdown_sec (the sessions get SIGINT: they take no more
        subjects and end; what they finish is reported), a hard one cancels at once; then nothing of
        this runner's is left in the queue."""
        ids = sorted({c.task_id[0] for c in chunks if c.task_id is not None and not c.resolved})
        if not ids:
            return
        if not stop.hard:
            try:
                live = commands.live_tasks(ids)
                pending = [f"{job}_{index}" for (job, index), state in live.items() if state == "PENDING"]
                running = [f"{job}_{index}" for (job, index), state in live.items() if state != "PENDING"]
                commands.cancel(pending)  # they ran nothing: gone at once
                commands.cancel(running, signal="INT", batch=True)  # their sessions end after their subjects
            except SlurmError as exc:
                log.debug("stopping the arrays %s: %s", " ".join(ids), exc)
            deadline = time.monotonic() + self.policy.graceful_shutdown_sec + 5.0
            while wanted and not stop.hard and time.monotonic() < deadline:
                self._read(followers, by_chunk, wanted, report, op)
                try:
                    if not commands.live_tasks(ids):
                        self._read(followers, by_chunk, wanted, report, op)
                        break
                except SlurmError:
                    break
                time.sleep(min(self.settings.poll_sec, 0.2))
        try:
            if commands.live_tasks(ids):
                commands.cancel(ids)
        except SlurmError as exc:
            log.debug("scancel %s failed: %s", " ".join(ids), exc)

    def _detached(self, stop: StopFlag, chunks: list[ChunkState], left: int) -> None:
        """A detached run: leave the arrays running and end the run (resume comes back for them)."""
        self.left_subjects = left
        self.left_running = sorted({c.task_id[0] for c in chunks if c.task_id is not None and not c.resolved})
        if not stop.is_set():
            stop.set(DETACHED)

    # ------------------------------------------------------------------ earlier batches
    def _adopt(self, stage: str, wanted: dict[str, SubjectTask], report: ReportFn,
               looked: list[Path]) -> list[ChunkState]:
        """Outcomes earlier batches of this stage hold for wanted subjects, and their array tasks still alive."""
        found: list[ChunkState] = []
        for folder in open_batches(self.root, stage):
            arrays = read_arrays(folder)
            if arrays is None:
                continue
            chunks = [ChunkState(folder, i, task_of(arrays, i), batches.chunk_keys(folder, i))
                      for i in range(int(arrays["chunks"]))]
            if not any(k in wanted for c in chunks for k in c.keys):
                continue
            looked.append(folder)
            by_chunk = {(folder, c.index): c for c in chunks}
            outcomes: list[SubjectOutcome] = []
            op = OperatorRef(stage=stage, path="")
            for record in ShardFollower(folder).poll():
                try:
                    self._note(record, by_chunk.get((folder, record.chunk)), wanted, outcomes, op)
                except OperatorBindError:  # an earlier run's: that run ended on it; its subjects run again
                    continue
            if outcomes:
                log.debug("stage %s: %d outcome(s) merged from batch %s", stage, len(outcomes), folder.name)
                report(outcomes)
            ids = sorted({c.task_id[0] for c in chunks if c.task_id is not None})
            live = commands.live_tasks(ids) if ids else {}
            for chunk in chunks:
                chunk.resolved = chunk.task_id not in live or not any(k in wanted for k in chunk.keys)
            alive = [c for c in chunks if not c.resolved]
            if alive:
                log.debug("stage %s: waiting for %d live task(s) of batch %s", stage, len(alive), folder.name)
                found += alive
        return found

    def _close_consumed(self) -> None:
        """Batches whose every outcome an earlier call reported (and the recorder has since committed)."""
        for folder, consumed in list(self._consumed.items()):
            if consumed:
                close_batch(folder)
            del self._consumed[folder]

    # ------------------------------------------------------------------ submitting
    def _submit(self, op: OperatorRef, tasks: list[SubjectTask], size: int | None = None) -> list[ChunkState]:
        """Chunk the tasks, write a batch folder, submit it as array(s); its chunks."""
        settings = self.settings
        if size is None:
            size = chunk_size(len(tasks), self.policy.workers, self.typical_sec, settings)
        parts_of = split(tasks, size)
        folder = new_batch_folder(self.root, op.stage)
        session_policy = self.policy.model_dump(mode="json")
        batches.write_batch(folder, stage=op.stage, op=op, policy=session_policy, scratch_dir=self.scratch_dir,
                            chunks=parts_of, requeue=settings.requeue)
        script = batches.write_job_script(folder, python=settings.python or sys.executable, setup=settings.setup)
        limit = settings.max_array_size or commands.max_array_size()
        arrays: dict[str, Any] = {"stage": op.stage, "chunks": len(parts_of), "parts": [], "created": time.time(),
                                  "submitter": os.getpid(), "run": self.run_id,
                                  "subjects": len(tasks), "chunk_size": size}
        write_arrays(folder, arrays)
        chunks = [ChunkState(folder, i, None, [t.key for t in part]) for i, part in enumerate(parts_of)]
        for offset, count in array_parts(len(parts_of), limit):
            argv = commands.sbatch_argv(settings, workers=self.policy.workers,
                                        worker_threads=self.policy.worker_threads,
                                        job_name=f"hr-{op.stage}"[:64], array=f"0-{count - 1}",
                                        output=str(folder / "out" / "slurm-%A_%a.out"), script=script,
                                        script_args=[str(offset)])
            job = commands.submit(argv)
            arrays["parts"].append({"job": job, "offset": offset, "count": count})
            write_arrays(folder, arrays)
            self.submitted.append(job)
            self.jobs += count
            for i in range(count):
                chunks[offset + i].task_id = (job, i)
            log.debug("stage %s: array %s submitted (%d task(s), chunks %d-%d of %d subjects each)", op.stage, job,
                      count, offset, offset + count - 1, size)
        self.batches.append(folder)
        return chunks

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_consumed()  # the recorder has committed what was reported (it closes first)
        if not self.detach:
            live = list(self.submitted)
            if live:
                try:
                    still = commands.live_tasks(live)
                    if still:
                        commands.cancel(sorted({job for job, _ in still}))
                except SlurmError as exc:
                    log.debug("closing: %s", exc)


def session_error(op: OperatorRef, said: str) -> OperatorBindError | WorkerStartError:
    """The run-level error a session ended on (``<class>: <message>``): an operator that cannot be built is
    the same OperatorBindError as on the process backend; anything else, a WorkerStartError."""
    name, _, message = said.partition(": ")
    if name == "OperatorBindError":
        return OperatorBindError(message)
    if name == "WorkerStartError":
        return WorkerStartError(message)
    return WorkerStartError(f"stage {op.stage!r}: its SLURM session could not run: {said}")


def never_started(chunk: ChunkState) -> str:
    """Why a chunk's array task ran nothing, twice: its output file's last lines (python missing, a setup
    line failing, habitrun not installed on the nodes...)."""
    job, index = chunk.task_id if chunk.task_id is not None else ("?", 0)
    out = chunk.batch / "out" / f"slurm-{job}_{index}.out"
    try:
        tail = [line for line in out.read_text(errors="replace").splitlines() if line.strip()][-5:]
    except OSError:
        tail = []
    said = ("; it printed: " + " | ".join(tail)) if tail else f"; it left no output ({out})"
    return (f"array task {job}_{index} ended twice before its habitrun session began (check slurm.python "
            f"and slurm.setup: the nodes must run habitrun from the same study folder){said}")


# ---------------------------------------------------------------------- batch folders on disk
def new_batch_folder(root: Path, stage: str) -> Path:
    """A fresh, uniquely named batch folder for ``stage`` (created)."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1000):
        folder = root / f"{stamp}-{stage}-{os.getpid()}-{n}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise SlurmError(f"cannot make a new batch folder in {root}")


def write_arrays(folder: Path, arrays: dict[str, Any]) -> None:
    """The batch's arrays file, replaced atomically (status and later runs read it)."""
    tmp = folder / f".{ARRAYS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(arrays, indent=1), encoding="utf-8")
    os.replace(tmp, folder / ARRAYS_FILE)


def read_arrays(folder: Path) -> dict[str, Any] | None:
    """A batch's arrays file (None: unreadable, e.g. a runner killed while submitting)."""
    try:
        data = json.loads((folder / ARRAYS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "chunks" in data and "parts" in data else None


def task_of(arrays: dict[str, Any], index: int) -> tuple[str, int] | None:
    """The array task that runs chunk ``index`` (None: its part was never submitted)."""
    for part in arrays.get("parts", []):
        offset, count = int(part["offset"]), int(part["count"])
        if offset <= index < offset + count:
            return str(part["job"]), index - offset
    return None


def open_batches(root: Path, stage: str | None = None) -> list[Path]:
    """Batch folders not yet merged for good, oldest first (of one stage, if given)."""
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if (folder / CLOSED_FILE).exists():
            continue
        arrays = read_arrays(folder)
        if arrays is None or (stage is not None and arrays.get("stage") != stage):
            continue
        out.append(folder)
    return out


def close_batch(folder: Path) -> None:
    """Mark a batch merged for good: later runs do not look into it again."""
    try:
        (folder / CLOSED_FILE).write_text(f"{time.time()}\n", encoding="utf-8")
    except OSError as exc:
        log.debug("cannot close batch %s: %s", folder, exc)
