"""Why a worker process ended, in words a user can act on.

A worker that ends while it owes a result turns that result into a failure
of the subject it was running. The wording names the signal
("worker died with signal SIGSEGV") or the exit code ("worker exited with
code 3"); a SIGKILL we did not send while the worker's memory was high is
called out of memory (see :mod:`habitrun.engine.process.memory`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from habitrun.engine.contract import FailureKind


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class Death:
    """A failure caused by the end of a worker: its FailureKind and one-line message."""

    kind: str
    message: str


def classify_exit(exitcode: int | None, *, oom_note: str | None = None,
                  kernel_oom_note: str | None = None) -> Death:
    """Turn a worker's exit status into a subject failure.

    ``oom_note`` is set when our watchdog stopped the worker for memory;
    ``kernel_oom_note`` when it died by a SIGKILL we did not send while its
    memory was high (or the cgroup counted an OOM kill).
    """
    if oom_note:
        return Death(FailureKind.OOM, oom_note)
    if exitcode is None:
        return Death(FailureKind.WORKER_DIED, "worker vanished (exit status unknown)")
    if exitcode < 0:
        signum = -exitcode
        if signum == signal.SIGKILL and kernel_oom_note:
            return Death(FailureKind.OOM, kernel_oom_note)
        return Death(FailureKind.WORKER_DIED, f"worker died with signal {signal_name(signum)}")
    if exitcode == 0:
        return Death(FailureKind.NO_REPORT, "worker exited with code 0 without reporting a result")
    return Death(FailureKind.WORKER_DIED, f"worker exited with code {exitcode}")
