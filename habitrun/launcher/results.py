"""What a rank group left behind: per rank exit, signal, return value, error file and logs."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass, field
from typing import Any

from habitrun.launcher.errorfile import ErrorInfo


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass
class RankResult:
    """One rank's outcome. ``exitcode`` < 0 means it was killed by signal ``-exitcode``."""

    local_rank: int
    pid: int
    exitcode: int | None = None
    return_value: Any = None
    error: ErrorInfo | None = None
    error_file: str = ""
    stdout: str | None = None  # log file path, None when the stream went straight to the console
    stderr: str | None = None
    stopped: bool = False  # the launcher signalled it while it ran (not a failure of its own)
    ended_at: float | None = None  # wall clock when the launcher saw it exit
    seen: int | None = None  # order in which the launcher saw exits (ties share a number)

    @property
    def running(self) -> bool:
        return self.exitcode is None

    @property
    def failed(self) -> bool:
        return self.exitcode is not None and self.exitcode != 0

    @property
    def signal(self) -> int | None:
        return -self.exitcode if self.exitcode is not None and self.exitcode < 0 else None

    def describe(self) -> str:
        """``rank 1 (pid 42) was killed by SIGSEGV`` / ``... exited with code 3``."""
        head = f"rank {self.local_rank} (pid {self.pid})"
        if self.exitcode is None:
            return f"{head} is running"
        if self.signal is not None:
            return f"{head} was killed by {signal_name(self.signal)}"
        return f"{head} exited with code {self.exitcode}"


@dataclass
class GroupResult:
    """All ranks of one attempt, once every rank has exited."""

    attempt: int
    ranks: dict[int, RankResult] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.ranks.values())

    @property
    def failures(self) -> dict[int, RankResult]:
        return {n: r for n, r in self.ranks.items() if r.failed}

    @property
    def return_values(self) -> dict[int, Any]:
        return {n: r.return_value for n, r in self.ranks.items() if r.exitcode == 0}

    def root_cause(self) -> RankResult | None:
        """The first rank to fail on its own: earliest seen, then earliest error file, then lowest rank.

        Ranks the launcher stopped (after another rank failed, on a timeout or
        an interrupt) are never the root cause.
        """
        own = [r for r in self.ranks.values() if r.failed and not r.stopped]
        if not own:
            return None

        def key(r: RankResult) -> tuple[int, float, int]:
            stamp = r.error.timestamp if r.error and r.error.timestamp is not None else float("inf")
            return (r.seen if r.seen is not None else 1 << 30, stamp, r.local_rank)

        return min(own, key=key)
