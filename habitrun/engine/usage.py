"""What one subject cost, measured inside the process that ran it: times, CPU, peak memory, I/O.

A persistent worker runs thousands of subjects, so per-process numbers would
be wrong for all but the first. Before each subject the meter resets the
process's peak resident memory (Linux: writing ``5`` to
``/proc/self/clear_refs`` sets VmHWM back to the current RSS, and
``getrusage(RUSAGE_SELF).ru_maxrss`` follows it), so the peak read after
the subject is that subject's own, short spikes included (nothing is
sampled). Child processes the subject started and waited for are charged
through ``RUSAGE_CHILDREN``: their CPU as a difference, their peak memory
when it rose above every earlier child's (the kernel keeps only the
maximum over the process's life, which cannot be reset; a fresh isolated
worker therefore always knows it). A number that cannot be measured is
None, never a guess.

Every reading is one system call of well under a microsecond on a file
descriptor kept open, so measuring costs the dispatch path nothing visible.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import time
from typing import Any

# A subject's usage as it travels from worker to runner (a plain tuple: cheap to pickle):
# (started_at, ended_at, cpu_sec, peak_rss_kb, child_peak_rss_kb, read_bytes, write_bytes, host, gpu)
Usage = tuple[float, float, "float | None", "int | None", "int | None", "int | None", "int | None", str, "str | None"]

_SELF = resource.RUSAGE_SELF
_CHILDREN = resource.RUSAGE_CHILDREN
_getrusage = resource.getrusage
# ru_maxrss is in kilobytes on Linux, in bytes on macOS.
_MAXRSS_KB = 1 / 1024 if sys.platform == "darwin" else 1


def _open(path: str, flags: int) -> int | None:
    try:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


class Meter:
    """Per-process meter; :func:`meter` gives this process's one (re-made after a fork)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.clear_fd = _open("/proc/self/clear_refs", os.O_WRONLY)
        self.io_fd = _open("/proc/self/io", os.O_RDONLY)
        self.fresh = True  # no subject measured in this process yet: its peak is the subject's anyway
        # Read once: a worker pins its GPU before its first subject and never changes it.
        self.gpu = os.environ.get("CUDA_VISIBLE_DEVICES")

    def _reset_peak(self) -> bool:
        if self.clear_fd is not None:
            try:
                os.write(self.clear_fd, b"5")
                return True
            except OSError:
                os.close(self.clear_fd)
                self.clear_fd = None
        return False

    def _io(self) -> tuple[int, int] | None:
        """(rchar, wchar): bytes through read/write calls, children reaped so far included."""
        if self.io_fd is None:
            return None
        try:
            text = os.pread(self.io_fd, 512, 0)
        except OSError:
            return None
        lines = text.split(b"\n", 2)
        try:
            return int(lines[0].split()[1]), int(lines[1].split()[1])
        except (IndexError, ValueError):
            return None

    def begin(self) -> tuple[Any, ...]:
        """Snapshot taken right before the subject starts (resets the peak)."""
        exact = self._reset_peak() or self.fresh
        self.fresh = False
        own = _getrusage(_SELF)
        kids = _getrusage(_CHILDREN)
        return (time.time(), own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime, kids.ru_maxrss,
                self._io(), exact)

    def end(self, mark: tuple[Any, ...]) -> Usage:
        """The subject's usage since :meth:`begin`."""
        started, cpu0, kid_cpu0, kid_max0, io0, exact = mark
        own = _getrusage(_SELF)
        kids = _getrusage(_CHILDREN)
        ended = time.time()
        io1 = self._io()
        cpu = (own.ru_utime + own.ru_stime - cpu0) + (kids.ru_utime + kids.ru_stime - kid_cpu0)
        child_peak = int(kids.ru_maxrss * _MAXRSS_KB) if kids.ru_maxrss > kid_max0 else None
        if kids.ru_maxrss == kid_max0 == 0:
            child_peak = 0  # no child was ever waited for in this process: nothing to charge
        peak = None
        if exact:
            peak = int(own.ru_maxrss * _MAXRSS_KB) + (child_peak or 0)
        read = write = None
        if io0 is not None and io1 is not None:
            read, write = io1[0] - io0[0], io1[1] - io0[1]
        return (started, ended, round(max(cpu, 0.0), 6), peak, child_peak, read, write, self.host, self.gpu)


_meter: Meter | None = None


def meter() -> Meter:
    """This process's meter (a forked child gets its own, with its own descriptors)."""
    global _meter
    if _meter is None or _meter.pid != os.getpid():
        _meter = Meter()
    return _meter
