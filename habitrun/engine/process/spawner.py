"""Starting worker processes: forkserver (operator module preloaded), spawn or fork.

The forkserver here is a private one per set of preloaded modules (the
standard library's is process-global and takes its preload list only once).
Its environment carries the thread caps, so a BLAS library imported by a
preloaded module is capped too. Only modules a worker of this backend has
already imported successfully are preloaded: a module that hangs or
crashes on import would otherwise take the server down with it, outside
any timeout (a worker's import runs under ``subject_spawn_timeout_sec``).

Forkserver and spawn workers start outside the runner's process group (the
server and a spawned worker in a session of their own), so a terminal's
Ctrl-C reaches the runner alone and the runner decides how workers stop. A
forked worker leaves the group first thing (``setpgid`` in the worker).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing import forkserver, popen_forkserver, popen_spawn_posix, reduction, spawn, util
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerProcess, set_spawning_popen
from multiprocessing.process import BaseProcess

from habitrun.engine.process import early
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.forkserver import PrivateForkServer
from habitrun.engine.process.threads import thread_env
from habitrun.engine.process.worker import WorkerConfig, worker_main

# What every fork server imports before it forks anything: the worker's code, and this module,
# whose process class each child unpickles (importing it in every child costs an isolated
# worker milliseconds per subject).
BASE_PRELOAD = ("habitrun.engine.process.worker", __name__)
_launching = threading.local()
_environ_lock = threading.Lock()


class _PrivatePopen(popen_forkserver.Popen):
    """The stdlib forkserver Popen, asking our private server instead of the global one."""

    def _launch(self, process_obj: BaseProcess) -> None:
        server: forkserver.ForkServer = _launching.server
        prep_data = spawn.get_preparation_data(process_obj._name)
        # Workers import operators by path; re-running the runner's __main__ in each
        # would cost time and run a script's unguarded top-level code again.
        for key in ("init_main_from_path", "init_main_from_name"):
            prep_data.pop(key, None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = server.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def _spawn_in_new_session(path: str, args: list[str], passfds: Sequence[int]) -> int:
    """``util.spawnv_passfds`` with ``setsid``: the child never shares the runner's group."""
    made = []
    try:
        for fd in passfds:
            if not os.get_inheritable(fd):
                os.set_inheritable(fd, True)
                made.append(fd)
        return os.posix_spawn(path, args, os.environ, setsid=True)
    finally:
        for fd in made:
            os.set_inheritable(fd, False)


class _SessionSpawnPopen(popen_spawn_posix.Popen):
    """The stdlib spawn Popen, starting the child in a session of its own."""

    def _launch(self, process_obj: BaseProcess) -> None:
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = _spawn_in_new_session(spawn.get_executable(), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class _SessionSpawnProcess(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _SessionSpawnPopen:
        return _SessionSpawnPopen(process_obj)


class _PrivateServerProcess(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _PrivatePopen:
        return _PrivatePopen(process_obj)


@contextmanager
def _server_environment(threads: int, search_path: Sequence[str]) -> Iterator[None]:
    """The runner's environment and sys.path as the new server should inherit them."""
    with _environ_lock:
        saved_env = {k: os.environ.get(k) for k in thread_env(threads)}
        saved_path = list(sys.path)
        os.environ.update(thread_env(threads))
        sys.path[:0] = [p for p in search_path if p not in sys.path]
        try:
            yield
        finally:
            sys.path[:] = saved_path
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class WorkerSpawner:
    """Starts workers with the policy's start method; owns the private forkservers."""

    def __init__(self, start_method: str, threads: int) -> None:
        self.start_method = start_method
        self.threads = threads
        self._servers: dict[tuple[str, ...], PrivateForkServer] = {}
        self._proven: set[tuple[str, tuple[str, ...]]] = set()
        self._ctx = None if start_method == "forkserver" else multiprocessing.get_context(start_method)

    def prove(self, module: str, search_path: Sequence[str]) -> None:
        """A worker imported ``module`` fine: later workers may get it preloaded."""
        self._proven.add((module, tuple(search_path)))

    def warm(self) -> None:
        """Start the base fork server booting (not waiting for it); a failure shows at the first real start."""
        if self._ctx is not None:
            return
        try:
            self._server(BASE_PRELOAD, ())
        except OSError:
            return  # not stored: the first real start tries again and reports why it cannot

    def start(self, config: WorkerConfig, module: str | None, search_path: Sequence[str],
              close_fds: Sequence[int], beacon: Beacon) -> tuple[BaseProcess, Connection]:
        """Start one worker; returns the process and the runner's end of its pipe."""
        parent_end, child_end = multiprocessing.Pipe(duplex=True)
        try:
            if self._ctx is None:
                proc = self._start_forkserver(config, child_end, beacon, module, search_path)
            else:
                config = replace(config, parent_pid=os.getpid())
                if self.start_method == "fork":
                    config = replace(config, close_fds=(*close_fds, parent_end.fileno()))
                process_class = _SessionSpawnProcess if self.start_method == "spawn" else self._ctx.Process
                proc = process_class(target=worker_main, args=(child_end, config, beacon),
                                     name=f"habitrun-worker-{config.slot}", daemon=False)
                proc.start()
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        return proc, parent_end

    def _start_forkserver(self, config: WorkerConfig, child_end: Connection, beacon: Beacon,
                          module: str | None, search_path: Sequence[str]) -> BaseProcess:
        server = self._server(BASE_PRELOAD, ())
        if module and (module, tuple(search_path)) in self._proven:
            preloaded = self._server((*BASE_PRELOAD, module), tuple(search_path))
            if preloaded.ready():  # still booting: fork from the server we have, not wait for it
                server = preloaded
        config = replace(config, parent_pid=server._forkserver_pid or -1)
        proc = _PrivateServerProcess(target=worker_main, args=(child_end, config, beacon),
                                     name=f"habitrun-worker-{config.slot}")
        _launching.server = server
        try:
            proc.start()
        finally:
            _launching.server = None
        return proc

    def _server(self, preload: tuple[str, ...], path: tuple[str, ...]) -> PrivateForkServer:
        """The server for these preloads, started (not necessarily ready) on first use."""
        server = self._servers.get(preload + path)
        if server is None and not path:
            server = early.adopt(preload, self.threads)  # booted by the CLI at its start, if it matches
            if server is not None:
                self._servers[preload] = server
        if server is None:
            server = PrivateForkServer()
            server.set_forkserver_preload(list(preload))
            with _server_environment(self.threads, path):
                server.ensure_running()
            self._servers[preload + path] = server
        return server

    def close(self) -> None:
        """Stop the private forkservers (their workers are already gone)."""
        for server in self._servers.values():
            try:
                server._stop()
            except (OSError, ChildProcessError):
                pass
        self._servers.clear()
