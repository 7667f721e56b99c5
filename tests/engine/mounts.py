"""Real mounts for fault tests: a small tmpfs (a disk that fills) and a read-only bind mount.

Mounting needs root (or CAP_SYS_ADMIN) where the kernel allows it; a test that
cannot mount is skipped with the reason printed, never silently passed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


def _umount(path: Path) -> None:
    done = subprocess.run(["umount", str(path)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:  # something still open: detach it lazily rather than leak a mount
        subprocess.run(["umount", "-l", str(path)], capture_output=True, text=True, timeout=30)


def _skip(what: str, done: subprocess.CompletedProcess[str] | None, exc: Exception | None = None) -> None:
    reason = (done.stderr.strip() if done is not None else str(exc)) or f"exit {done.returncode if done else '?'}"
    message = f"cannot {what} here ({reason}): this test needs permission to mount"
    print(f"SKIPPED: {message}")
    pytest.skip(message)


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "3m") mounted on ``path`` for the block; unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    except OSError as exc:
        _skip("mount a tmpfs", None, exc)
    if done.returncode != 0:
        _skip("mount a tmpfs", done)
    try:
        yield path
    finally:
        _umount(path)


@contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` made read-only for everyone (root included) by a read-only bind mount over itself."""
    try:
        done = _mount("--bind", str(path), str(path))
    except OSError as exc:
        _skip("bind-mount a folder", None, exc)
    if done.returncode != 0:
        _skip("bind-mount a folder", done)
    try:
        done = _mount("-o", "remount,bind,ro", str(path))
        if done.returncode != 0:
            _skip("remount a folder read-only", done)
        yield path
    finally:
        _umount(path)
