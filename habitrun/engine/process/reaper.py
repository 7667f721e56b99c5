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
from collections.abc import Callable, Collection

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
    stat = _stat(pid)
    return stat[0] if stat else "?"


def _stat(pid: int | str) -> tuple[str, int, int] | None:
    """State, parent and process group of ``pid`` (/proc/<pid>/stat fields 3 to 5), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _unreaped(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
        return True
    except OSError:
        return False


class Below:
    """The processes below this one that :func:`kill_below` wants, each proven ours and held by a pidfd."""

    def __init__(self, wanted: Callable[[int, int], bool] = lambda pid, group: True) -> None:
        self.me = os.getpid()
        self.wanted = wanted  # (child of ours, its group) -> whether it and all below it are wanted
        self.fds: dict[int, int] = {}  # pid -> its pidfd, opened before it was proven ours
        self.kids: set[int] = set()  # our own children among them

    def scan(self) -> None:
        """Walk down from our wanted children, proving each process ours before going below it."""
        todo = [(pid, self.me) for pid in children_of(self.me)]
        while todo:
            pid, parent = todo.pop()
            if pid in self.fds or (parent == self.me and not self._may_want(pid)):
                continue
            group = self.prove(pid, parent)
            if group is None:
                continue
            if parent == self.me:
                if not self.wanted(pid, group):
                    os.close(self.fds.pop(pid))
                    continue
                self.kids.add(pid)
            todo.extend((child, pid) for child in children_of(pid))

    def _may_want(self, pid: int) -> bool:
        """A first look at a child's group (one system call, no pidfd): what decides comes after the open."""
        try:
            return self.wanted(pid, os.getpgid(pid))
        except OSError:
            return False

    def prove(self, pid: int, parent: int) -> int | None:
        """Open ``pid``'s pidfd, THEN read its parent: its group if that is us or a proven process.

        The read is ``pid``'s own if its pidfd shows it unreaped after the read;
        the parent it names is the proven one if that one's pidfd, too, shows it
        unreaped after the read (a PID cannot be reused before its process is reaped).
        """
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already (or no pidfds: then nothing is ever signalled)
            return None
        stat = _stat(pid)
        if (stat is not None and stat[1] == parent and _unreaped(fd)
                and (parent == self.me or _unreaped(self.fds[parent]))):
            self.fds[pid] = fd
            return stat[2]
        os.close(fd)
        return None

    def kill(self, killed: dict[int, int]) -> None:
        """SIGKILL each process held through its pidfd, recording it in ``killed`` (pid: pidfd).

        One reaped since it was proven is skipped (its pidfd reaches nothing,
        whoever holds its number now); one in ``killed`` still unreaped is the
        same process, killed already.
        """
        for pid, fd in self.fds.items():
            if pid in killed and _unreaped(killed[pid]):
                continue
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:  # ProcessLookupError: reaped since it was proven
                continue
            if pid in killed:
                os.close(killed[pid])
            killed[pid] = fd

    def close(self, keep: Collection[int]) -> None:
        """Close every pidfd but those in ``keep`` (the caller holds them now)."""
        for fd in self.fds.values():
            if fd not in keep:
                os.close(fd)


def kill_below(*, only_strays: bool) -> int:
    """SIGKILL processes below this one and reap them; returns how many were killed.

    ``only_strays``: only the children that left this process's group (and all
    below them); otherwise every descendant.

    Never by number: a /proc scan names a PID that may be reaped and reused by
    the time it is signalled (a subject's process reaps its own children
    whenever it likes; an operator's thread may reap ours). Each candidate's
    pidfd is opened first, then it is proven ours (its parent, read after the
    open, is us or a process already proven, both still unreaped after that
    read), and it is signalled through that pidfd. No process group is
    signalled: a stray's group may have no process of ours left in it.
    """
    if not has_children():
        return 0
    group = os.getpgrp()
    killed: dict[int, int] = {}  # pid -> pidfd of each process killed, kept open: its identity

    def same(pid: int) -> bool:  # the number still names the process we killed
        return pid in killed and _unreaped(killed[pid])

    def wanted(pid: int, its_group: int) -> bool:
        return not only_strays or its_group != group or same(pid)

    deadline = time.monotonic() + REAP_WAIT_SEC
    try:
        while True:
            tree = Below(wanted)
            tree.scan()
            tree.kill(killed)
            tree.close(keep=set(killed.values()))
            for pid in tree.kids & killed.keys():  # reap; their orphans come to us, found next round
                _reap(killed[pid], pid)
            if not tree.kids or time.monotonic() > deadline:
                break
            time.sleep(0.001)
    finally:
        for fd in killed.values():
            os.close(fd)
    return len(killed)


def _reap(pidfd: int, pid: int) -> None:
    """Reap our child behind ``pidfd`` if it has ended (by its number only before Linux 5.4)."""
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:  # EINVAL: no P_PIDFD (Linux 5.3)
        if _unreaped(pidfd):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
