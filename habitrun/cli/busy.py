"""Who is using a study's store right now, and what a runner killed before its run folder left behind.

Read without taking the store lock: `plan` and `status` must never keep a run from
starting. The lock file names its holder while it is held and is emptied when it is
released, so a holder named in it whose process is gone was killed holding it.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from habitrun.spec.loader import LoadedRecipe

RUN_COMMANDS = ("run", "resume")


def lock_file(loaded: LoadedRecipe) -> Path:
    """The study's store lock (store.lock's ``default_lock_path``, without importing it: see below)."""
    store_dir = loaded.store_dir()
    return store_dir.parent / f"{store_dir.name}.lock"


def store_user(loaded: LoadedRecipe) -> dict[str, Any] | None:
    """The live holder of the study's store lock (pid, host, since, command), or None.

    A lock nobody holds is empty: then one ``stat`` answers, and `plan` imports no lock code.
    """
    path = lock_file(loaded)
    try:
        if not os.stat(path).st_size:
            return None
    except OSError:
        return None
    from habitrun.store.lock import live_holder

    return live_holder(path)


def is_run(holder: dict[str, Any]) -> bool:
    """Whether the holder is a `run` or a `resume` (`gc --yes` takes the lock too)."""
    words = str(holder.get("command") or "").split()
    return len(words) > 1 and words[1] in RUN_COMMANDS


def in_progress_text(holder: dict[str, Any]) -> str:
    """"a run is in progress (pid 812, started 2026-...: `habitrun run recipe.yaml`)"."""
    what = "a run is in progress" if is_run(holder) else "the store is in use"
    where = "" if holder.get("host") == socket.gethostname() else f" on {holder.get('host')}"
    command = f": `{holder['command']}`" if holder.get("command") else ""
    return f"{what} (pid {holder.get('pid')}{where}, started {holder.get('since', '?')}{command})"


def killed_before_folder(loaded: LoadedRecipe) -> str | None:
    """What says a run was started and stopped before its run folder existed (None: nothing does).

    Strongest first: a lock whose holder died holding it (a kill; a clean end empties it), a
    half-made run folder, then the lock file a command made (every `run` makes it first: a run
    that stopped before its folder, or found nothing to do).
    """
    from habitrun.store.lock import holder_alive, read_holder
    from habitrun.store.runs import INCOMPLETE_PREFIX, RUNS

    lock = lock_file(loaded)
    holder = read_holder(lock)
    if holder is not None and holder_alive(holder) is False and is_run(holder):
        return (f"`{holder.get('command')}` (pid {holder.get('pid')}, started {holder.get('since', '?')}) "
                f"died holding the store lock ({lock}) before it made a run folder (it was killed)")
    runs = loaded.run_root() / RUNS
    try:
        drafts = sorted(p.name for p in runs.iterdir() if p.name.startswith(INCOMPLETE_PREFIX))
    except OSError:
        drafts = []
    if drafts:
        return f"a runner was killed while making its run folder ({runs / drafts[-1]} is left half-made)"
    try:
        when = datetime.fromtimestamp(lock.stat().st_mtime).astimezone().isoformat(timespec="seconds")
    except OSError:
        return None
    return (f"a habitrun command locked this study's store ({lock}, last at {when}): a run started then "
            "was stopped before it made a run folder, or found nothing to do")
