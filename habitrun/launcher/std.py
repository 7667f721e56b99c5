"""Which standard streams of a rank go where: ``none`` / ``out`` / ``err`` / ``all``, or a map by rank.

The recipe writes the torchrun words as strings; the launcher works with flags so
``redirects | tee`` and ``stream in mode`` read naturally.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def to_map(spec: Std | str | Mapping[int, Std | str] | None, nprocs: int) -> dict[int, Std]:
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
