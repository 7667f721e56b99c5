"""A worker's lifecycle as the runner sees it: one phase, moved only along a fixed table.

Kept apart from the handle so the whole lifecycle reads in one place:

    STARTING --first BIND answered--> READY
    STARTING / READY --told to leave (RETIRE, EXIT) or done (isolated)--> RETIRING
    STARTING / READY / RETIRING --signalled (SIGTERM, SIGKILL)--> STOPPING
    any but DEAD --buried--> DEAD

A BIND awaiting its answer (a worker's first or a later stage's) is not a
phase: it may be pending while the worker is ready, retiring or stopping
(see ``WorkerHandle.bind_until``). Whether the pipe still works is not one
either: a write fails, or its end is read, in any phase but DEAD.
"""

from __future__ import annotations

import enum


class WorkerPhase(enum.Enum):
    """Where one worker is in its life (see the module's table)."""

    STARTING = "starting"  # its process started; its first BIND not answered yet
    READY = "ready"  # bound (or told us why it cannot bind): it takes runs
    RETIRING = "retiring"  # told to leave, or done (isolated): its exit is expected
    STOPPING = "stopping"  # signalled: it ends whatever it runs
    DEAD = "dead"  # buried: reaped, pipe and pidfd closed, gone from the pool


TRANSITIONS: dict[WorkerPhase, frozenset[WorkerPhase]] = {
    WorkerPhase.STARTING: frozenset({WorkerPhase.READY, WorkerPhase.RETIRING, WorkerPhase.STOPPING,
                                     WorkerPhase.DEAD}),
    WorkerPhase.READY: frozenset({WorkerPhase.RETIRING, WorkerPhase.STOPPING, WorkerPhase.DEAD}),
    WorkerPhase.RETIRING: frozenset({WorkerPhase.STOPPING, WorkerPhase.DEAD}),
    WorkerPhase.STOPPING: frozenset({WorkerPhase.DEAD}),
    WorkerPhase.DEAD: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the table does not allow: a bug in the dispatch loop, never a subject's fault."""

    def __init__(self, current: WorkerPhase, wanted: WorkerPhase, pid: int | None = None) -> None:
        who = f"worker {pid}" if pid is not None else "a worker"
        super().__init__(f"{who} cannot move from {current.value} to {wanted.value}")
        self.current = current
        self.wanted = wanted


def check_move(current: WorkerPhase, wanted: WorkerPhase, pid: int | None = None) -> None:
    """Raise :class:`IllegalTransition` unless the table allows ``current -> wanted``."""
    if wanted not in TRANSITIONS[current]:
        raise IllegalTransition(current, wanted, pid)
