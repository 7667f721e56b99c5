"""The launcher never signals the process group of a PID that was recycled after its rank was reaped."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from habitrun.launcher import start_processes


def _take_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """Start ``setsid sleep 60`` on exactly ``pid`` (root: ns_last_pid); None if another process won it."""
    for _ in range(200):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(["setsid", "sleep", "60"])
        if proc.pid == pid:
            deadline = time.monotonic() + 5
            while os.getpgid(pid) != pid and time.monotonic() < deadline:
                time.sleep(0.005)  # until setsid(1) has made its session
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.timeout(60)
def test_closing_a_group_whose_rank_was_reaped_spares_the_process_now_on_its_pid(tmp_path):
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to choose the next PID (/proc/sys/kernel/ns_last_pid); "
                    "without it a PID cannot be made to recycle on purpose")
    ctx = start_processes("t", ["true"], {0: ()}, {0: dict(os.environ)}, str(tmp_path / "logs"), grace=1)
    handle = ctx._handles[0]
    deadline = time.monotonic() + 20
    while handle.poll() is None and time.monotonic() < deadline:  # exits, and is reaped
        time.sleep(0.01)
    assert handle.poll() == 0
    squatter = _take_pid(handle.pid)
    if squatter is None:
        ctx.close()
        pytest.skip(f"another process took PID {handle.pid} first (a busy machine); nothing to test")
    try:
        ctx.close()  # kills "leftover children" of ranks that exited: never through a recycled PID
        time.sleep(0.2)
        assert squatter.poll() is None, "the launcher signalled a recycled PID's process group"
    finally:
        squatter.kill()
        squatter.wait()
