"""How much memory the process backend's workers may use at once: ``memory_budget_mb``, or 'auto'.

'auto' is ``AUTO_FRACTION`` of what the run may use, less what the runner
(and its fork server) already hold: the memory limit of the run's cgroup
when there is one (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the
smallest of the cgroup and its parents), else the machine's MemAvailable.
The rest is headroom for the runner's own growth and the page cache.
"""

from __future__ import annotations

import os
from pathlib import Path

from habitrun.engine.process.memory import MB, tree_rss_fast

AUTO_FRACTION = 0.85
NO_LIMIT = 1 << 60  # a cgroup v1 "limit" this large (9223372036854771712) means none


def _own_cgroup_dirs() -> list[Path]:
    """The memory cgroup folder of this process and its parents, innermost first (v2 or v1)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            base = Path("/sys/fs/cgroup/memory")
        elif parts[0] == "0" and parts[1] == "":
            base = Path("/sys/fs/cgroup")
        else:
            continue
        rel = Path(parts[2].lstrip("/"))
        dirs = [base / rel]
        while rel != Path("."):
            rel = rel.parent
            dirs.append(base / rel)
        if base.name == "memory" or (base / rel / "cgroup.controllers").exists():
            return dirs
    return []


def cgroup_limit_mb() -> float | None:
    """The memory limit of the cgroup this process runs in (the smallest up its tree), or None."""
    limits: list[int] = []
    for folder in _own_cgroup_dirs():
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                text = (folder / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < NO_LIMIT:
                limits.append(int(text))
    return min(limits) / MB if limits else None


def mem_available_mb() -> float | None:
    """MemAvailable of /proc/meminfo in MB (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_mb() -> tuple[float | None, str]:
    """What the run may use and where that number comes from ("cgroup limit" or "MemAvailable")."""
    limit = cgroup_limit_mb()
    if limit is not None:
        return limit, "cgroup limit"
    return mem_available_mb(), "MemAvailable"


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
