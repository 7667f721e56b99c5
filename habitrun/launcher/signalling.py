"""Signalling a child's process group without ever hitting a recycled PID, and draining wake fds.

A process group has no handle of its own: ``killpg(pid)`` names it by the
leader's number. That number stays ours while the leader is unreaped (alive
or a zombie) or while any member of its group lives; once the leader is
reaped and its group is empty the kernel may hand the number to a new
process, whose own group ``killpg`` would then hit. So a group is signalled
only while a pidfd (which can never refer to another process) shows the
leader unreaped, or, once it is reaped, only while no process holds its
number (then only members of the old group can still carry that group id).

A caller asks a running group to stop through a ``StopChannel``: file
descriptors that turn readable (a stop flag's), the signal to forward, and
whether a second request came (which ends the grace at once).
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux 5.3+), or None where the system has none or it is already gone."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def unreaped(pidfd: int) -> bool:
    """True while the process behind ``pidfd`` runs or is a zombie (its PID cannot be reused)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except (AttributeError, OSError):  # gone (ProcessLookupError) or no pidfd support
        return False
    return True


def pid_in_use(pid: int) -> bool:
    """Some process (or thread) holds this number now."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def signal_group(pid: int, sig: int, pidfd: int | None = None) -> bool:
    """Signal the group led by ``pid`` (the child and everything it started); True if sent.

    With a ``pidfd`` the group is signalled while the leader is unreaped; once
    reaped, only while its PID is unused (members of the old group may still
    carry the id, no new process can). Before the child has made its own group
    (``killpg`` finds none) the child alone is signalled, through the pidfd.
    Without a pidfd the caller must know the child unreaped (e.g. its Popen not
    yet polled to an exit).
    """
    if pidfd is not None and not unreaped(pidfd):
        if pid_in_use(pid):
            return False  # recycled: never ours to signal
        try:
            os.killpg(pid, sig)
            return True
        except OSError:
            return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False


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
