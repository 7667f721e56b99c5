"""Signalling a rank's process group and draining wake fds: small helpers of the process context."""

from __future__ import annotations

import multiprocessing.connection as mpc
import os


def signal_group(pid: int, sig: int) -> None:
    """Signal the rank's process group; before the rank has made its group, the rank alone."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def drain(fd: int) -> bool:
    """Read what is waiting on a wake fd (never blocking); False once it is closed or unusable."""
    try:
        while mpc.wait([fd], 0):
            if not os.read(fd, 4096):
                return False  # end of file
    except OSError:
        return False
    return True
