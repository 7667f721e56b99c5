"""Turn SIGINT/SIGTERM/SIGHUP into a StopFlag so a run stops cleanly and stores what finished.

First signal: stop dispatching, let running subjects finish within the grace
period. A second SIGINT: stop everything at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from habitrun.engine.control import StopFlag

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_for(signum: int | None) -> int:
    """130 for SIGINT (the design's 'interrupted'), 128+N for SIGTERM (143) and SIGHUP (129)."""
    if signum is None or signum == signal.SIGINT:
        return 130
    return 128 + int(signum)


def signal_name(signum: int | None) -> str | None:
    """``SIGINT`` for 2; None for None."""
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def stop_on_signals(stop: StopFlag) -> Iterator[StopFlag]:
    """Install the handlers for the duration (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(signum: int, frame: object) -> None:
        if stop.is_set():
            stop.set(f"signal {signal.Signals(signum).name} (again)", hard=True, signum=signum)
        else:
            stop.set(f"signal {signal.Signals(signum).name}", signum=signum)

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handle)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
