"""StopFlag: one way to ask a running stage to stop, from a signal or fail-fast.

It is a self-pipe so that event loops waiting on worker pipes and sentinels
(``multiprocessing.connection.wait``) wake up the moment it is set; setting it
is safe inside a signal handler.
"""

from __future__ import annotations

import os


class StopFlag:
    """Set once to stop dispatching; ``hard`` means stop running subjects now."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
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
        try:
            os.write(self._write_fd, b"x")
        except (BlockingIOError, OSError):
            pass

    def is_set(self) -> bool:
        return self.reason is not None

    def fileno(self) -> int:
        """Readable when set: hand this to ``connection.wait`` or ``select``."""
        return self._read_fd

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
