"""The launcher's log folders: made fresh, never emptied (what is in them may not be ours)."""

from __future__ import annotations

import os

from habitrun.errors import LaunchError


def claim_log_dir(path: str) -> None:
    """Create ``path`` for one rank group; refuse it if it already holds anything.

    The launcher never deletes a folder it is given: a non-empty one may hold
    the user's files or an earlier run's logs.
    """
    os.makedirs(path, exist_ok=True)
    if any(os.scandir(path)):
        raise LaunchError(f"log folder {path} is not empty; give each rank group a fresh folder "
                          "(the launcher never deletes files it did not create)")


def check_attempt_dirs(root: str, attempts: int) -> None:
    """Refuse a launch whose ``attempt_<n>`` folders under ``root`` already hold anything."""
    for attempt in range(attempts):
        path = os.path.join(root, f"attempt_{attempt}")
        if os.path.isdir(path) and any(os.scandir(path)):
            raise LaunchError(f"log folder {root} already holds {path} (an earlier launch?); "
                              "launch into a fresh log_dir (the launcher never deletes files it did not create)")
