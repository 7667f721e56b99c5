"""A watchdog process that kills every rank's process group if the launcher dies.

PR_SET_PDEATHSIG kills a rank when the launcher dies, but not the rank's own
children (data loader workers, a shell's program). The watchdog holds the read
end of a pipe; the launcher writes ``+pgid`` / ``-pgid`` lines as groups start
and end. End-of-file without a closing ``bye`` means the launcher is gone:
SIGKILL to every group still registered, through the same guard as
``signalling.signal_group`` (a pidfd taken when the group was registered), so
a rank reaped long ago whose PID was recycled is never hit. It runs in its own
session, so a terminal's Ctrl-C reaches habitrun, never the watchdog.
"""

from __future__ import annotations

import subprocess
import sys

from habitrun.errors import LaunchError

_CODE = """
import os, signal, sys
groups = {}
clean = False

def pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None

def ours(pgid, fd):
    # never a recycled PID's group: the leader unreaped, or its number unused by any process
    if fd is None:
        return True
    try:
        signal.pidfd_send_signal(fd, 0)
        return True  # the leader is unreaped: its number cannot have been reused
    except (AttributeError, OSError):
        pass
    try:
        os.kill(pgid, 0)
    except ProcessLookupError:
        return True  # no process holds the number: only the old group's members carry it
    except OSError:
        pass
    return False

for line in sys.stdin:
    line = line.strip()
    if line == "bye":
        clean = True
        break
    if line[:1] == "+":
        groups[int(line[1:])] = pidfd(int(line[1:]))  # taken while the leader is alive
    elif line[:1] == "-":
        groups.pop(int(line[1:]), None)
if not clean:
    for pgid, fd in groups.items():
        if not ours(pgid, fd):
            continue
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
"""


class Watchdog:
    """Start with ``Watchdog()``; ``watch(pgid)``, ``forget(pgid)``, ``close()``."""

    def __init__(self) -> None:
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _CODE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the rank watchdog: {exc}") from exc
        assert self._proc.stdin is not None
        self._out = self._proc.stdin
        self._closed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def fileno(self) -> int:
        """The launcher's end of the pipe (a forked rank closes it)."""
        return self._out.fileno()

    def _send(self, line: str) -> None:
        if self._closed:
            return
        try:
            self._out.write(line.encode() + b"\n")
            self._out.flush()
        except (BrokenPipeError, OSError):
            self._closed = True

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Tell the watchdog all is well and reap it."""
        if not self._closed:
            self._send("bye")
            self._closed = True
        try:
            self._out.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

