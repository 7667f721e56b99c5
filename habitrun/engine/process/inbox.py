"""A worker's messages from the runner, read ahead by a thread; RETIRE and RECALL take effect at once.

The thread takes every frame that has arrived with one read, so a batch of
runs costs the worker one wake-up and one hand-over, not one per run.

RECALL is how the runner takes back runs queued in a busy worker when
another worker is idle. The worker's main loop takes runs from this inbox
one at a time under its lock; a RECALL removes, under the same lock, every
run not taken yet and answers RECALLED with how many. So each run is either
taken (and answered by its own reply) or recalled (and counted in RECALLED),
never both, and the runner sends a recalled run elsewhere only once it has
that answer. The recalled runs are always the last ones the runner sent
before its RECALL (it sends nothing more to the worker until the answer),
so it takes them from the end of what the worker owes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from habitrun.engine.invoke import one_line
from habitrun.engine.process import protocol as P
from habitrun.engine.process.outbox import Outbox

_RUNS = (P.RUN, P.UNDECODABLE)  # what the main loop takes as a run (and answers once)


class Inbox:
    """Runs and binds waiting for the worker's main loop, in the order the runner sent them."""

    def __init__(self, conn: Connection, outbox: Outbox, on_runner_gone: Callable[[], Any]) -> None:
        self.conn = conn
        self.outbox = outbox
        self.on_runner_gone = on_runner_gone
        self._ready = threading.Condition(threading.Lock())
        self._items: deque[tuple[Any, ...]] = deque()
        self.retired = False
        self.leaving = False
        self.runner_gone = False  # end of file from the runner: start nothing more
        threading.Thread(target=self._read, name="habitrun-inbox", daemon=True).start()

    # ------------------------------------------------------------ main loop side
    def get(self) -> tuple[Any, ...]:
        """The next message; once returned, a run is the worker's to answer (no RECALL takes it)."""
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    # ------------------------------------------------------------ reader thread
    def _put(self, messages: list[tuple[Any, ...]]) -> None:
        if messages:
            with self._ready:
                self._items.extend(messages)
                self._ready.notify()
            messages.clear()

    def _recall(self) -> None:
        """Take back every run not taken yet and say how many (the runner sends them elsewhere)."""
        with self._ready:
            kept = [m for m in self._items if m[0] not in _RUNS]
            recalled = len(self._items) - len(kept)
            self._items.clear()
            self._items.extend(kept)
        self.outbox.send(P.dumps(P.recalled_message(recalled)))

    def _read(self) -> None:
        reader = P.FrameReader()
        fd = self.conn.fileno()
        while True:
            try:
                frames = reader.read(fd)
            except OSError:
                frames = None
            if frames is None:
                if not self.leaving:
                    self.runner_gone = True
                    self.on_runner_gone()  # the runner is gone: take everything we started with us
                return
            if not self._handle(frames):
                return

    def _handle(self, frames: list[bytes]) -> bool:
        """Hand these frames over in order; False once told to leave (nothing more is read)."""
        batch: list[tuple[Any, ...]] = []
        for data in frames:
            try:
                message = P.loads(data)
            except BaseException as exc:  # noqa: BLE001 - a message the worker cannot rebuild
                batch.append((P.UNDECODABLE, one_line(exc)))
                continue
            tag = message[0]
            if tag == P.TERMINATE:
                self.on_runner_gone()
            if tag == P.RECALL:
                self._put(batch)
                self._recall()
            elif tag in (P.RETIRE, P.EXIT):
                self.retired = self.retired or tag == P.RETIRE
                self.leaving = True
                batch.append((P.EXIT,))
                self._put(batch)
                return False
            else:
                batch.append(message)
        self._put(batch)
        return True
