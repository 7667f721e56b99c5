"""A stand-in launcher for test_watchdog_pidfd.py: registers groups with a real watchdog, then waits to be killed.

argv: the PID of an unrelated process and the id of an unrelated group whose
leader is gone (both the test's). Registered: a running rank (a session leader
with a member), a rank already reaped whose member lives on, and, under those
two unrelated numbers, the pidfd of a process that has exited and been reaped
(what a recycled number looks like to a watchdog holding the old pidfd).
Prints the PIDs as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from habitrun.launcher.signalling import open_pidfd
from habitrun.launcher.watchdog import Watchdog


def _group(script: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def main() -> None:
    stranger, leaderless = int(sys.argv[1]), int(sys.argv[2])
    watchdog = Watchdog()
    rank, member = _group("sleep 60 & echo $!; wait")
    watchdog.watch(rank.pid, open_pidfd(rank.pid))
    ended, orphan = _group("sleep 60 & echo $!")
    watchdog.watch(ended.pid, open_pidfd(ended.pid))
    ended.wait()  # reaped: only its member still carries the group's id
    gone = subprocess.Popen(["true"], start_new_session=True)
    stale = open_pidfd(gone.pid)
    gone.wait()
    watchdog.watch(stranger, stale)
    watchdog.watch(leaderless, stale)
    print(json.dumps({"watchdog": watchdog.pid, "rank": rank.pid, "member": member, "orphan": orphan}),
          flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
