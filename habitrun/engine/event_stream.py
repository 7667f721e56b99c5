"""A run's events on their way out: written to the run folder's log, then shown.

Events come from the runner, the recorder thread and the stop notices; one
lock keeps each batch's lines together and in the order they are shown. The
log line is ``event_dict``'s (engine/events.py); the observer (the display)
gets the typed event. A write that fails (a full disk) goes to the run's
WriteFailure, and nothing more is written; the observer still sees the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from habitrun.engine.events import Event, event_dict
from habitrun.engine.write_failure import WriteFailure
from habitrun.store.runs import RunFolder

Observer = Callable[[Event], None]


class EventStream:
    """Writes events to a run folder's ``events.jsonl`` and hands them to the observer."""

    def __init__(self, observer: Observer | None, write_failure: WriteFailure) -> None:
        self.observer = observer
        self.write_failure = write_failure
        self.run: RunFolder | None = None  # set once the run folder exists
        self._lock = threading.Lock()

    def attach(self, run: RunFolder) -> None:
        self.run = run

    def emit(self, event: Event) -> None:
        self.emit_many([event])

    def emit_many(self, events: Sequence[Event]) -> None:
        if not events:
            return
        with self._lock:
            if self.run is not None and not self.write_failure:
                try:
                    self.run.events.write_many([event_dict(event) for event in events])
                except OSError as exc:  # a full disk under the run folder: stop, as for the store
                    self.write_failure.note(self.run.path, exc)
            if self.observer is not None:
                for event in events:
                    self.observer(event)

    def show(self, event: Event) -> None:
        """Hand an event to the observer only (a rank's console line: its log holds it already)."""
        if self.observer is not None:
            self.observer(event)
