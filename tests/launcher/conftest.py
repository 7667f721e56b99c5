"""Shared helpers of the launcher tests."""

from __future__ import annotations

import importlib.util
import threading

import psutil
import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed (pip install 'habitrun[train]')")


def is_alive(pid: int) -> bool:
    """True for a running (non-zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Console:
    """Collects the launcher's console lines (thread-safe)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture(scope="session", autouse=True)
def multiprocessing_helpers_started():
    """Spawn and forkserver start a per-process helper (resource tracker, fork server) on first use.

    They live as long as the test process, by design; start them before any
    test's no-leftover check takes its "before" snapshot.
    """
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    forkserver.ensure_running()
    yield
