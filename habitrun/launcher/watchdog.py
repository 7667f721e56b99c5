"""A watchdog process that kills every rank's process group if the launcher dies.

PR_SET_PDEATHSIG kills a rank when the launcher dies, but not the rank's own
children (data loader workers, a shell's program). The watchdog
(:mod:`habitrun.launcher.watchdog_process`) holds one end of a unix socket;
the launcher registers each rank's group with the rank's pidfd (passed over
the socket, ``SCM_RIGHTS``: the very pidfd the launcher took before it could
reap the rank, never one reopened from a number that may have been recycled)
and says ``bye`` when it closes. End-of-file without ``bye`` means the
launcher is gone: every group still registered is killed through its pidfd.
It runs in its own session, so a terminal's Ctrl-C reaches habitrun, never
the watchdog.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from habitrun.errors import LaunchError
from habitrun.launcher.signalling import require_pidfd

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog_process.py")


class Watchdog:
    """Start with ``Watchdog()``; ``watch(pgid, pidfd)``, ``forget(pgid)``, ``close()``."""

    def __init__(self) -> None:
        require_pidfd()  # before any rank starts: without pidfds nothing could be signalled safely
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SCRIPT],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            mine.close()
            raise LaunchError(f"cannot start the rank watchdog: {exc}") from exc
        finally:
            theirs.close()
        self._sock = mine
        self._closed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def fileno(self) -> int:
        """The launcher's end of the socket (a forked rank closes it)."""
        return self._sock.fileno()

    def _send(self, line: str, pidfd: int | None = None) -> None:
        if self._closed:
            return
        try:
            if pidfd is None:
                self._sock.send(line.encode(), socket.MSG_NOSIGNAL)
            else:
                socket.send_fds(self._sock, [line.encode()], [pidfd], socket.MSG_NOSIGNAL)
        except OSError:
            self._closed = True

    def watch(self, pgid: int, pidfd: int | None) -> None:
        """Register the group led by ``pgid`` with the leader's pidfd (without one it is never signalled)."""
        if pidfd is not None:
            self._send(f"+{pgid}", pidfd)

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Tell the watchdog all is well and reap it."""
        if not self._closed:
            self._send("bye")
            self._closed = True
        self._sock.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

