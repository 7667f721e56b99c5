"""How much memory a run may use: the memory limit of its cgroup, else the machine's MemAvailable.

The machine's side of a memory budget (``memory_budget_mb: auto``), read without the engine so that
``plan`` and ``status`` can show a budget without importing it; the process backend
(engine/process/budget.py) takes the runner's own memory off it when a run starts.
"""

from __future__ import annotations

from pathlib import Path

MB = 1024 * 1024
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


def plan_budget(setting: int | str | None) -> tuple[float | None, str]:
    """The budget ``plan`` shows for a setting (before a run: nothing of the runner's own to take off)."""
    if setting is None:
        return None, "none"
    if setting != "auto":
        return float(setting), "memory_budget_mb"
    total, source = available_mb()
    if total is None:
        return None, "auto: no cgroup limit nor MemAvailable to take a fraction of"
    return max(1.0, AUTO_FRACTION * total), f"auto: {AUTO_FRACTION:.0%} of the {source} {total:.0f} MB"
