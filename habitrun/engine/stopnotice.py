"""Saying at once what a stop signal waits for, and what a second one does.

The signal handler only sets the StopFlag (anything more is unsafe there), and
the dispatch loop may be busy or blocked in a wait; so a thread of its own,
woken by the flag's notice pipe, emits a ``stopping`` event: which stage, how
many subjects (or ranks) are still running, the grace it waits, and that the
signal again stops them now. A stop without a signal (fail_fast) has its own
message and gets none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from habitrun.engine.control import StopFlag
from habitrun.engine.events import Stopping


class StopNotices:
    """One ``stopping`` event for the first signal, one (``now``) for the second; started at once."""

    def __init__(self, stop: StopFlag, emit: Callable[[Stopping], None], facts: Callable[[], Stopping]) -> None:
        self.stop, self.emit, self.facts = stop, emit, facts
        self.open = True
        self.thread = threading.Thread(target=self._watch, name="habitrun-stop-notice", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        told = 0  # 1: the first signal was answered; 2: the second
        while True:
            self.stop.wait_notice()
            if not self.open:
                return
            if self.stop.signum is None or not self.stop.is_set():
                continue
            if told == 0 and not self.stop.hard:
                told = 1
                self.emit(self.facts())
            elif told < 2 and self.stop.hard:
                told = 2
                self.emit(replace(self.facts(), now=True))

    def close(self) -> None:
        """No more notices (the run is ending); the thread ends."""
        self.open = False
        self.stop.wake_watcher()
        self.thread.join(timeout=5)
