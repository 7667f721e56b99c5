"""A private fork server in its own session, which ends quietly with the runner.

The standard library's server shares the runner's process group, so a
terminal's Ctrl-C (SIGINT to the whole foreground group) reached it and every
worker it was forking: a worker still starting died of it, and the server
printed a ``KeyboardInterrupt`` from inside its imports. Ours starts in a
session of its own (``setsid``); its workers inherit that and then lead
groups of their own, so only the runner decides how they stop.

When the runner is SIGKILLed in the middle of a fork request, the stdlib
loop dies on ``EOFError`` in ``recvfds`` with a traceback on the console;
``main`` here exits quietly instead once its parent is gone. Its lifeline is
unchanged: the runner holds the write end of the server's "alive" pipe, and
the server exits when that closes.

The server says when its preloaded imports are done (a byte on a "ready"
pipe), so the runner can keep forking from a server it already has while a
new one boots, instead of waiting most of a second for it.
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import subprocess
import sys
import time
from multiprocessing import connection, forkserver, resource_tracker, spawn, util
from typing import Any

PARENT_GONE_WAIT_SEC = 1.0  # how long an error in the server may wait to see its parent go
STOP_WAIT_SEC = 10.0  # how long the runner waits for a stopped server before killing it


def _parent_gone(parent_pid: int, alive_r: int) -> bool:
    """The runner has died (or is dying): reparented, or the alive pipe is at end-of-file."""
    deadline = time.monotonic() + PARENT_GONE_WAIT_SEC
    while True:
        if os.getppid() != parent_pid:
            return True
        try:
            if connection.wait([alive_r], 0) and os.read(alive_r, 1) == b"":
                return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def main(listener_fd: int, alive_r: int, preload: list[str], parent_pid: int = 0, ready_fd: int = -1,
         main_path: str | None = None, sys_path: list[str] | None = None) -> None:
    """The stdlib server loop; an error caused by the runner's death ends it without a word."""
    try:
        if sys_path:
            sys.path[:0] = [p for p in sys_path if p not in sys.path]
        for name in preload:  # what the stdlib loop would import first; then say we are ready
            try:
                __import__(name)
            except ImportError:
                pass
        if ready_fd >= 0:
            os.write(ready_fd, b"r")
            os.close(ready_fd)
        try:
            forkserver.main(listener_fd, alive_r, preload, main_path, sys_path)
        except SystemExit as done:  # the runner closed the alive pipe: it waits for this exit
            _exit_quickly(done.code)
    except SystemExit:
        raise
    except BaseException:
        if _parent_gone(parent_pid, alive_r):
            os._exit(0)
        raise


def _exit_quickly(code: object) -> None:
    """Exit as a normal exit would (``atexit`` handlers run, output flushed) but without the
    interpreter's teardown of every preloaded module: the runner reaps the server at the end of
    each run, and that teardown was most of the wait."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            raise SystemExit(code) from None  # let Python's shutdown report it as it always does
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


class PrivateForkServer(forkserver.ForkServer):
    """A fork server of our own: started with ``setsid`` and the quiet ``main`` above."""

    def __init__(self) -> None:
        super().__init__()
        self._popen: subprocess.Popen[bytes] | None = None
        self._ready_r: int | None = None
        self._ready = False

    def ready(self) -> bool:
        """Its preloaded imports are done. False while it boots, and for good if it died booting
        (a preloaded module that breaks the server must not stop workers from starting)."""
        if self._ready_r is None:
            return self._ready
        if connection.wait([self._ready_r], 0):
            try:
                self._ready = os.read(self._ready_r, 1) == b"r"
            except OSError:
                self._ready = False
            os.close(self._ready_r)
            self._ready_r = None
        return self._ready

    def ensure_running(self) -> None:
        with self._lock:
            resource_tracker.ensure_running()
            if self._popen is not None:
                if self._popen.poll() is None:
                    return
                self._forget()
            data: dict[str, Any] = {}
            if self._preload_modules:
                prep = spawn.get_preparation_data("ignore")
                data = {k: v for k, v in prep.items() if k in ("main_path", "sys_path")}
            with socket.socket(socket.AF_UNIX) as listener:
                address = connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                alive_r, alive_w = os.pipe()  # the runner holds alive_w: its death ends the server
                ready_r, ready_w = os.pipe()
                try:
                    cmd = (f"from habitrun.engine.process.forkserver import main; "
                           f"main({listener.fileno()}, {alive_r}, {self._preload_modules!r}, "
                           f"parent_pid={os.getpid()}, ready_fd={ready_w}, **{data!r})")
                    exe = spawn.get_executable()
                    args = [exe, *util._args_from_interpreter_flags(), "-c", cmd]
                    self._popen = subprocess.Popen(args, executable=exe,
                                                   pass_fds=(listener.fileno(), alive_r, ready_w),
                                                   start_new_session=True, close_fds=True)
                except BaseException:
                    os.close(alive_w)
                    os.close(ready_r)
                    raise
                finally:
                    os.close(alive_r)
                    os.close(ready_w)
                self._ready_r, self._ready = ready_r, False
                self._forkserver_address = address
                self._forkserver_alive_fd = alive_w
                self._forkserver_pid = self._popen.pid

    def _forget(self) -> None:
        if self._ready_r is not None:
            os.close(self._ready_r)
            self._ready_r = None
        if self._forkserver_alive_fd is not None:
            os.close(self._forkserver_alive_fd)
        address = self._forkserver_address
        if address and not util.is_abstract_socket_namespace(address):
            try:
                os.unlink(address)
            except OSError:
                pass
        self._forkserver_address = None
        self._forkserver_alive_fd = None
        self._forkserver_pid = None

    def _stop_unlocked(self) -> None:
        if self._popen is None:
            return
        popen, self._popen = self._popen, None
        alive, self._forkserver_alive_fd = self._forkserver_alive_fd, None
        if alive is not None:
            os.close(alive)  # asks the server to stop
        if not _wait_exit(popen, STOP_WAIT_SEC):
            popen.kill()
            popen.wait()
        self._forget()


def _wait_exit(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    """Reap ``popen`` once it exits, within ``timeout``; False if it has not exited by then.

    A pidfd wakes the runner the moment the server exits; ``Popen.wait(timeout=...)`` polls
    with growing sleeps, which cost a run's end 8-16 ms after the server had gone.
    """
    try:
        pidfd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):  # not Linux >= 5.3, or already reaped
        pidfd = None
    if pidfd is not None:
        try:
            select.select([pidfd], [], [], timeout)
        finally:
            os.close(pidfd)
    try:
        popen.wait(timeout=0 if pidfd is not None else timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
