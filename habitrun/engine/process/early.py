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

import subprocess

from habitrun.engine.process.forkserver import PrivateForkServer

DEFAULT_THREADS = 1  # RunPolicy.worker_threads' default (not imported: that costs pydantic)

_early: tuple[tuple[str, ...], int, PrivateForkServer] | None = None


def start(preload: tuple[str, ...] | None = None, threads: int = DEFAULT_THREADS) -> None:
    """Boot a fork server preloading ``preload`` (default: the base one) with ``threads`` caps, not waiting."""
    from habitrun.engine.process.spawner import BASE_PRELOAD, _server_environment

    global _early
    discard()
    preload = BASE_PRELOAD if preload is None else preload
    server = PrivateForkServer()
    server.set_forkserver_preload(list(preload))
    try:
        with _server_environment(threads, ()):
            server.ensure_running()
    except OSError:
        return  # the runner starts its own and reports why it cannot
    _early = (preload, threads, server)


def adopt(preload: tuple[str, ...], threads: int) -> PrivateForkServer | None:
    """The early server, if it was started for exactly these preloads and caps and still runs."""
    global _early
    if _early is None or _early[:2] != (preload, threads):
        return None
    server = _early[2]
    _early = None
    popen = server._popen
    if popen is None or popen.poll() is not None:
        _kill(server)
        return None
    return server


def discard() -> None:
    """Kill an early server nobody adopted (it never forked a worker: nothing to let finish)."""
    global _early
    early, _early = _early, None
    if early is not None:
        _kill(early[2])


def _kill(server: PrivateForkServer) -> None:
    popen = server._popen
    if popen is not None and popen.poll() is None:
        popen.kill()
    try:
        server._stop()
    except (OSError, ChildProcessError, subprocess.SubprocessError):
        pass
