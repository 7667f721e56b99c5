"""How much memory the process backend's workers may use at once: ``memory_budget_mb``, or 'auto'.

'auto' is ``AUTO_FRACTION`` of what the run may use, less what the runner
(and its fork server) already hold: the memory limit of the run's cgroup
when there is one (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the
smallest of the cgroup and its parents), else the machine's MemAvailable.
The rest is headroom for the runner's own growth and the page cache.
"""

from __future__ import annotations

import os

from habitrun.engine.process.memory import MB, tree_rss_fast
from habitrun.planner.memory_budget import AUTO_FRACTION, available_mb


def resolve_budget(setting: int | str | None) -> tuple[float | None, str]:
    """The budget in MB for a ``memory_budget_mb`` setting, and how it was found (for status and the report)."""
    if setting is None:
        return None, "none"
    if setting != "auto":
        return float(setting), "memory_budget_mb"
    total, source = available_mb()
    if total is None:
        return None, "auto: no cgroup limit nor MemAvailable to take a fraction of"
    if source == "cgroup limit":
        own = (tree_rss_fast(os.getpid()) or 0) / MB  # the runner and its fork server count against the limit
        return max(1.0, AUTO_FRACTION * total - own), f"auto: {AUTO_FRACTION:.0%} of the {source} {total:.0f} MB, " \
                                                       f"less the runner's {own:.0f} MB"
    return max(1.0, AUTO_FRACTION * total), f"auto: {AUTO_FRACTION:.0%} of {source} {total:.0f} MB"
