"""The rank watchdog kills the groups it was given pidfds of when the launcher dies, and nothing else.

"The number now belongs to someone else" is simulated without waiting for the
PIDs to wrap: the watchdog is handed an unrelated process's number (and an
unrelated leaderless group's id) with the pidfd of a process that has exited
and been reaped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from habitrun.launcher.watchdog_process import kill_group, ours
from tests.conftest import wait_gone

pytestmark = pytest.mark.timeout(60)

LAUNCHER = str(Path(__file__).with_name("watchdog_launcher.py"))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _leaderless_group() -> tuple[int, int, int]:
    """A group whose leader was reaped, one member left: (its id, the member, the member's pidfd)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    leader.stdout.close()
    member_fd = os.pidfd_open(member)  # a sleep 60 started a moment ago: the number is still its own
    leader.wait()
    return leader.pid, member, member_fd


def _reaped_pidfd() -> int:
    gone = subprocess.Popen(["true"], start_new_session=True)
    fd = os.pidfd_open(gone.pid)
    gone.wait()
    return fd


def test_ours_answers_false_without_a_pidfd_to_prove_it():
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    fd = os.pidfd_open(stranger.pid)
    try:
        assert not ours(stranger.pid, {})  # never registered
        assert not ours(stranger.pid, {stranger.pid: None})  # registered, but no pidfd came with it
        assert ours(stranger.pid, {stranger.pid: fd})
    finally:
        os.close(fd)
        stranger.kill()
        stranger.wait()


def test_a_stale_pidfd_reaches_no_process_that_took_the_number():
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    pgid, member, member_fd = _leaderless_group()
    fd = _reaped_pidfd()
    try:
        assert ours(stranger.pid, {stranger.pid: fd})  # it came with a pidfd: the pidfd decides what is hit
        assert not kill_group(fd)  # ProcessLookupError, handled: nothing was signalled
        assert _alive(stranger.pid) and _alive(member)
    finally:
        os.close(fd)
        signal.pidfd_send_signal(member_fd, signal.SIGKILL)
        os.close(member_fd)
        stranger.kill()
        stranger.wait()
    assert pgid != stranger.pid


def test_the_members_of_a_reaped_leader_are_killed_through_its_pidfd():
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    fd = os.pidfd_open(leader.pid)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    leader.stdout.close()
    leader.wait()
    try:
        assert kill_group(fd)
        assert not wait_gone([member], timeout=10)
    finally:
        os.close(fd)


def test_when_the_launcher_dies_its_groups_are_killed_and_a_recycled_number_is_spared():
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    pgid, member, member_fd = _leaderless_group()
    launcher = subprocess.Popen([sys.executable, LAUNCHER, str(stranger.pid), str(pgid)], stdout=subprocess.PIPE)
    ours_: list[int] = []
    handles: list[psutil.Process] = []
    try:
        assert launcher.stdout is not None
        pids = json.loads(launcher.stdout.readline())
        ours_ = [pids["rank"], pids["member"], pids["orphan"]]
        handles = [psutil.Process(pid) for pid in ours_]  # each with its start time, checked before a kill
        assert all(_alive(pid) for pid in ours_)
        launcher.kill()  # no "bye": the watchdog sees the launcher gone
        launcher.wait()
        assert not wait_gone([pids["watchdog"]], timeout=10), "the watchdog did not finish"
        assert not wait_gone(ours_, timeout=10), "a registered group outlived the launcher"
        assert _alive(stranger.pid), "the watchdog signalled a number that is no longer its rank's"
        assert _alive(member), "the watchdog signalled a group that took over a number"
    finally:
        launcher.kill()
        launcher.wait()
        for handle in handles:  # only if the test failed; psutil spares a process that reused the number
            try:
                handle.kill()
            except psutil.Error:
                pass
        signal.pidfd_send_signal(member_fd, signal.SIGKILL)
        os.close(member_fd)
        stranger.kill()
        stranger.wait()
