"""What one subject cost, measured inside the process that ran it: times, CPU, peak memory, I/O.

A persistent worker runs thousands of subjects, so per-process numbers would
be wrong for all but the first. Before each subject the meter resets the
process's peak resident memory (Linux: writing ``5`` to
``/proc/self/clear_refs`` sets VmHWM back to the current RSS); after it, it
reads VmHWM from ``/proc/self/status``: that subject's own peak, short
spikes included (nothing is sampled). Not ``getrusage``'s ``ru_maxrss``:
that is the larger of VmHWM and a per-process maximum the kernel raises
when a thread exits, which no reset brings down (seen in Dask workers).
Child processes the subject started and waited for are charged through
``RUSAGE_CHILDREN``: their CPU as a difference, their peak memory when it
rose above every earlier child's and above the subject's own (the kernel
keeps only the maximum over the process's life, which cannot be reset, and
starts each child at its parent's peak when it was forked); otherwise the
children's peak is unknown (None) and not added. A tool run through ``run_tool`` is waited
for with ``wait4``, which gives that child's own peak: the largest such peak of the subject's
tools (:func:`note_tool_peak`) is its children's peak when the kernel's lifetime figure cannot
say more (a persistent worker whose earlier subject ran a larger child). A number that cannot
be measured is None, never a guess.

Every reading is one system call on a file descriptor kept open (about
5 to 8 microseconds per subject in all).
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import time
from typing import Any, NamedTuple


class Usage(NamedTuple):
    """What one subject cost (on the wire a plain tuple of these fields: engine/wire.py)."""

    started_at: float  # Unix seconds
    ended_at: float
    cpu_sec: float | None  # user + system, the subject's waited-for child processes included
    peak_rss_kb: int | None  # the subject's own peak, plus its largest child's when known
    child_peak_rss_kb: int | None
    read_bytes: int | None  # through read()/write() calls, reaped children included
    write_bytes: int | None
    host: str
    gpu: str | None  # CUDA_VISIBLE_DEVICES of the worker


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
        self.status_fd = _open("/proc/self/status", os.O_RDONLY)
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

    def _io_text(self) -> bytes | None:
        """/proc/self/io as it is now (rchar and wchar: bytes through read/write calls, reaped children included)."""
        if self.io_fd is None:
            return None
        try:
            return os.pread(self.io_fd, 256, 0)
        except OSError:
            return None

    def _hwm_kb(self) -> int | None:
        """VmHWM: the high-water mark of resident memory since the last reset, in kB."""
        if self.status_fd is None:
            return None
        try:
            text = os.pread(self.status_fd, 4096, 0)
            at = text.index(b"VmHWM:")
            return int(text[at + 6:text.index(b"kB", at)])
        except (OSError, ValueError):
            return None

    def begin(self) -> tuple[Any, ...]:
        """Snapshot taken right before the subject starts (resets the peak); parsed only in :meth:`end`."""
        exact = self._reset_peak() or self.fresh
        self.fresh = False
        _tool_peak_kb[0] = 0
        return (time.time(), _getrusage(_SELF), _getrusage(_CHILDREN), self._io_text(), exact)

    def end(self, mark: tuple[Any, ...]) -> Usage:
        """The subject's usage since :meth:`begin`."""
        own = _getrusage(_SELF)
        kids = _getrusage(_CHILDREN)
        ended = time.time()
        io1 = self._io_text()
        started, own0, kids0, io0, exact = mark
        cpu = (own.ru_utime - own0.ru_utime + own.ru_stime - own0.ru_stime
               + kids.ru_utime - kids0.ru_utime + kids.ru_stime - kids0.ru_stime)
        own_peak = self._hwm_kb()
        if own_peak is None and self.clear_fd is None and exact:
            own_peak = int(own.ru_maxrss * _MAXRSS_KB)  # no /proc: only a process's first subject is known
        kid_max, kid_max0 = int(kids.ru_maxrss * _MAXRSS_KB), int(kids0.ru_maxrss * _MAXRSS_KB)
        if kid_max == 0:
            child_peak: int | None = 0  # no child was ever waited for in this process: nothing to charge
        elif kid_max > kid_max0 and own_peak is not None and kid_max > own_peak:
            child_peak = kid_max
        else:
            # A child's ru_maxrss starts at its parent's peak when it was forked (exec keeps it), so
            # below our own peak it says nothing; below an earlier child's, nothing either: unknown.
            child_peak = None
        tool_peak = _tool_peak_kb[0]
        if tool_peak and (child_peak is None or tool_peak > child_peak):
            child_peak = tool_peak  # measured by run_tool's wait4: that tool's own peak
        peak = own_peak + (child_peak or 0) if own_peak is not None and exact else None
        read = write = None
        if io0 is not None and io1 is not None:
            try:
                a, b = io0.split(None, 4), io1.split(None, 4)
                read, write = int(b[1]) - int(a[1]), int(b[3]) - int(a[3])
            except (IndexError, ValueError):
                pass
        return Usage(started_at=started, ended_at=ended, cpu_sec=round(cpu, 6) if cpu > 0 else 0.0,
                     peak_rss_kb=peak, child_peak_rss_kb=child_peak, read_bytes=read, write_bytes=write,
                     host=self.host, gpu=self.gpu)


_meter: Meter | None = None
_tool_peak_kb = [0]  # the largest peak of a tool waited for by run_tool since the subject began


def note_tool_peak(kb: int) -> None:
    """A tool run for the current subject ended with this peak resident memory (kB, from wait4)."""
    if kb > _tool_peak_kb[0]:
        _tool_peak_kb[0] = kb


def meter() -> Meter:
    """This process's meter (a forked child gets its own, with its own descriptors)."""
    global _meter
    if _meter is None or _meter.pid != os.getpid():
        _meter = Meter()
    return _meter
