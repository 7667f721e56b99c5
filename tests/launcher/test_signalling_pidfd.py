"""A process group is signalled only through its leader's pidfd, never by a number that may be someone else's.

"The number now belongs to someone else" is simulated without waiting for the
PIDs to wrap: the function is handed the number of an unrelated process the
test started (its own session, no child of the signalled tree) together with
the pidfd of a process that has exited and been reaped.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from habitrun.errors import UnsupportedSystemError
from habitrun.launcher.signalling import (
    group_of,
    open_pidfd,
    require_pidfd,
    signal_group,
    signal_members,
)
from habitrun.launcher.watchdog import Watchdog
from tests.conftest import wait_gone

pytestmark = pytest.mark.timeout(60)


def _group_with_member(*, leader_stays: bool) -> tuple[subprocess.Popen[bytes], int, int]:
    """A session leader (``sh``) with a ``sleep`` in its group: (leader, its pidfd, the member's pid)."""
    script = "sleep 60 & echo $!; wait" if leader_stays else "sleep 60 & echo $!"
    leader = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    fd = open_pidfd(leader.pid)  # our unreaped child: the number is still its own
    assert fd is not None and leader.stdout is not None
    member = int(leader.stdout.readline())
    leader.stdout.close()
    assert group_of(member) == leader.pid
    return leader, fd, member


def _reaped_pidfd() -> int:
    """The pidfd of a process that has exited and been reaped: it refers to nothing alive."""
    gone = subprocess.Popen(["true"], start_new_session=True)
    fd = open_pidfd(gone.pid)
    assert fd is not None
    gone.wait()
    return fd


@pytest.fixture
def stranger() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """An unrelated session leader with a member of its own: (leader, the member's pid)."""
    leader, fd, member = _group_with_member(leader_stays=True)
    os.close(fd)
    try:
        yield leader, member
    finally:
        os.killpg(leader.pid, signal.SIGKILL)  # our unreaped child's group: the id is still its own
        leader.wait()


@pytest.fixture
def leaderless_stranger() -> Iterator[tuple[int, int]]:
    """An unrelated group whose leader was reaped, a member left: (the group's id, the member's pid).

    No process has the group's number as its PID, yet a group holds it: what a
    newcomer's group looks like once its own creator has exited.
    """
    leader, fd, member = _group_with_member(leader_stays=False)
    os.close(fd)
    member_fd = os.pidfd_open(member)  # a sleep 60 started a moment ago: the number is still its own
    leader.wait()
    try:
        yield leader.pid, member
    finally:
        signal.pidfd_send_signal(member_fd, signal.SIGKILL)
        os.close(member_fd)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_live_group_is_signalled_whole_through_the_leaders_pidfd():
    leader, fd, member = _group_with_member(leader_stays=True)
    try:
        assert signal_group(leader.pid, signal.SIGKILL, fd)
        assert leader.wait(timeout=10) == -signal.SIGKILL
        assert not wait_gone([member], timeout=10)
    finally:
        os.close(fd)


def test_the_members_of_a_group_whose_leader_was_reaped_are_still_reached():
    leader, fd, member = _group_with_member(leader_stays=False)
    try:
        leader.wait()  # reaped: its number is held only as the member's group id
        assert _alive(member)
        assert signal_group(leader.pid, signal.SIGKILL, fd)
        assert not wait_gone([member], timeout=10)
    finally:
        os.close(fd)


def test_a_stale_pidfd_handed_with_a_strangers_number_reaches_nothing(stranger):
    leader, member = stranger
    fd = _reaped_pidfd()
    try:
        assert not signal_group(leader.pid, signal.SIGKILL, fd)
        assert not signal_members(leader.pid, signal.SIGKILL, fd)
        assert _alive(leader.pid) and _alive(member)
    finally:
        os.close(fd)


def test_a_stale_pidfd_handed_with_the_id_of_a_leaderless_group_reaches_nothing(leaderless_stranger):
    pgid, member = leaderless_stranger
    fd = _reaped_pidfd()
    try:
        assert not signal_group(pgid, signal.SIGKILL, fd)
        assert not signal_members(pgid, signal.SIGKILL, fd)
        assert _alive(member), "a group that took over the number was signalled"
    finally:
        os.close(fd)


def test_without_a_pidfd_nothing_is_signalled_by_number(stranger):
    leader, member = stranger
    assert not signal_group(leader.pid, signal.SIGKILL, None)
    assert _alive(leader.pid) and _alive(member)


def test_before_linux_6_9_members_are_signalled_one_by_one_while_the_leader_pins_the_id():
    leader, fd, member = _group_with_member(leader_stays=True)
    try:
        assert signal_members(leader.pid, signal.SIGKILL, fd)  # the degraded mode, run on this kernel
        assert not wait_gone([member], timeout=10)
        assert leader.wait(timeout=10) == 0, "signal_members signalled the leader (it has its own pidfd)"
    finally:
        leader.kill()
        leader.wait()
        os.close(fd)


def test_before_linux_6_9_a_group_whose_leader_was_reaped_is_left_alone():
    leader, fd, member = _group_with_member(leader_stays=False)
    member_fd = os.pidfd_open(member)  # a sleep 60 started a moment ago: the number is still its own
    try:
        leader.wait()
        assert not signal_members(leader.pid, signal.SIGKILL, fd)  # nothing proves the id is still its group
        assert _alive(member)
    finally:
        signal.pidfd_send_signal(member_fd, signal.SIGKILL)
        os.close(member_fd)
        os.close(fd)


def test_a_system_without_pidfds_stops_habitrun_before_any_process_starts(monkeypatch):
    def no_pidfds(pid: int, flags: int = 0) -> int:  # the kernel's answer before Linux 5.3
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    for attempt in (require_pidfd, lambda: open_pidfd(os.getpid()), Watchdog):
        with pytest.raises(UnsupportedSystemError, match="no pidfds") as caught:
            attempt()
        assert caught.value.exit_code == 2
