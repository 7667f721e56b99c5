"""Persistent versus isolated workers: the few decisions that differ, as one strategy object.

A persistent worker serves runs until told to leave: runs may be queued
ahead in it, its durations shape how deep, and it retires after too many
failures in a row or after ``persistent_worker_recycle_after_tasks``
successes. An isolated worker runs exactly one subject and exits by itself.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from habitrun.engine.process.handle import WorkerHandle
from habitrun.spec.policy import RunPolicy

REPLY_HOLD_SEC = 0.1  # a worker holds a success at most this long to send it with the next ones


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker of this mode is told at its start (see ``WorkerConfig``)."""

    max_tasks: int
    max_consecutive_failures: int
    reply_hold_sec: float


class WorkerMode(abc.ABC):
    """What differs between the modes; the dispatch loop asks, never checks which mode it is."""

    name: str
    learns: bool  # its subjects' durations decide how many runs are queued ahead
    keeps_spares: bool  # a busy slot gets its next process started ahead (see spares)

    @abc.abstractmethod
    def settings(self) -> WorkerSettings:
        """What a new worker is told."""

    @abc.abstractmethod
    def may_take(self, w: WorkerHandle) -> bool:
        """Beyond room and pipe: whether this worker may be given another run."""

    @abc.abstractmethod
    def room(self, w: WorkerHandle, room: int) -> int:
        """At most this many runs to send it now, of the ``room`` the stage would give."""

    @abc.abstractmethod
    def after_done(self, w: WorkerHandle, ok: bool) -> bool:
        """A run of ``w`` was answered; True when it must now be told to retire."""


class PersistentMode(WorkerMode):
    """Workers serve runs until told to leave (the default)."""

    name = "persistent"
    learns = True
    keeps_spares = False

    def __init__(self, policy: RunPolicy) -> None:
        self.recycle = policy.persistent_worker_recycle_after_tasks or 0
        self.max_failures = policy.persistent_worker_max_consecutive_failures

    def settings(self) -> WorkerSettings:
        return WorkerSettings(max_tasks=0, max_consecutive_failures=self.max_failures,
                              reply_hold_sec=REPLY_HOLD_SEC)

    def may_take(self, w: WorkerHandle) -> bool:
        recycle = self.recycle
        return not (recycle and w.successes + len(w.outstanding) >= recycle)

    def room(self, w: WorkerHandle, room: int) -> int:
        recycle = self.recycle
        if recycle:
            return min(room, recycle - w.successes - len(w.outstanding))
        return room

    def after_done(self, w: WorkerHandle, ok: bool) -> bool:
        if w.leaving:
            return False
        return (not ok and w.consecutive_failures >= self.max_failures) or \
            bool(self.recycle and w.successes >= self.recycle)


class IsolatedMode(WorkerMode):
    """One subject per worker process: nothing queued ahead, nothing learnt, it exits by itself;
    the slot's next process waits ready as a spare."""

    name = "isolated"
    learns = False
    keeps_spares = True

    def settings(self) -> WorkerSettings:
        return WorkerSettings(max_tasks=1, max_consecutive_failures=0, reply_hold_sec=0.0)

    def may_take(self, w: WorkerHandle) -> bool:
        return not w.outstanding and not w.replies  # never given a run yet

    def room(self, w: WorkerHandle, room: int) -> int:
        return 1

    def after_done(self, w: WorkerHandle, ok: bool) -> bool:
        w.retire()  # its one run is answered: it exits without being told
        return False


def mode_for(policy: RunPolicy) -> WorkerMode:
    return IsolatedMode() if policy.parallel_mode == "isolated" else PersistentMode(policy)
