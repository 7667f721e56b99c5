"""One ``run_tasks`` call on Dask: submit micro-batches, turn what comes back into per-subject outcomes.

Everything the loop waits for arrives on one queue: a batch future finished,
a worker's marker (batch started / subject running / subject done), the stop
flag, a nanny's out-of-memory kill. So the loop sleeps until something
happens and never polls.

A batch whose worker died is resolved from its markers, which the worker
has the scheduler confirm before going on (see ``worker``), so they are
exact, not best effort: the subject that was announced running and not done
is the one that died with the worker (``oom`` if the nanny killed it for
memory, else ``worker_died``), and so is the only subject of a batch
announced as started that never ended. A batch whose result had already
arrived loses nothing (and its future is dropped on arrival, so Dask does not
rerun it when its worker dies before the scheduler hears it finished). Every other subject of a lost worker was queued or
finished unannounced, so it is resent, never charged: a worker lost for a
reason outside the subject (killed from outside, dropped by the scheduler)
costs nobody a failure. When the markers cannot say which of a batch's fast,
unannounced subjects was running, its unfinished subjects are resent one per
task as *suspects*, announced before they start, so a second death names its
subject. A subject's failure is always an outcome, never a retry here,
with one exception: a worker that died together with its nanny was ended
from outside (its batch job cancelled, pre-empted or out of wall time), so
the subject it ran is resent, up to ``MAX_HOST_LOSSES`` times.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import select
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from habitrun.engine.contract import FailureKind, OperatorRef, ReportFn, SubjectOutcome, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.dask_backend.cluster import ClusterHandle, DaskClusterError
from habitrun.engine.dask_backend.crashfile import remove_crash_files, take_crash
from habitrun.engine.dask_backend.state import SharedState
from habitrun.engine.dask_backend.worker import BatchContext, WireOutcome, run_batch, stop_token
from habitrun.engine.invoke import write_log
from habitrun.engine.wire import OutcomeWire, outcome_from_wire, wire_duration
from habitrun.errors import OperatorBindError
from habitrun.spec.policy import RunPolicy

log = logging.getLogger(__name__)

MAX_HOST_LOSSES = 2  # a subject is resent this often when its worker's whole job ends under it
OOM_TOPIC = "worker-restart-memory"  # logged by a nanny just before it kills its worker for memory


@dataclass
class _Batch:
    id: int
    indices: list[int]
    suspect: bool
    future: Any
    worker: str | None = None  # from the "started" marker
    nanny: str | None = None  # the worker's nanny, from the "started" marker
    pid: int | None = None  # the worker process's pid, from the "started" marker
    running: int | None = None  # position announced running and not yet done
    streamed: dict[int, OutcomeWire] = field(default_factory=dict)  # outcomes that came with markers, by index
    result: dict[str, Any] | None = None  # the batch's "E" event


class StageDispatch:
    """Runs one set of tasks to completion (or until stopped) on the cluster."""

    _ids = itertools.count()

    def __init__(self, handle: ClusterHandle, shared: SharedState, policy: RunPolicy, op: OperatorRef,
                 tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        self.handle = handle
        self.client = handle.client
        self.shared = shared
        self.policy = policy
        self.op = op
        self.tasks = list(tasks)
        self.report = report
        self.stop = stop
        self.token = uuid.uuid4().hex
        self.topic = f"habitrun-{self.token}"
        self.q: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.pending: deque[int] = deque(range(len(self.tasks)))
        self.suspects: deque[int] = deque()
        self.inflight: dict[int, _Batch] = {}
        self.reported: set[int] = set()
        self.stopping_deadline: float | None = None
        isolated = policy.parallel_mode == "isolated"
        self.recycle_after = 1 if isolated else policy.persistent_worker_recycle_after_tasks
        self.fixed_size = 1 if isolated else None
        settings = handle.settings
        self.sizer = shared.sizer_for(op, settings.batch_target_sec)

    # ----------------------------------------------------------------- loop
    def run(self) -> None:
        if not self.tasks or self.stop.is_set():
            return
        self.client.subscribe_topic(self.topic, lambda event: self.q.put(("mark", event[1])))
        self.shared.listeners.append(self.q)
        wake_r, wake_w = os.pipe()
        watcher = threading.Thread(target=self._watch_stop, args=(wake_r,), daemon=True,
                                   name="habitrun-dask-stop")
        watcher.start()
        try:
            self._loop()
        finally:
            os.write(wake_w, b"x")
            watcher.join(timeout=5)
            os.close(wake_r)
            os.close(wake_w)
            self.shared.listeners.remove(self.q)
            remove_crash_files(t.log_path for t in self.tasks)
            try:
                self.client.unsubscribe_topic(self.topic)
            except Exception:  # noqa: BLE001 - a lost client has nothing to unsubscribe
                pass
            leftovers = [b.future for b in self.inflight.values()]
            if leftovers:
                try:
                    self.client.cancel(leftovers)
                except Exception:  # noqa: BLE001
                    pass

    def _watch_stop(self, wake_r: int) -> None:
        ready, _, _ = select.select([self.stop.fileno(), wake_r], [], [])
        if self.stop.fileno() in ready:
            self.q.put(("stop",))

    def _loop(self) -> None:
        while True:
            if self.stop.is_set() and self.stopping_deadline is None:
                self._begin_stop()
            if self.stopping_deadline is None:
                self._refill()
            if not self.inflight and (self.stopping_deadline is not None or not (self.pending or self.suspects)):
                return
            timeout = None
            if self.stopping_deadline is not None:
                if self.stop.hard:
                    self.stopping_deadline = min(self.stopping_deadline, time.monotonic())
                timeout = self.stopping_deadline - time.monotonic()
                if timeout <= 0:
                    self._abandon_running()
                    return
            try:
                msg = self.q.get(timeout=timeout)
            except queue.Empty:
                continue
            self._handle(msg)

    def _handle(self, msg: tuple[Any, ...]) -> None:
        what = msg[0]
        if what == "done":
            batch = self.inflight.pop(msg[1], None)
            if batch is not None:
                self._finished(batch)
        elif what == "mark":
            self._marker(msg[1])
        # "stop" and "oom" only wake the loop; their state is read where it is needed

    # ------------------------------------------------------------- submitting
    def _slots(self) -> int:
        return self.shared.slots(self.handle)

    def _refill(self) -> None:
        slots = self._slots()
        limit = slots if self.shared.backed_off else 2 * slots
        while len(self.inflight) < limit and (self.suspects or self.pending):
            if self.suspects:
                self._submit([self.suspects.popleft()], suspect=True)
                continue
            size = self.fixed_size or self.sizer.next_size(len(self.pending), slots)
            self._submit([self.pending.popleft() for _ in range(min(size, len(self.pending)))], suspect=False)

    def _submit(self, indices: list[int], *, suspect: bool) -> None:
        batch_id = next(self._ids)
        ctx = BatchContext(
            token=self.token, topic=self.topic, batch_id=batch_id,
            timeout_sec=self.policy.subject_timeout_sec, recycle_after=self.recycle_after,
            max_consecutive_failures=self.policy.persistent_worker_max_consecutive_failures,
            suspect=suspect,
        )
        tasks = [self.tasks[i] for i in indices]
        future = self.client.submit(run_batch, self.op, tasks, ctx, pure=False,
                                    key=f"habitrun-{self.op.stage}-{self.token[:8]}-{batch_id}")
        batch = _Batch(batch_id, indices, suspect, future)
        log.debug("stage %s: dispatch batch %d of %d subject(s)%s: %s", self.op.stage, batch_id, len(tasks),
                  " (suspect: each announced)" if suspect else "", ", ".join(t.subject_id for t in tasks[:20]))
        self.inflight[batch_id] = batch
        future.add_done_callback(lambda _f, b=batch_id: self.q.put(("done", b)))

    # -------------------------------------------------------------- receiving
    def _marker(self, msg: dict[str, Any]) -> None:
        batch = self.inflight.get(msg.get("b", -1))
        if batch is None:
            if msg.get("m") == "E" and self.stopping_deadline is None:
                self._stray_end(msg)
            return
        batch.worker = msg.get("w") or batch.worker
        kind = msg.get("m")
        if kind == "B":
            batch.nanny = msg.get("n")
            batch.pid = msg.get("p")
        if kind == "R":
            if "o" in msg:  # the batch's earlier, fast subjects: finished, now safe from a later death
                wires = pickle.loads(msg["o"])
                batch.streamed.update(wires)
                self._emit(batch, wires)
            if msg["i"] not in batch.streamed:
                batch.running = msg["i"]
        elif kind == "E":
            batch.result = pickle.loads(msg["r"])
            # The batch has ended: drop the future now, so that if its worker dies before the
            # scheduler hears of the end, Dask has no reason to rerun the batch elsewhere.
            batch.future.release()
        elif kind == "D":
            if batch.running == msg["i"]:
                batch.running = None
            at, wire = pickle.loads(msg["o"])
            batch.streamed[at] = wire
            self._emit(batch, [(at, wire)])

    def _stray_end(self, msg: dict[str, Any]) -> None:
        """The end of a batch that is over for us, run again by Dask: it may have paused its worker.

        Dask can rerun a batch whose end we already have (its future released at "E") when
        the worker it ran on is restarted before the scheduler heard of the release. Its
        outcomes are duplicates and are dropped; but if its subjects asked for a restart (a
        failure), its worker paused itself and takes nothing more until restarted, and a
        batch queued there would wait for ever (tests/engine/test_crash_safety.py, dask).
        """
        try:
            result = pickle.loads(msg["r"])
        except Exception:  # noqa: BLE001 - a marker we cannot read changes nothing
            return
        if result.get("restart") and result.get("worker"):
            self.shared.restart(self.handle, result["worker"])

    def _finished(self, batch: _Batch) -> None:
        fut = batch.future
        if batch.result is not None:
            # Its result arrived (confirmed before the task ended): that is the batch's end, whatever
            # the future says now (released above, or erred/lost because its worker died since).
            self._batch_result(batch, batch.result, worker_alive=fut.status not in ("error", "lost"))
            return
        status = fut.status
        try:
            if status == "finished":
                fut.release()  # nothing to fetch: the outcomes came as an event (see worker.run_batch)
                if self.stopping_deadline is None:  # cannot happen on an ordered stream; never lose work
                    self.pending.extendleft(reversed([i for i in batch.indices if i not in self.reported]))
                return
            if status == "error":
                exc = fut.exception()
                fut.release()
                self._batch_error(batch, exc)
                return
            if status == "lost" and self.stopping_deadline is None:
                # it finished, but its result never reached us before its worker died: nobody to
                # charge, nothing proven run; resend (only if the worker could not confirm its markers)
                fut.release()
                self.pending.extendleft(reversed([i for i in batch.indices if i not in self.reported]))
                return
        except Exception as exc:  # noqa: BLE001 - the client lost the scheduler mid-call
            self._batch_error(batch, exc)
            return
        if self.stopping_deadline is not None:
            return  # cancelled by our own stop
        raise DaskClusterError(
            f"lost the Dask scheduler at {self.handle.address} (batch {status}); finished subjects are "
            "stored, run `habitrun resume` once the cluster is back"
        )

    def _batch_result(self, batch: _Batch, res: dict[str, Any], *, worker_alive: bool = True) -> None:
        batch.worker = res["worker"]
        self._emit(batch, res["done"])
        self.sizer.observe([d for d in (wire_duration(w) for _, w in res["done"]) if d > 0])
        if self.stopping_deadline is None:
            self.pending.extendleft(reversed([batch.indices[p] for p in res["not_run"]]))
        if res["restart"] and worker_alive:
            self.shared.restart(self.handle, res["worker"], forgotten=batch.future.key)
        if res.get("bind_error") is not None and self.stopping_deadline is None:
            # the stage's error, not its subjects' (see OperatorBindError): one line, the run stops
            raise OperatorBindError.for_stage(self.op.stage, self.op.path, res["bind_error"])

    def _batch_error(self, batch: _Batch, exc: BaseException | None) -> None:
        from distributed.scheduler import KilledWorker

        if isinstance(exc, KilledWorker):
            last = exc.last_worker
            self._worker_died(batch, str(getattr(last, "address", last)))
            return
        # The batch itself could not run (e.g. habitrun not importable on the worker): every
        # subject in it fails with that reason, so the run ends instead of looping.
        text = f"{type(exc).__name__}: {exc}".splitlines()[0] if exc is not None else "unknown error"
        self._deliver([(i, SubjectOutcome(task=self.tasks[i], ok=False, kind=FailureKind.EXCEPTION,
                                          error=f"the Dask worker could not run habitrun's batch: {text}"))
                       for i in batch.indices])

    def _worker_died(self, batch: _Batch, address: str) -> None:
        """Charge the subject the markers prove was running on ``address``; resend the rest."""
        if address in self.shared.restarting or self.stopping_deadline is not None:
            victim = None  # we restarted it on purpose: what was queued there never ran
        elif batch.worker != address:
            victim = None  # the batch never started there: it was queued behind another
        elif batch.running is not None:
            victim = batch.running  # announced running, never done
        elif len(batch.indices) == 1:
            victim = 0  # announced as started and never ended: its only subject was running
        else:
            victim = -1  # one of its fast, unannounced subjects was running: find out which
        if victim is not None and victim >= 0 and self._host_ended(batch, batch.indices[victim]):
            victim = None  # its job was cancelled or pre-empted (or its host lost): not the subject's doing
        if victim is not None and victim >= 0 and batch.indices[victim] not in self.reported:
            self._charge(batch.indices[victim], address, batch.pid)
        if self.stopping_deadline is not None:
            return
        rest = [i for i in batch.indices if i not in self.reported]
        if victim == -1 or (victim is None and batch.suspect):
            self.suspects.extend(rest)  # resent alone and announced before they start
        else:
            self.pending.extendleft(reversed(rest))
        self.shared.refresh_workers(self.handle)

    def _host_ended(self, batch: _Batch, index: int) -> bool:
        """Did the worker die with its nanny (``scancel``, pre-emption, wall time, a lost node)?

        Then the subject it ran is sent again instead of being charged, up to
        ``MAX_HOST_LOSSES`` times (a subject that brings down its whole job
        every time is charged after that).
        """
        if batch.nanny is None or self.handle.kind == "local" or self.stopping_deadline is not None:
            return False
        if not self.handle.nanny_gone(batch.nanny, wait=1.0):
            return False
        key = self.tasks[index].key
        self.shared.host_losses[key] = self.shared.host_losses.get(key, 0) + 1
        return self.shared.host_losses[key] <= MAX_HOST_LOSSES

    def _charge(self, index: int, address: str, pid: int | None) -> None:
        """The subject that was running when ``address`` died: out of memory if its nanny said so."""
        task = self.tasks[index]
        oom = self.shared.oom_kill(address, wait=1.0 if self.policy.worker_memory_limit_mb or
                                   self.handle.kind != "local" else 0.2)
        if oom is not None:
            error = (f"out of memory: the Dask worker's resident memory reached {oom / 2**20:.0f} MB, "
                     "past its limit (worker_memory_limit_mb), and its nanny killed it")
            kind = FailureKind.OOM
        else:
            where = f"{address} (pid {pid})" if pid is not None else address
            error = f"the Dask worker {where} running this subject died (killed or crashed)"
            kind = FailureKind.WORKER_DIED
            crash = take_crash(task.log_path, pid)
            if crash:  # faulthandler's stack of the subject that crashed it, into the subject's log
                write_log(task, crash + f"--- habitrun: {error}\n".encode(), None, pid)
        self._deliver([(index, SubjectOutcome(task=task, ok=False, error=error, kind=kind, worker_pid=pid))])

    def _emit(self, batch: _Batch, wires: list[WireOutcome]) -> None:
        pairs = []
        for at, wire in wires:
            index = batch.indices[at]
            if index not in self.reported:
                pairs.append((index, self._outcome(self.tasks[index], wire)))
        self._deliver(pairs)

    def _outcome(self, task: SubjectTask, wire: OutcomeWire) -> SubjectOutcome:
        outcome = outcome_from_wire(wire, task)  # its result still pickled (see worker._wire)
        payload, outcome.result = outcome.result, None
        if outcome.ok and payload is not None:
            try:
                outcome.result = pickle.loads(payload)
            except Exception as exc:  # noqa: BLE001 - e.g. the result's class only exists on the worker
                outcome.ok, outcome.kind = False, FailureKind.UNPICKLABLE
                outcome.error = f"result cannot be unpickled by the runner: {type(exc).__name__}: {exc}"
        return outcome

    def _deliver(self, pairs: list[tuple[int, SubjectOutcome]]) -> None:
        """Report each subject once, however many ways its outcome arrived."""
        outcomes = []
        for index, outcome in pairs:
            if index not in self.reported:
                self.reported.add(index)
                outcomes.append(outcome)
        if not outcomes:
            return
        if any(o.kind == FailureKind.OOM for o in outcomes):
            self.shared.note_oom(self.policy)
        self.report(outcomes)

    # --------------------------------------------------------------- stopping
    def _begin_stop(self) -> None:
        """Stop submitting; ask every worker to end its batch before the next subject."""
        self.stopping_deadline = time.monotonic() + (0.0 if self.stop.hard else self.policy.graceful_shutdown_sec)
        self.pending.clear()
        self.suspects.clear()
        try:
            self.client.run(stop_token, self.token, on_error="ignore")
        except Exception:  # noqa: BLE001 - unreachable workers are dealt with below
            pass

    def _abandon_running(self) -> None:
        """Past the grace period: restart the workers still running a subject of ours."""
        for batch in self.inflight.values():
            if batch.worker is not None:
                self.shared.restart(self.handle, batch.worker)
