"""Everything a subject started ends with it, even what left the worker's process group.

Killing the worker's process group catches a subject's children, not a
daemon that double-forked and called ``setsid``: it lives on, reparented to
init, and may hold the run's output open (``habitrun run ... | cat`` then
waits for it). So the worker makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``): whatever its subjects start and orphan is
reparented to the worker, not to init, and the worker can find it.

After each subject the worker kills its children that left its process
group (with all they started); children still in its group (a pool an
operator keeps between subjects, say) are left alone until the worker ends.
Children that ended during the subject and were not waited for (an orphan
of ``sh -c "cmd &"`` comes to the subreaper) are reaped, so zombies do not
pile up in a long-lived worker.
When the worker ends (retired, done, told to stop, or its runner gone) it
kills every process below it, then its group. Checking costs one
``waitid`` per subject when there are no children at all.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36
REAP_WAIT_SEC = 1.0  # how long the worker waits for killed children to be reaped


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl  # noqa: B018 - its function pointer is made (and kept by the CDLL) now
        return libc
    except (OSError, AttributeError):
        return None


# Loaded once at import, which the fork server does before it forks: building a CDLL and its
# function pointers cost each isolated worker about 0.4 ms of CPU when done in the worker.
LIBC = _load_libc()


def become_subreaper() -> bool:
    """Linux: orphans below this process come to it instead of init. False where unsupported."""
    try:
        return LIBC is not None and LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def has_children() -> bool:
    """Any child, running or exited (one system call; no reaping)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return True
    except ChildProcessError:
        return False
    except OSError:
        return True


def children_of(pid: int | str) -> set[int]:
    """Direct children of ``pid`` (every thread's), from /proc."""
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            pass
    return found


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children_of(pid))
    return seen


def snapshot() -> frozenset[int]:
    """The children there are before a subject (none, in one system call, most of the time)."""
    return frozenset(children_of(os.getpid())) if has_children() else frozenset()


def after_subject(before: frozenset[int]) -> None:
    """Kill what the subject left outside our group; reap its children that ended unwaited."""
    if not has_children():
        return
    kill_below(only_strays=True)
    for pid in children_of(os.getpid()) - before:
        if _state(pid) == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "?"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def kill_below(*, only_strays: bool) -> int:
    """SIGKILL processes below this one and reap them; returns how many were killed.

    ``only_strays``: only the children that left this process's group (and all
    below them); otherwise every descendant.
    """
    if not has_children():
        return 0
    me, group = os.getpid(), os.getpgrp()
    killed: set[int] = set()
    deadline = time.monotonic() + REAP_WAIT_SEC
    while True:
        kids = children_of(me)
        if only_strays:
            kids = {pid for pid in kids if pid in killed or _pgid(pid) != group}
        if not kids:
            break
        for pid in descendants(kids) - killed:
            try:
                os.kill(pid, signal.SIGKILL)  # unreaped descendants of ours: their PIDs are still theirs
                killed.add(pid)
            except OSError:
                pass
        for pid in kids:  # reap; their orphans come to us and are found on the next round
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.001)
    return len(killed)
