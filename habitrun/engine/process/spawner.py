"""Starting worker processes: forkserver (operator module preloaded), spawn or fork.

The fork server is habitrun's own (``forkserver``), one per set of preloaded
modules. Its environment carries the thread caps, so a BLAS library imported by
a preloaded module is capped too. Only modules a worker of this backend has
already imported successfully are preloaded: a module that hangs or crashes on
import would otherwise take the server down with it, outside any timeout (a
worker's import runs under ``subject_spawn_timeout_sec``).

Forkserver and spawn workers start outside the runner's process group (the
server and a spawned worker in a session of their own), so a terminal's Ctrl-C
reaches the runner alone and the runner decides how workers stop. A forked
worker leaves the group first thing (``setpgid`` in the worker).

Every start method is chosen here explicitly (Python 3.14 changed the default
on Linux to forkserver): spawn and forkserver are ours, fork is
``multiprocessing.get_context("fork")``. Each worker comes with a pidfd
obtained before it could be reaped (see ``children``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection

from habitrun.engine.process import bootstrap, early
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.children import (
    ForkedChild,
    SpawnedChild,
    WorkerProcess,
    open_own_pidfd,
)
from habitrun.engine.process.early import BASE_PRELOAD, server_env
from habitrun.engine.process.forkserver import ForkServer
from habitrun.engine.process.worker import WorkerConfig, served_worker, worker_main

__all__ = ["BASE_PRELOAD", "WorkerSpawner", "server_env", "spawn_worker"]


def spawn_worker(config: WorkerConfig, fds: Sequence[int], env: Mapping[str, str]) -> SpawnedChild:
    """A fresh interpreter running ``served_worker(fds, config)``, in a session of its own."""
    request = pickle.dumps((served_worker, (config,)))  # small: fits the pipe, so writing never blocks
    request_r, request_w = os.pipe()
    life_r, life_w = os.pipe()  # the worker holds life_w: a sentinel where there is no pidfd
    try:
        args = bootstrap.command(bootstrap.SPAWNED, str(request_r), str(life_w), json.dumps(sys.path),
                                 *map(str, fds))
        popen = subprocess.Popen(args, executable=args[0], pass_fds=(request_r, life_w, *fds),
                                 start_new_session=True, stdin=subprocess.DEVNULL, env=dict(env))
    except BaseException:
        os.close(life_r)
        os.close(request_w)
        raise
    finally:
        os.close(request_r)
        os.close(life_w)
    try:
        os.write(request_w, request)
    except BrokenPipeError:
        pass  # it died at once: its exit says why
    finally:
        os.close(request_w)
    return SpawnedChild(popen, open_own_pidfd(popen.pid), life_r)  # not waited for: still that child


class WorkerSpawner:
    """Starts workers with the policy's start method; owns the fork servers."""

    def __init__(self, start_method: str, threads: int) -> None:
        self.start_method = start_method
        self.threads = threads
        self._servers: dict[tuple[str, ...], ForkServer] = {}
        self._proven: set[tuple[str, tuple[str, ...]]] = set()
        self._fork = multiprocessing.get_context("fork") if start_method == "fork" else None

    def prove(self, module: str, search_path: Sequence[str]) -> None:
        """A worker imported ``module`` fine: later workers may get it preloaded."""
        self._proven.add((module, tuple(search_path)))

    def servers(self) -> list[ForkServer]:
        """The fork servers started so far (tests, and closing them)."""
        return list(self._servers.values())

    def warm(self) -> None:
        """Start the base fork server booting (not waiting for it); a failure shows at the first real start."""
        if self.start_method != "forkserver":
            return
        try:
            self._server(BASE_PRELOAD, ())
        except OSError:
            return  # not stored: the first real start tries again and reports why it cannot

    def start(self, config: WorkerConfig, module: str | None, search_path: Sequence[str],
              close_fds: Sequence[int], beacon: Beacon) -> tuple[WorkerProcess, Connection]:
        """Start one worker; returns the process and the runner's end of its pipe."""
        parent_end, child_end = multiprocessing.Pipe(duplex=True)
        try:
            assert beacon.fd is not None  # the runner's beacon: its memfd stays open for every start
            fds = (child_end.fileno(), beacon.fd)
            if self.start_method == "forkserver":
                proc: WorkerProcess = self._start_forkserver(config, fds, module, search_path)
            elif self.start_method == "spawn":
                config = replace(config, parent_pid=os.getpid())
                proc = spawn_worker(config, fds, server_env(self.threads))
            else:
                config = replace(config, parent_pid=os.getpid(), close_fds=(*close_fds, parent_end.fileno()))
                assert self._fork is not None
                process = self._fork.Process(target=worker_main, args=(child_end, config, beacon),
                                             name=f"habitrun-worker-{config.slot}", daemon=False)
                process.start()
                proc = ForkedChild(process)
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
            beacon.release_fd()  # the worker has its own (or its mapping)
        return proc, parent_end

    def _start_forkserver(self, config: WorkerConfig, fds: Sequence[int], module: str | None,
                          search_path: Sequence[str]) -> WorkerProcess:
        server = self._server(BASE_PRELOAD, ())
        if module and (module, tuple(search_path)) in self._proven:
            preloaded = self._server((*BASE_PRELOAD, module), tuple(search_path))
            if preloaded.ready():  # still booting: fork from the server we have, not wait for it
                server = preloaded
        config = replace(config, parent_pid=server.pid or -1)
        return server.fork(served_worker, (config,), fds)

    def _server(self, preload: tuple[str, ...], path: tuple[str, ...]) -> ForkServer:
        """The server for these preloads, started (not necessarily ready) on first use, again if it ended."""
        key = preload + path
        server = self._servers.get(key)
        if server is not None and not server.alive():
            del self._servers[key]
            server.stop()
            server = None
        if server is None and not path:
            server = early.adopt(preload, self.threads)  # booted by the CLI at its start, if it matches
            if server is not None:
                self._servers[key] = server
        if server is None:
            server = ForkServer(preload, path, server_env(self.threads))
            server.start()
            self._servers[key] = server
        return server

    def close(self) -> None:
        """Stop the fork servers (their workers are already gone)."""
        for server in self._servers.values():
            try:
                server.stop()
            except (OSError, ChildProcessError):
                pass
        self._servers.clear()
