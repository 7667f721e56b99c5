"""Tie a rank's life to the launcher's: PR_SET_PDEATHSIG, checked against a race.

Runs inside the rank (first thing in the function bootstrap, or in the tiny
trampoline that execs a command). If the launcher dies between fork and this
call, ``getppid()`` no longer matches and the rank exits at once.

The kernel sends the signal when the *thread* that started the rank exits, so
a launcher must start, watch and close a group from one long-lived thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel for ``sig`` when the parent dies; exit now if it already has.

    ``parent_pid`` None: the parent is not the launcher (a fork server); only
    the signal is armed, and the launcher's watchdog covers the rest.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


# The command trampoline: ``python -S -c TRAMPOLINE <parent_pid> <program> <args...>``.
# Kept free of habitrun imports so it starts in a few milliseconds.
TRAMPOLINE = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"habitrun: cannot run {sys.argv[2]!r}: {exc}\\n")
    os._exit(127)
"""
