"""The rank watchdog's own process: when the launcher dies, SIGKILL each rank's group it was given.

It runs as ``python -I -S watchdog_process.py`` and imports only the standard
library, so it starts in milliseconds. Its stdin is a unix SEQPACKET socket
from the launcher, one message each: ``+pgid`` carrying the pidfd the launcher
took of that rank (before it could reap it), ``-pgid`` when the group is done
with, ``bye`` when all is well. End of file without ``bye``: the launcher is
gone, and every group still registered is killed.

A group is signalled only through the pidfd it came with, by the rules of
:mod:`habitrun.launcher.signalling` (repeated here, not imported): on Linux
6.9+ the whole original group, even after its leader was reaped, and never a
group that has since taken its number; before 6.9 the leader alone while it
is unreaped (degraded: what it started is left). A group registered without
a pidfd is not ours to signal: nothing proves the number is still its own.
"""

from __future__ import annotations

import errno
import os
import signal
import socket

PIDFD_SIGNAL_PROCESS_GROUP = 4  # <sys/pidfd.h> (1 << 2), Linux 6.9


def ours(pgid: int, groups: dict[int, int | None]) -> bool:
    """True only for a group registered with its leader's pidfd: a number alone proves nothing."""
    return groups.get(pgid) is not None


def kill_group(pidfd: int) -> bool:
    """SIGKILL the group of the leader behind ``pidfd`` (the leader alone before Linux 6.9); True if sent.

    A pidfd whose process was reaped and whose group is empty reaches nothing,
    whoever holds its number now.
    """
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL, None, PIDFD_SIGNAL_PROCESS_GROUP)
        return True
    except ProcessLookupError:
        pass  # no process carries the group any more (or yet): the leader alone, if unreaped
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            return False
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except OSError:
        return False


def read(conn: socket.socket, groups: dict[int, int | None]) -> bool:
    """Keep ``groups`` up to date until the launcher says ``bye`` (True) or is gone (False)."""
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 64, 1)
        except OSError:
            return False
        line = msg.decode(errors="replace").strip()
        if not line:
            return False  # end of file: the launcher is gone
        if line == "bye":
            return True
        try:
            pgid = int(line[1:])
        except ValueError:
            pgid = 0
        old = groups.pop(pgid, None)
        if old is not None:
            os.close(old)
        if line[:1] == "+" and pgid > 0:
            groups[pgid] = fds.pop(0) if fds else None
        for fd in fds:
            os.close(fd)


def main() -> None:
    groups: dict[int, int | None] = {}
    conn = socket.socket(fileno=0)
    if read(conn, groups):
        return
    for pgid, fd in groups.items():
        if fd is not None and ours(pgid, groups):
            kill_group(fd)


if __name__ == "__main__":
    main()
