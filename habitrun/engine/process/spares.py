"""Isolated mode's warm spares: the next process of a slot, forked while that slot's worker runs.

An isolated worker runs one subject and exits; without a spare, the next
subject of its slot waits for a fork from the fork server, the child's set-up
and its BIND (most of an isolated subject's cost). So while a slot's worker
runs its subject and subjects still wait in the queue, the slot gets one
spare: a worker forked for that slot (its GPU pinning is the slot's), told
to BIND the stage's operator, then idle, blocked on its pipe. When the slot
frees, the pool hands the spare the next subject instead of forking; when
another slot frees first, the spare serves that one if it is pinned to the
same device (every slot is, without GPUs).

What holds:

- A spare is idle until it gets its subject: isolated mode keeps at most
  ``workers`` processes running subjects plus at most one idle spare per
  busy slot, never more spares than subjects waiting. A slot gets one only
  once its worker has bound the operator, so a spare forks from the fork
  server that has the operator's module imported (once it is up) rather
  than import it beside a running subject.
- A spare has no run, so its death, a failed start or a BIND_ERROR is
  nobody's failure: it is buried (or killed) and the slot forks afresh when
  it frees. Its BIND has no deadline while it waits; the start timeout
  counts from the moment it gets its slot, a subject's timeout from the
  subject's own start (the worker's beacon), as for any worker.
- When no subject waits for it (the stage's tail, a stop, a fail_fast), a
  spare is killed at once; the stage's end waits for it to go.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from habitrun.engine.contract import OperatorRef
from habitrun.engine.process.handle import WorkerHandle
from habitrun.engine.process.phases import WorkerPhase

SPARE_RETRY_SEC = 1.0  # after a spare failed to start, fork no spare sooner than this


class Spares:
    """The pool's waiting spares: which to fork, which to hand a slot, which to kill."""

    def __init__(self, workers: list[WorkerHandle], spawn_timeout: float | None) -> None:
        self.workers = workers  # the pool's list: spares live there, flagged ``spare``
        self.spawn_timeout = spawn_timeout
        self.retry_after = 0.0

    def waiting(self) -> list[WorkerHandle]:
        """Spares not yet handed a slot, nor on their way out."""
        return [w for w in self.workers if w.spare and not w.leaving]

    def take(self, slot: int, op: OperatorRef, now: float, fits: Callable[[int], bool]) -> WorkerHandle | None:
        """A live spare bound (or binding) ``op``, now the worker of ``slot``: the slot's own spare, else
        one whose slot ``fits`` (pinned to the same device; any, without GPUs), so a slot that frees
        first never forks while another busy slot's spare waits."""
        for w in sorted(self.waiting(), key=lambda w: w.slot != slot):
            if w.op != op or not w.can_send or w.proc.exitcode is not None or not (w.slot == slot or fits(w.slot)):
                continue
            w.spare = False
            w.slot = slot
            if w.binding:  # its start's deadline counts from now, as a fresh worker's would
                w.bind_until = now + self.spawn_timeout if self.spawn_timeout is not None else math.inf
            w.head_since = now
            return w
        return None

    def keep(self, busy_slots: list[int], wanted: int, op: OperatorRef, start: Callable[[int], WorkerHandle],
             bind: Callable[[WorkerHandle], None], now: float) -> None:
        """At most ``wanted`` spares, one per busy slot: kill the excess, fork what is missing.

        ``start`` forks a spare for a slot; ``bind`` sends it the stage's BIND.
        """
        for w in self.workers:
            # told to leave by a stop (RETIRE), or bound to another stage's operator: it must be gone
            # before the stage ends, and it has no subject to finish
            if w.spare and (w.phase is WorkerPhase.RETIRING or (w.op != op and not w.leaving)):
                w.kill()
        waiting = self.waiting()
        for w in sorted(waiting, key=lambda w: -w.slot)[:max(0, len(waiting) - wanted)]:
            w.kill()  # no subject is left to give it
        if len(waiting) >= wanted or now < self.retry_after:
            return
        have = {w.slot for w in waiting}
        for slot in busy_slots:
            if len(have) >= wanted:
                return
            if slot in have:
                continue
            try:
                w = start(slot)
            except Exception:  # noqa: BLE001 - a spare that cannot start is nobody's failure
                self.retry_after = time.monotonic() + SPARE_RETRY_SEC
                return
            bind(w)
            w.bind_until = math.inf  # a waiting spare's BIND has no deadline (see take)
            have.add(slot)
