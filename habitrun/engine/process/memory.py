"""Per-worker memory watchdog and out-of-memory classification.

A thread in the runner samples each worker's resident memory together with
its children (a subject may start its own processes). Past
``worker_memory_limit_mb`` the worker's process group is killed at once (an
allocation spree gets no grace period) and the subject is recorded as out
of memory.

The kernel's OOM killer may act first; it sends SIGKILL. A worker that dies
by a SIGKILL we did not send counts as out of memory when any of these held
(documented rule, checked in this order):

1. the cgroup's ``oom_kill`` counter rose while the worker lived;
2. with a limit set, the last sample was at least 80 % of it;
3. the last sample was at least half of the memory the machine could give
   it then (its own RSS plus what was still available).

The watchdog samples every 0.1 s with a limit and every 0.5 s without one
(only for rule 3). It runs beside the dispatch loop, never inside it.

psutil (6-10 ms to import) is imported only where /proc cannot answer, or by
the watchdog's thread for the machine's available memory: a run shorter than
one sampling interval never imports it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

LIMIT_FRACTION = 0.8
MACHINE_FRACTION = 0.5
MB = 1024 * 1024
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_children(pid: int) -> list[int] | None:
    """Direct children from /proc/PID/task/*/children (None where the kernel lacks the file)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(x) for x in handle.read().split())
        except FileNotFoundError:
            if tid == str(pid):
                return None  # no CONFIG_PROC_CHILDREN: use psutil's full scan
        except OSError:
            continue
    return found


def _proc_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def tree_rss_fast(pid: int) -> int | None:
    """RSS bytes of ``pid`` and its descendants without scanning every process (Linux /proc).

    None when /proc cannot answer (not Linux, or no children files): the caller falls back
    to psutil. A full ``children(recursive=True)`` reads every process on the machine
    (about 2 ms with 60 processes), which the runner would pay twice a second per worker.
    """
    total = _proc_rss(pid)
    if total is None:
        return None
    stack = _proc_children(pid)
    if stack is None:
        return None
    seen = {pid}
    while stack:
        child = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        rss = _proc_rss(child)
        if rss is not None:
            total += rss
        grandchildren = _proc_children(child)
        if grandchildren:
            stack.extend(grandchildren)
    return total


class Watched:
    """What the watchdog knows of one worker; the backend reads it after the worker dies."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last_rss_mb = 0.0
        self.last_available_mb = 0.0
        self.oom_note: str | None = None
        self.cgroup_ooms_at_start = cgroup_oom_kills()
        # Where /proc lists the worker's children, it answers every sample (None: the worker is
        # gone). Elsewhere psutil does, bound to the worker now so a reused pid is never sampled.
        self._by_proc = _proc_children(pid) is not None
        self._proc: psutil.Process | None = None
        if not self._by_proc:
            import psutil

            try:
                self._proc = psutil.Process(pid)
            except psutil.Error:
                pass

    def sample(self) -> float | None:
        """Resident MB of the worker and all its descendants (None when it is gone)."""
        if self._by_proc:
            fast = tree_rss_fast(self.pid)
            return fast / MB if fast else None
        if self._proc is None:
            return None
        import psutil

        fast = tree_rss_fast(self.pid)
        if fast is not None:
            return fast / MB if fast else None
        if not self._proc.is_running():
            return None
        try:
            total = self._proc.memory_info().rss
            for child in self._proc.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            return None
        return total / MB if total else None


def cgroup_oom_kills() -> int | None:
    """The OOM-kill count of this process's cgroup (v2 or v1), or None when unreadable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            events = Path("/sys/fs/cgroup") / parts[2].lstrip("/") / "memory.events"
        elif "memory" in parts[1].split(","):
            events = Path("/sys/fs/cgroup/memory") / parts[2].lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            for row in events.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return None
    return None


def kernel_oom_note(watched: Watched, limit_mb: int | None) -> str | None:
    """A message when an unexplained SIGKILL looks like the kernel's OOM killer, else None."""
    now = cgroup_oom_kills()
    rss = watched.last_rss_mb
    if now is not None and watched.cgroup_ooms_at_start is not None and now > watched.cgroup_ooms_at_start:
        return f"out of memory: killed by the kernel's OOM killer (last seen using {rss:.0f} MB)"
    if limit_mb is not None and rss >= LIMIT_FRACTION * limit_mb:
        return (f"out of memory: worker was killed (SIGKILL) while using {rss:.0f} MB "
                f"of its {limit_mb} MB limit")
    machine = rss + watched.last_available_mb
    if rss > 0 and machine > 0 and rss >= MACHINE_FRACTION * machine:
        return (f"out of memory: worker was killed (SIGKILL) while using {rss:.0f} MB, "
                f"with {watched.last_available_mb:.0f} MB left on the machine")
    return None


class MemoryWatchdog:
    """Samples watched workers from a daemon thread; kills one that passes the limit."""

    def __init__(self, limit_mb: int | None, kill_group) -> None:
        self.limit_mb = limit_mb
        self.interval = 0.1 if limit_mb is not None else 0.5
        self._kill_group = kill_group
        self._watched: dict[int, Watched] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int) -> Watched:
        watched = Watched(pid)
        with self._lock:
            self._watched[pid] = watched
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="habitrun-memory", daemon=True)
            self._thread.start()
        return watched

    def forget(self, pid: int) -> None:
        with self._lock:
            self._watched.pop(pid, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                watched = list(self._watched.values())
            if not watched:
                continue
            import psutil  # here, in the watchdog's thread: not in a run shorter than one interval

            try:
                available = psutil.virtual_memory().available / MB
            except (psutil.Error, OSError):
                available = 0.0
            for w in watched:
                if w.oom_note is not None:
                    continue
                rss = w.sample()
                if rss is None:  # gone: keep the last real sample for the classification
                    continue
                w.last_rss_mb, w.last_available_mb = rss, available
                if self.limit_mb is not None and rss > self.limit_mb:
                    # The note first: the dispatch loop reads it once the worker's death wakes it.
                    w.oom_note = (f"out of memory: worker used {rss:.0f} MB, past its "
                                  f"worker_memory_limit_mb of {self.limit_mb}")
                    self._kill_group(w.pid)
