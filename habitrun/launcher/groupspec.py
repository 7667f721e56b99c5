"""What a rank group runs and how: one value handed from ``launch`` to every attempt's group.

The entrypoint, each rank's arguments and the start, stream and stop options
stay the same across a launch's attempts; only the environments, the log folder
and the attempt number change, and those are passed beside the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from habitrun.launcher.std import Std, StdSpec
from habitrun.launcher.streams import Console


@dataclass(frozen=True)
class RankGroupSpec:
    """A rank group's entrypoint and options.

    ``entrypoint`` is a picklable function (called as ``fn(*args[rank])``, its
    return value in the result) or an argv list (``args[rank]`` appended), run
    without a shell. ``grace``: seconds between the stop signal and SIGKILL;
    ``period``: the longest a wait sleeps between looks (None: only on events).
    """

    entrypoint: Callable[..., Any] | Sequence[str]
    args: Mapping[int, tuple[Any, ...]]
    name: str = "train"
    redirects: StdSpec = Std.NONE
    tee: StdSpec = Std.ALL
    local_ranks_filter: Sequence[int] | None = None
    start_method: str = "spawn"
    cwd: str | None = None
    console: Console | None = None
    grace: float = 15.0
    period: float | None = None

    @property
    def runs_command(self) -> bool:
        """True for an argv entrypoint, False for a function."""
        return not callable(self.entrypoint)
