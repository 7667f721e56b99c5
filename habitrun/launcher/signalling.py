"""Signalling a child's process group without ever hitting a recycled PID, and draining wake fds.

A process group has no handle of its own: ``killpg(pgid)`` names it by a number
(its leader's PID) that the kernel hands to a new process once the leader is
reaped and no member is left. Any check made first (is the leader unreaped? is
the number unused?) leaves a window before the ``killpg`` in which that can
happen, so nothing here signals a number; everything goes through a pidfd the
caller took while the number was provably its child's (before it could reap it):

- Linux 6.9+: ``pidfd_send_signal`` with ``PIDFD_SIGNAL_PROCESS_GROUP`` signals
  the group whose id is the pidfd's own PID object. The pidfd keeps that object
  and a recycled number gets a new one, so the original group is reached, even
  after its leader was reaped (its members still carry it), and nothing else.
- Linux 5.3 to 6.8 (pidfds without that flag, a degraded mode): each member is
  found in /proc, opened as a pidfd and signalled through it only if, read
  after the open, it was in the group while the leader was still unreaped (an
  unreaped leader pins the group's number). Once the leader is reaped nothing
  but the leader's pidfd is used: what it left in its group cannot be told
  apart from a newcomer's group, and is left alone.
- Before Linux 5.3 (no pidfds): :func:`require_pidfd` stops habitrun with
  :class:`~habitrun.errors.UnsupportedSystemError` before anything starts.

A caller asks a running group to stop through a ``StopChannel``: file
descriptors that turn readable (a stop flag's), the signal to forward, and
whether a second request came (which ends the grace at once).
"""

from __future__ import annotations

import errno
import multiprocessing.connection as mpc
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from habitrun.errors import UnsupportedSystemError

# <sys/pidfd.h>: PIDFD_SIGNAL_PROCESS_GROUP (1 << 2), Linux 6.9. The signal module names no constant for it.
PIDFD_SIGNAL_PROCESS_GROUP = 4
NO_PIDFD = ("this system has no pidfds (Linux 5.3 or later has them): habitrun signals its processes only "
            "through pidfds, never by a PID number that may have been recycled, so it cannot run here")

_group_flag = True  # until the kernel refuses PIDFD_SIGNAL_PROCESS_GROUP (EINVAL: before 6.9)


def require_pidfd() -> None:
    """Raise UnsupportedSystemError where the system has no pidfds: called before any process starts."""
    fd = open_pidfd(os.getpid())
    if fd is not None:
        os.close(fd)


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None if no such process is left (then it is never signalled).

    Raises UnsupportedSystemError where the system has no pidfds (Linux < 5.3).
    Only a pidfd taken while ``pid`` is known to be the caller's (its unreaped
    child) refers to the right process: the number alone proves nothing.
    """
    try:
        return os.pidfd_open(pid)
    except AttributeError:
        raise UnsupportedSystemError(NO_PIDFD) from None
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            raise UnsupportedSystemError(NO_PIDFD) from None
        return None


def unreaped(pidfd: int) -> bool:
    """True while the process behind ``pidfd`` runs or is a zombie (its PID cannot be reused)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except OSError:  # gone (ProcessLookupError)
        return False
    return True


def signal_group(pid: int, sig: int, pidfd: int | None = None) -> bool:
    """Signal the group led by ``pid`` (the child and everything it started) through ``pidfd``; True if sent.

    ``pidfd`` is the leader's, taken before it could be reaped. Without one
    nothing is sent: a number proves nothing. Before the child has made its own
    group (none carries its id) the child alone is signalled.
    """
    global _group_flag
    if pidfd is None:
        return False
    if _group_flag:
        try:
            signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
            return True
        except ProcessLookupError:
            return signal_one(pidfd, sig)  # no group carries its id (yet, or any more)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                return False  # EPERM: not ours to signal
            _group_flag = False  # Linux < 6.9
    sent = signal_members(pid, sig, pidfd)
    return signal_one(pidfd, sig) or sent


def signal_one(pidfd: int, sig: int) -> bool:
    """Signal the process behind ``pidfd`` alone; False if it was reaped (nothing else can be hit)."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False


def signal_members(pgid: int, sig: int, leader_pidfd: int) -> bool:
    """Signal each other member of group ``pgid`` through its own pidfd, while its leader pins the id.

    The degraded mode of kernels before 6.9 (see the module's docstring): a
    process is signalled only if its group, read after its pidfd was opened,
    is ``pgid`` and both it and the leader were unreaped after that read (so
    the read was its own, and the number still the leader's group's). Once the
    leader is reaped, nothing is sent.
    """
    if not unreaped(leader_pidfd):
        return False
    sent = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pgid or group_of(entry) != pgid:
            continue  # a cheap first look; what decides comes after the pidfd is open
        fd = open_pidfd(int(entry))
        if fd is None:
            continue
        try:
            if group_of(entry) == pgid and unreaped(fd) and unreaped(leader_pidfd):
                sent = signal_one(fd, sig) or sent
        finally:
            os.close(fd)
    return sent


def group_of(pid: int | str) -> int | None:
    """The process group of ``pid`` from /proc/<pid>/stat (field 5), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def drain(fd: int) -> bool:
    """Read what is waiting on a wake fd (never blocking); False once it is closed or unusable."""
    try:
        while mpc.wait([fd], 0):
            if not os.read(fd, 4096):
                return False  # end of file
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class StopChannel:
    """How a caller stops a running group: ``wake`` fds turn readable.

    ``stop_signal()`` names the signal to forward (None or absent: SIGTERM), as
    torchrun forwards the one it received; ``hurry()``, asked when a ``wake``
    fd turns readable again during the grace, True (a second Ctrl-C) ends it.
    """

    wake: Sequence[int] = ()
    hurry: Callable[[], bool] | None = None
    stop_signal: Callable[[], int | None] | None = None

    def requested(self) -> bool:
        """A ``wake`` fd is readable now."""
        return bool(self.wake) and bool(mpc.wait(list(self.wake), 0))

    def signum(self) -> int:
        """The signal a stop sends."""
        return (self.stop_signal() if self.stop_signal else None) or signal.SIGTERM

    def hurried(self) -> bool:
        """The caller wants the grace cut short."""
        return self.hurry is not None and self.hurry()

    def drain(self) -> None:
        """Consume what woke us, so only later writes wake us again."""
        for fd in self.wake:
            drain(fd)
