"""A base fork server booted at the start of `habitrun run`, before the runner knows its policy.

Booting the workers' fork server (an interpreter importing the worker module)
takes a core about as long as the runner takes to import itself, load the
recipe and plan. Started first thing, it is ready by the time the first
worker is wanted. It is speculative: it carries the default thread caps, and
the first :class:`~habitrun.engine.process.spawner.WorkerSpawner` whose policy has
those caps adopts it (:func:`adopt`); one nobody adopted (another start method
or cap, a serial or dask run, nothing to run) is killed by :func:`discard`.
"""

from __future__ import annotations

import os
import subprocess

from habitrun.engine.process.forkserver import ForkServer
from habitrun.engine.process.threads import thread_env

DEFAULT_THREADS = 1  # RunPolicy.worker_threads' default (not imported: that costs pydantic)

# What every fork server imports before it forks anything: the worker's code (the request's
# target, which each child runs). Defined here, not in spawner.py (which imports this module).
BASE_PRELOAD = ("habitrun.engine.process.worker",)


def server_env(threads: int) -> dict[str, str]:
    """The environment a fork server (and so each of its workers) starts with: the runner's, with the caps."""
    return {**os.environ, **thread_env(threads)}

_early: tuple[tuple[str, ...], int, ForkServer] | None = None


def start(preload: tuple[str, ...] | None = None, threads: int = DEFAULT_THREADS) -> None:
    """Boot a fork server preloading ``preload`` (default: the base one) with ``threads`` caps, not waiting."""
    global _early
    discard()
    preload = BASE_PRELOAD if preload is None else preload
    server = ForkServer(preload, (), server_env(threads))
    try:
        server.start()
    except OSError:
        return  # the runner starts its own and reports why it cannot
    _early = (preload, threads, server)


def booted() -> ForkServer | None:
    """The early server, while nobody has adopted or discarded it."""
    return None if _early is None else _early[2]


def adopt(preload: tuple[str, ...], threads: int) -> ForkServer | None:
    """The early server, if it was started for exactly these preloads and caps and still runs."""
    global _early
    if _early is None or _early[:2] != (preload, threads):
        return None
    server = _early[2]
    _early = None
    if not server.alive():
        _kill(server)
        return None
    return server


def discard() -> None:
    """Kill an early server nobody adopted (it never forked a worker: nothing to let finish)."""
    global _early
    early, _early = _early, None
    if early is not None:
        _kill(early[2])


def _kill(server: ForkServer) -> None:
    try:
        server.kill()
    except (OSError, ChildProcessError, subprocess.SubprocessError):
        pass
