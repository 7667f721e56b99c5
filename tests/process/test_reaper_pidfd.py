"""``kill_below`` signals only processes it proved its own after opening their pidfds, and only through them.

Run in a stand-in worker (``reaper_tree.py``, a child subreaper): killing
below the test process itself would hit the test session's own helpers.
"The number now belongs to someone else" is simulated without waiting for the
PIDs to wrap: the tree is handed an unrelated process the test started (its
own session, no descendant of the stand-in worker).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone

pytestmark = pytest.mark.timeout(60)

TREE = str(Path(__file__).with_name("reaper_tree.py"))


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, TREE, *args], capture_output=True, text=True, timeout=40)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_strays_and_their_children_are_killed_and_a_child_in_our_group_is_kept_until_the_end():
    got = _run("strays")
    assert got["first"] == 3, got  # the stray, its child, the daemon
    assert got["after_first"] == {"pool": True, "strays": []}
    assert got["second"] == 1 and not got["pool_after"]
    assert not wait_gone(got["pids"], timeout=5)


def test_a_number_taken_by_someone_else_is_neither_proven_ours_nor_signalled():
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        got = _run("proof", str(stranger.pid))
        assert got["proven"] == got["expected"]  # the child and grandchild, before the grandchild ended
        assert got["not_ours"] == [None, None]  # its parent is neither our child nor us
        assert got["killed"] == [got["parent"]]  # the grandchild's stale pidfd reached nothing
        assert got["stranger_alive"] and _alive(stranger.pid)
        assert not wait_gone([got["parent"]], timeout=5)
    finally:
        stranger.kill()
        stranger.wait()
