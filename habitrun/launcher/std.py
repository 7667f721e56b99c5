"""Which standard streams of a rank go where: ``none`` / ``out`` / ``err`` / ``all``, or a map by rank.

The recipe writes the torchrun words as strings; the launcher works with flags so
``redirects | tee`` and ``stream in mode`` read naturally. ``plan_streams``
turns a group's ``redirects`` and ``tee`` into each rank's stdout and stderr
destination.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntFlag

from habitrun.errors import LaunchError


class Std(IntFlag):
    """A set of streams: OUT, ERR, both (ALL) or NONE."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = OUT | ERR

    @classmethod
    def parse(cls, value: Std | str | int) -> Std:
        """``"out"`` -> Std.OUT; accepts a Std, its name in any case, or its number (0-3)."""
        if isinstance(value, Std):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise LaunchError(
                    f"stream selection {value!r} is not one of none, out, err, all"
                ) from None
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
            return cls(value)
        raise LaunchError(f"stream selection {value!r} is not one of none, out, err, all")


StdSpec = Std | str | Mapping[int, Std | str] | None
"""One selection for every rank, a map by rank (others: none), or None (none)."""


def to_map(spec: StdSpec, nprocs: int) -> dict[int, Std]:
    """One Std per local rank; a map names some ranks, the others get NONE."""
    if spec is None:
        return dict.fromkeys(range(nprocs), Std.NONE)
    if isinstance(spec, Mapping):
        bad = [r for r in spec if not isinstance(r, int) or not 0 <= r < nprocs]
        if bad:
            raise LaunchError(f"stream map names ranks {bad} outside 0..{nprocs - 1}")
        return {r: Std.parse(spec.get(r, Std.NONE)) for r in range(nprocs)}
    std = Std.parse(spec)
    return dict.fromkeys(range(nprocs), std)


@dataclass(frozen=True)
class StreamPlan:
    """Where one stream of one rank goes: ``tee`` (pipe -> file + console), ``file`` or ``inherit``."""

    mode: str
    path: str | None


def plan_streams(
    nprocs: int,
    rank_dirs: Mapping[int, str],
    redirects: StdSpec,
    tee: StdSpec,
    local_ranks_filter: Sequence[int] | None,
) -> dict[int, dict[str, StreamPlan]]:
    """Decide every rank's stdout and stderr.

    - teed (and the rank passes ``local_ranks_filter``): its log file and the console, prefixed;
    - redirected, or teed/unselected but filtered out: its log file only;
    - neither: straight to the launcher's console, unprefixed, no log file (torchrun's default).
    """
    red = to_map(redirects, nprocs)
    tees = to_map(tee, nprocs)
    shown = set(range(nprocs)) if local_ranks_filter is None else set(local_ranks_filter)
    plans: dict[int, dict[str, StreamPlan]] = {}
    for rank in range(nprocs):
        plans[rank] = {}
        for stream, flag, fname in (("out", Std.OUT, "stdout.log"), ("err", Std.ERR, "stderr.log")):
            path = os.path.join(rank_dirs[rank], fname)
            if flag in tees[rank] and rank in shown:
                plans[rank][stream] = StreamPlan("tee", path)
            elif flag in red[rank] or flag in tees[rank] or rank not in shown:
                plans[rank][stream] = StreamPlan("file", path)
            else:
                plans[rank][stream] = StreamPlan("inherit", None)
    return plans
