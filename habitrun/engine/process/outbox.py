"""A worker's replies to the runner, held a few milliseconds so that several share a write.

When subjects are short, one write and one wake-up of the runner per reply
is most of what a subject costs. The worker therefore holds a success back
while more runs wait in its queue, and sends what it holds in one write when
the oldest has waited ``hold_sec``, when its queue runs low (so the runner
refills it in time), or with the next failure or skip (the runner reacts to
those at once). A timer thread sends held replies on time even while the
next subject is still running. The runner learns what is running from the
worker's beacon, not from the replies, so holding costs neither timeout
accuracy nor death attribution.

Only short subjects' replies are held (``HOLD_MAX_SUBJECT_SEC`` in the worker): a
held reply is lost with a SIGKILLed runner and its subject runs again, which is
cheap for a subject of a few milliseconds and not for a longer one, whose write
is a negligible share of its time anyway.
"""

from __future__ import annotations

import threading
import time

from habitrun.engine.process import protocol as P


class Outbox:
    """Ordered, framed replies on the worker's end of the pipe."""

    def __init__(self, fd: int, hold_sec: float) -> None:
        self.fd = fd
        self.hold_sec = hold_sec
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._frames: list[bytes] = []
        self._first_at = 0.0
        self._timer: threading.Thread | None = None
        self.broken = False  # the runner is gone; nothing more is sent

    def send(self, data: bytes, *, hold: bool = False) -> None:
        """Queue one reply; write it (and all held before it) now unless ``hold`` allows waiting."""
        with self._lock:
            if not self._frames:
                self._first_at = time.monotonic()
            self._frames.append(P.frame(data))
            if hold and self.hold_sec > 0 and time.monotonic() - self._first_at < self.hold_sec:
                if len(self._frames) == 1:
                    self._arm()
                return
            self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Thread(target=self._send_on_time, name="habitrun-outbox", daemon=True)
            self._timer.start()
        else:
            self._due.notify()

    def _write(self) -> None:
        frames = self._frames
        if not frames:
            return
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        frames.clear()
        if self.broken:
            return
        try:
            P.write_all(self.fd, data)
        except OSError:  # the runner is gone; the inbox notices and ends the worker
            self.broken = True

    def _send_on_time(self) -> None:
        with self._lock:
            while True:
                if not self._frames:
                    self._due.wait()
                    continue
                left = self._first_at + self.hold_sec - time.monotonic()
                if left > 0:
                    self._due.wait(left)
                    continue
                self._write()
