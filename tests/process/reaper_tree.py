"""A stand-in worker for test_reaper_pidfd.py: a child subreaper that builds a process tree and reaps it.

``strays``: a child kept in our group, a stray (its own session, with a child)
and a daemon (double-forked, reparented to us); ``kill_below(only_strays=True)``
then ``kill_below(only_strays=False)``.

``proof STRANGER``: a child with a grandchild that ends (and is reaped by its
parent) after the tree was scanned and before it is killed; STRANGER, the test's unrelated process,
stands for whoever took the grandchild's number.

Prints what happened as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from habitrun.engine.process.reaper import Below, become_subreaper, kill_below


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _started(argv: list[str], **kw: bool) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, **kw)  # noqa: S603 - our own argv
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def strays() -> dict[str, object]:
    pool = subprocess.Popen(["sleep", "60"])  # stays in our group, like an operator's pool
    stray, stray_child = _started(["sh", "-c", "sleep 60 & echo $!; wait"], start_new_session=True)
    launcher, daemon = _started(["sh", "-c", "setsid sleep 60 & echo $!"])
    launcher.wait()
    deadline = time.monotonic() + 10
    while (_parent(daemon) != os.getpid() or os.getpgid(daemon) != daemon) and time.monotonic() < deadline:
        time.sleep(0.005)  # its parent is gone: it comes to us, the subreaper; and its setsid has run
    tree = [stray.pid, stray_child, daemon]
    first = kill_below(only_strays=True)
    after_first = {"pool": _alive(pool.pid), "strays": [pid for pid in tree if _alive(pid)]}
    second = kill_below(only_strays=False)
    return {"first": first, "after_first": after_first, "second": second, "pool_after": _alive(pool.pid),
            "pids": [pool.pid, *tree]}


def proof(stranger: int) -> dict[str, object]:
    parent, grandchild = _started(["sh", "-c", "sleep 60 & echo $!; wait; exec sleep 60"],
                                  start_new_session=True)
    tree = Below()
    tree.scan()
    proven = sorted(tree.fds)
    not_ours = [tree.prove(stranger, parent.pid), tree.prove(stranger, os.getpid())]
    signal.pidfd_send_signal(tree.fds[grandchild], signal.SIGTERM)  # it ends after the scan...
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
        time.sleep(0.01)  # ...and its parent reaps it: its number is free
    tree.fds[stranger] = tree.fds.pop(grandchild)  # the number now someone else's, the pidfd the old process's
    killed: dict[int, int] = {}
    tree.kill(killed)
    result = {"proven": proven, "expected": sorted([parent.pid, grandchild]), "not_ours": not_ours,
              "killed": sorted(killed), "parent": parent.pid, "stranger_alive": _alive(stranger)}
    tree.close(keep=())
    kill_below(only_strays=False)
    return result


def main() -> None:
    if not become_subreaper():
        raise SystemExit("cannot become a child subreaper")
    result = strays() if sys.argv[1] == "strays" else proof(int(sys.argv[2]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
