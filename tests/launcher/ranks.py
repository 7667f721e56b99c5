"""Rank entrypoints for the launcher tests (module level, so they pickle under spawn)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from habitrun.launcher import record

ENV_NAMES = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS", "HABITRUN_INPUTS", "HABITRUN_WORKDIR",
)


def report_env() -> dict:
    """Return this rank's launcher variables, its pid, its process group and its cwd."""
    env = {k: os.environ.get(k) for k in ENV_NAMES}
    return {"env": env, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "cwd": os.getcwd()}


def chatter(lines: int = 2) -> int:
    rank = os.environ["RANK"]
    for i in range(lines):
        print(f"out {rank} {i}", flush=True)
        print(f"err {rank} {i}", file=sys.stderr, flush=True)
    sys.stdout.write(f"tail {rank} no newline")
    sys.stdout.flush()
    return int(rank)


def _segfault() -> None:
    ctypes.string_at(0)


def crash_one(kind: str, failing_rank: int, marker_dir: str) -> str:
    """The failing rank crashes in the way ``kind`` says; the others would sleep for a minute.

    Every rank records its pid and attempt in ``marker_dir`` so a test can see what ran.
    """
    rank = int(os.environ["RANK"])
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    Path(marker_dir, f"a{attempt}_r{rank}.pid").write_text(str(os.getpid()))
    if rank != failing_rank:
        time.sleep(60)
        return "slept"
    deadline = time.monotonic() + 30  # crash once every rank is up (a busy machine starts them slowly)
    others = [Path(marker_dir, f"a{attempt}_r{r}.pid") for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(p.exists() for p in others) and time.monotonic() < deadline:
        time.sleep(0.01)
    if kind == "exception":
        raise RuntimeError(f"rank {rank} broke on attempt {attempt}")
    if kind == "exit":
        os._exit(3)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        _segfault()
    raise AssertionError(kind)


def fail_until(marker_dir: str, good_attempt: int) -> int:
    """Rank 1 fails until TORCHELASTIC_RESTART_COUNT reaches ``good_attempt``."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    Path(marker_dir, f"a{attempt}_r{os.environ['RANK']}").write_text("ran")
    if os.environ["RANK"] == "1" and attempt < good_attempt:
        raise ValueError(f"not yet (attempt {attempt})")
    return attempt


def stubborn(marker_dir: str) -> None:
    """Ignore SIGTERM and sleep; rank 1 fails so the launcher has to stop rank 0."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = os.environ["RANK"]
    Path(marker_dir, f"r{rank}.ready").write_text(str(os.getpid()))
    if rank == "1":
        # wait until rank 0 ignores SIGTERM for sure, then fail
        deadline = time.monotonic() + 30
        while not Path(marker_dir, "r0.ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise RuntimeError("rank 1 fails")
    time.sleep(120)


def with_grandchild(marker_dir: str, seconds: float = 120) -> None:
    """Start a child process (like a data loader worker), write both pids, then sleep."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    rank = os.environ["RANK"]
    Path(marker_dir, f"r{rank}.pids").write_text(json.dumps([os.getpid(), child.pid]))
    time.sleep(seconds)


def hang(marker_dir: str) -> None:
    Path(marker_dir, f"r{os.environ['RANK']}.ready").write_text(str(os.getpid()))
    time.sleep(120)


def return_value() -> dict:
    return {"rank": int(os.environ["RANK"]), "squares": [i * i for i in range(4)]}


@record
def decorated_failure() -> None:
    raise KeyError("missing-thing")
