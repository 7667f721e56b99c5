"""The process backend's workers: their slots, the one selector watching them, starting and burying them.

The pool lives as long as the backend, so consecutive stages reuse its
workers. Every live worker's pipe and process sentinel are registered with
the selector once, at its start, and unregistered when it is buried; a
stage's dispatch loop (``stage``) waits on it through :meth:`WorkerPool.wait`.
"""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from habitrun.engine.contract import OperatorRef, RunningSubject
from habitrun.engine.process import protocol as P
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.deathlog import write_death_log
from habitrun.engine.process.gpu import detect_gpus, device_for_slot
from habitrun.engine.process.handle import WorkerHandle, signal_group
from habitrun.engine.process.memory import MemoryWatchdog
from habitrun.engine.process.modes import WorkerMode
from habitrun.engine.process.phases import WorkerPhase
from habitrun.engine.process.spares import Spares
from habitrun.engine.process.spawner import WorkerSpawner
from habitrun.engine.process.worker import WorkerConfig
from habitrun.launcher.signalling import require_pidfd
from habitrun.spec.policy import RunPolicy


class WorkerPool:
    """Slots, selector and lifecycle of every worker process of one backend."""

    def __init__(self, policy: RunPolicy, mode: WorkerMode) -> None:
        require_pidfd()  # workers are signalled only through pidfds: without them, stop before any starts
        self.policy = policy
        self.mode = mode
        self.devices = detect_gpus() if policy.cap_workers_to_gpu_pool else []
        self.effective = min(policy.workers, len(self.devices)) if self.devices else policy.workers
        self.spawner = WorkerSpawner(policy.start_method, policy.worker_threads)
        self.log_max_bytes = int(policy.log_max_mb * (1 << 20))
        self.workers: list[WorkerHandle] = []  # every worker not buried yet
        self.started_pids: list[int] = []  # every worker pid ever started (tests, provenance)
        self.oom_events = 0
        self._watchdog = MemoryWatchdog(policy.worker_memory_limit_mb, self._watchdog_kill)
        self._sel = selectors.DefaultSelector()  # every live worker's pipe and sentinel, plus wake-up fds
        self._scratch_ids = itertools.count()
        self.spares = Spares(self.workers, policy.subject_spawn_timeout_sec)  # isolated mode's, see spares

    # ------------------------------------------------------------- views
    def live(self) -> list[WorkerHandle]:
        return [w for w in self.workers if not w.dead]

    def active(self) -> list[WorkerHandle]:
        """Live workers not on their way out nor waiting spares: the ones that count against the slots."""
        return [w for w in self.workers if not w.leaving and not w.spare]

    def running(self) -> int:
        """Workers with a subject in hand (pipelined ones wait behind it and are not counted)."""
        return sum(1 for w in list(self.workers) if not w.dead and w.outstanding)

    def running_subjects(self) -> list[RunningSubject]:
        """Each subject a worker runs now: its task, the worker's pid, its start and output so far.

        Read from another thread (the running file's), without a lock: a worker's deque may move
        while it is read, so a reading that races it is dropped or, rarely, off by one subject.
        """
        out: list[RunningSubject] = []
        to_wall = time.time() - time.monotonic()
        for w in list(self.workers):
            if w.dead or not w.outstanding:
                continue
            try:
                _, running, started_at = w.progress()
                if running is not None:
                    out.append(RunningSubject(w.outstanding[running], w.pid, started_at + to_wall, w.scratch_path))
            except (IndexError, RuntimeError):  # the runner moved on while we read
                continue
        return out

    # ------------------------------------------------------------ starting
    def spawn(self, op: OperatorRef, module: str, now: float, scratch_dir: str | None) -> WorkerHandle:
        """A worker for a free slot: a waiting spare of one if there is, else one started in the lowest;
        raises whatever keeps it from starting."""
        used = {w.slot for w in self.active()}
        slot = next(i for i in range(len(used) + 1) if i not in used)
        if self.mode.keeps_spares:
            device = device_for_slot(self.devices, slot)
            spare = self.spares.take(slot, op, now, lambda other: device_for_slot(self.devices, other) == device)
            if spare is not None:
                return spare
        return self.start(op, module, now, scratch_dir, slot)

    def keep_spares(self, op: OperatorRef, module: str, waiting: int,
                    bind: Callable[[WorkerHandle, float], None], now: float, scratch_dir: str | None) -> None:
        """Isolated mode: a spare per busy slot while ``waiting`` subjects wait for a slot (see spares)."""
        if not self.mode.keeps_spares:
            return
        # Busy: running a subject with the operator bound (a slot whose worker still imports it gets
        # no spare importing it alongside; nor does one whose import hangs or fails)
        busy = [w.slot for w in self.active() if w.outstanding and not w.binding]

        def start(slot: int) -> WorkerHandle:
            w = self.start(op, module, now, scratch_dir, slot)
            w.spare = True
            return w

        # never more spares than slots: after an OOM backoff, fewer
        self.spares.keep(busy, min(waiting, self.effective), op, start, lambda w: bind(w, now), now)

    def start(self, op: OperatorRef, module: str, now: float, scratch_dir: str | None, slot: int) -> WorkerHandle:
        """Start one worker process for ``slot``; raises whatever keeps it from starting."""
        settings = self.mode.settings()
        config = WorkerConfig(
            slot=slot,
            threads=self.policy.worker_threads,
            cuda_device=device_for_slot(self.devices, slot),
            max_tasks=settings.max_tasks,
            max_consecutive_failures=settings.max_consecutive_failures,
            reply_hold_sec=settings.reply_hold_sec,
            scratch_path=os.path.join(scratch_dir or tempfile.gettempdir(),
                                      f"habitrun-worker-{os.getpid()}-{next(self._scratch_ids)}.out"),
            log_max_bytes=self.log_max_bytes,
        )
        close_fds = [w.fd for w in self.workers if w.reading]
        beacon = Beacon()
        proc, conn = self.spawner.start(config, module, op.search_path, close_fds, beacon)
        worker = WorkerHandle(slot, proc, conn, self._watchdog.watch(proc.pid), now, beacon)
        worker.scratch_path = config.scratch_path
        self.workers.append(worker)
        self._sel.register(worker.fd, selectors.EVENT_READ, (worker, True))
        self._sel.register(proc.sentinel, selectors.EVENT_READ, (worker, False))
        self.started_pids.append(worker.pid)
        return worker

    def prove(self, op: OperatorRef, module: str) -> None:
        """A worker bound ``op``: later workers may get its module preloaded."""
        self.spawner.prove(module, op.search_path)

    def note_oom(self, backoff: bool = True) -> None:
        """A subject ran out of memory: one event more, and fewer slots when the policy backs off
        (not under a memory budget: its admission runs such a subject alone instead)."""
        self.oom_events += 1
        if backoff and self.policy.oom_backoff:
            self.effective = max(1, self.effective - self.policy.oom_reduce_workers_by)

    # ------------------------------------------------------------- waiting
    def watch(self, fd: int) -> None:
        """Wake :meth:`wait` when ``fd`` is readable (what it holds is read and dropped)."""
        self._sel.register(fd, selectors.EVENT_READ, None)

    def unwatch(self, fd: int) -> None:
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    def wait(self, timeout: float | None) -> list[tuple[WorkerHandle, bool]]:
        """Block until a worker's pipe or sentinel is ready, a watched fd wakes us, or ``timeout``.

        Returns ``(worker, is_pipe)`` for each ready worker fd (False: its sentinel, it ended).
        """
        ready: list[tuple[WorkerHandle, bool]] = []
        for key, _ in self._sel.select(timeout):
            if key.data is None:
                try:
                    os.read(key.fd, 4096)
                except OSError:
                    pass
                continue
            ready.append(key.data)
        return ready

    def stop_reading(self, worker: WorkerHandle) -> None:
        """No more replies will come: stop watching the pipe (an ended pipe is always 'ready')."""
        if worker.reading:
            worker.reading = False
            self.unwatch(worker.fd)

    # ------------------------------------------------------------- ending
    def bury(self, worker: WorkerHandle) -> None:
        """The worker is gone: kill what it left in its group, release everything of it."""
        worker.move(WorkerPhase.DEAD)
        signal_group(worker, signal.SIGKILL)  # through its pidfd: never a recycled PID's group
        worker.close_pidfd()
        self._watchdog.forget(worker.pid)
        self.stop_reading(worker)
        self.unwatch(worker.proc.sentinel)
        try:
            worker.conn.close()
        except OSError:
            pass
        worker.proc.join(timeout=1.0)
        write_death_log(worker, self.log_max_bytes)
        worker.proc.close()
        if worker.scratch_path:
            try:
                os.unlink(worker.scratch_path)
            except OSError:
                pass
        self.workers.remove(worker)

    def reap_finished(self) -> None:
        """Forget workers that ended between stages (nothing was owed by them)."""
        for w in list(self.workers):
            if w.proc.exitcode is not None and not w.outstanding:
                self.bury(w)

    def _watchdog_kill(self, pid: int) -> None:
        for w in list(self.workers):  # the watchdog's thread: a snapshot of the list
            if w.pid == pid and not w.dead:
                signal_group(w, signal.SIGKILL)

    def close(self, graceful: bool) -> None:
        """End every worker (idle ones asked to exit, busy ones stopped), then release the pool."""
        now = time.monotonic()
        for w in self.live():
            if graceful and not w.outstanding and w.can_send:
                w.retire()
                if not w.send((P.EXIT,)):
                    w.kill()
            elif graceful:
                w.terminate(now, self.policy.graceful_shutdown_sec)
            else:
                w.kill()
        self._wait_all_ended(now + (self.policy.graceful_shutdown_sec if graceful else 0.0) + 0.5)
        for w in self.live():
            self.bury(w)
        self._sel.close()
        self._watchdog.close()
        self.spawner.close()

    def _wait_all_ended(self, deadline: float) -> None:
        """Wait for every live worker's exit until ``deadline``, then SIGKILL the rest and wait 5 s more."""
        killed_all = False
        while True:
            pending = [w for w in self.live() if w.proc.exitcode is None]
            if not pending:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                if killed_all:
                    return
                for w in pending:
                    w.kill()
                killed_all = True
                deadline = time.monotonic() + 5.0
                continue
            wait([w.proc.sentinel for w in pending], timeout=left)
