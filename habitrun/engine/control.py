"""StopFlag: one way to ask a running stage to stop, from a signal or fail-fast.

It is a self-pipe so that event loops waiting on worker pipes and sentinels
(``multiprocessing.connection.wait``) wake up the moment it is set; setting it
is safe inside a signal handler.
"""

from __future__ import annotations

import os

DETACHED = "detached"
"""The stop reason of a detached run (``--detach``): its stage's SLURM arrays were submitted and left
running; the run's outcome is 'detached' (exit 0) and ``habitrun resume`` comes back for them."""


class StopFlag:
    """Set once to stop dispatching; ``hard`` means stop running subjects now."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        # A byte per set() (and per wake_watcher()), read by one watcher thread: the
        # level-triggered pipe above says "stopped", this one says "asked again".
        self._notice_r, self._notice_w = os.pipe()
        os.set_blocking(self._notice_w, False)
        self.reason: str | None = None
        self.hard = False
        self.signum: int | None = None

    def set(self, reason: str, *, hard: bool = False, signum: int | None = None) -> None:
        """Ask to stop; a second call may upgrade to ``hard``. Signal-handler safe."""
        if self.reason is None:
            self.reason = reason
            self.signum = signum
        if hard:
            self.hard = True
        for fd in (self._write_fd, self._notice_w):
            try:
                os.write(fd, b"x")
            except (BlockingIOError, OSError):
                pass

    def is_set(self) -> bool:
        return self.reason is not None

    def fileno(self) -> int:
        """Readable when set: hand this to ``connection.wait`` or ``select``."""
        return self._read_fd

    def wait_notice(self) -> None:
        """Block until set() is called again (or :meth:`wake_watcher`); for one watcher thread."""
        try:
            os.read(self._notice_r, 64)
        except OSError:
            pass

    def wake_watcher(self) -> None:
        """Release a thread blocked in :meth:`wait_notice` (when the run ends)."""
        try:
            os.write(self._notice_w, b"q")
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd, self._notice_r, self._notice_w):
            try:
                os.close(fd)
            except OSError:
                pass
