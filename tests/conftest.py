"""Fixtures shared by every test: no test may leave a process behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest


def _descendants() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process(os.getpid()).children(recursive=True)}
    except psutil.Error:
        return {}


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """PIDs still alive (not zombies) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        still = []
        for pid in alive:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(pid)
            except psutil.NoSuchProcess:
                pass
        alive = still
        if alive:
            time.sleep(0.05)
    return alive


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker_started_early() -> None:
    """multiprocessing's resource tracker lives as long as the session; start it before any
    test so the no-leftover check does not blame the first test that uses a start method."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def fail_on_leftovers(before: set[int], timeout: float = 10.0) -> None:
    """Fail (after killing them) if processes started since ``before`` outlive ``timeout``."""
    started = [pid for pid in _descendants() if pid not in before]
    leftover = wait_gone(started, timeout=timeout)
    if not leftover:
        return
    details = []
    for pid in leftover:
        try:
            details.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:160]}")
        except psutil.Error:
            pass
    for pid in leftover:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    if details:
        pytest.fail("test left processes behind: " + "; ".join(details))


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Every process a test starts must be gone when it ends."""
    before = set(_descendants())
    yield
    fail_on_leftovers(before)


@pytest.fixture(scope="session")
def slurm() -> None:
    """A real one-node SLURM (tests/cluster/slurm_up.sh), started once per session if not running.

    Skips, with the reason, only where it cannot run at all (not root, no apt, daemons fail).
    """
    from tests.cluster.slurm import why_not_available

    reason = why_not_available()
    if reason is not None:
        pytest.skip(f"no SLURM here: {reason}")
