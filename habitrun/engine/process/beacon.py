"""What a worker is running, in shared memory: the runner reads it without a message.

A worker holds its replies back for a few milliseconds so that several travel
in one write (see ``outbox``). The runner then cannot tell from the replies
alone which subject is running, and it must: a subject's timeout counts from
its start, and a worker's death is charged to the subject it was running,
while the ones it finished but had not yet reported are simply run again.
The beacon answers both: three numbers the worker writes around each run.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from typing import NamedTuple

_TAKEN, _RUNNING, _STARTED_AT, _OUTPUT_FROM = 0, 1, 2, 3


class BeaconReading(NamedTuple):
    taken: int  # runs the worker has taken from its queue (each gets exactly one reply)
    running: bool  # the last one taken is executing now
    started_at: float  # time.monotonic() when it started (the clock is the machine's, shared)
    output_from: int = 0  # where its output starts in the worker's scratch file


SIZE = 4 * 8  # four doubles


def _shared_file() -> int:
    """A file of SIZE bytes that only descriptors reach (memfd; elsewhere an unlinked temporary file)."""
    try:
        fd = os.memfd_create("habitrun-beacon", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="habitrun-beacon-")
        os.unlink(path)
    os.ftruncate(fd, SIZE)
    return fd


class Beacon:
    """Four doubles in shared memory, written by one worker, read by the runner.

    The memory is a small file mapped by both: the runner makes it, and hands
    its descriptor (:attr:`fd`) to the worker, which maps it with :meth:`attach`
    (a forked worker inherits the mapping itself).
    """

    def __init__(self, fd: int | None = None) -> None:
        self.fd: int | None = _shared_file() if fd is None else fd
        self._map = mmap.mmap(self.fd, SIZE)
        self.array = memoryview(self._map).cast("d")

    @classmethod
    def attach(cls, fd: int) -> Beacon:
        """In the worker: map the beacon the runner made, given its descriptor (closed once mapped)."""
        beacon = cls(fd)
        beacon.release_fd()
        return beacon

    def release_fd(self) -> None:
        """Close the descriptor once the worker has its own (the mapping stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # ------------------------------------------------------------------ worker side
    def took(self, taken: int, running: bool, output_from: int = 0) -> None:
        """The worker took its ``taken``-th run; ``running``: it executes it now."""
        a = self.array
        if running:
            a[_STARTED_AT] = time.monotonic()  # before the count: a reader never sees a new count with an old time
            a[_OUTPUT_FROM] = output_from
        a[_TAKEN] = taken
        a[_RUNNING] = 1.0 if running else 0.0

    def ended(self) -> None:
        self.array[_RUNNING] = 0.0

    # ------------------------------------------------------------------ runner side
    def read(self) -> BeaconReading:
        a = self.array
        while True:
            taken = a[_TAKEN]
            running = a[_RUNNING]
            started_at = a[_STARTED_AT]
            output_from = a[_OUTPUT_FROM]
            if a[_TAKEN] == taken:  # the worker did not move on while we read
                return BeaconReading(int(taken), running != 0.0, started_at, int(output_from))
