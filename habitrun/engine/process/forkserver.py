"""habitrun's own fork server: an interpreter that imports the workers' code once, then forks a worker per request.

Built on public ground only (``os.fork``, ``socket.send_fds``/``recv_fds`` over
an AF_UNIX socket pair, ``os.pidfd_open``), not on multiprocessing's server.

- **Its own session** (``setsid``): a terminal's Ctrl-C (SIGINT to the foreground
  group) reaches the runner alone, never the server or a worker it is forking.
- **One socket pair** is the whole link: the runner sends a request (a pickled
  ``(target, args)`` and the descriptors the child needs); the server forks,
  opens a pidfd for the child at once (before it can reap it: only its own loop
  reaps, later) and answers with the PID, that pidfd and the read end of a pipe
  on which it writes the child's exit code when it reaps it. The runner's end
  closing (its exit, or its death by SIGKILL) ends the server quietly.
- **Ready**: the server writes a byte on a "ready" pipe once its preloaded
  imports are done, so the runner can keep forking from a server it already has
  while a new one boots.
- **A quick exit**: at its first line the server registers an ``atexit``
  handler that ends the process with ``os._exit``; handlers run last in, first
  out (documented), so every handler its preloaded modules registered runs
  first, and then the interpreter's teardown of those modules is skipped.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from habitrun.engine.process import bootstrap
from habitrun.engine.process.children import STATUS, ServedChild, open_own_pidfd, readable

SERVE = "from habitrun.engine.process.forkserver import serve; serve()"
STOP_WAIT_SEC = 10.0  # how long the runner waits for a stopped server before killing it
MAX_REQUEST = 1 << 16  # a request is a pickled (target, args): a worker's is well under a kilobyte
MAX_FDS = 16
REPLY = struct.Struct("q")  # the child's PID, or -1 followed by why it could not be forked

_exit_status = 1  # what the server's last atexit handler exits with; 0 once it ends as asked


class ForkServerGone(OSError):
    """The fork server has ended (or cannot be reached): it forks nothing more."""


# ---------------------------------------------------------------------------- the runner's side
class ForkServer:
    """A fork server preloading ``preload`` (importable through ``search_path`` and the runner's path)."""

    def __init__(self, preload: Sequence[str], search_path: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> None:
        self.preload = tuple(preload)
        self.search_path = tuple(search_path)
        self.env = dict(os.environ if env is None else env)
        self.popen: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None  # the runner's end of the socket pair
        self._ready_r: int | None = None
        self._ready = False
        self._lock = threading.Lock()  # one request and its answer at a time

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def start(self) -> None:
        """Start the server (not waiting for its imports); raises OSError when it cannot start."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ready_r, ready_w = os.pipe()
        try:
            args = bootstrap.command(SERVE, str(theirs.fileno()), str(ready_w), json.dumps(self.preload),
                                     json.dumps([*self.search_path, *sys.path]))
            self.popen = subprocess.Popen(args, executable=args[0], pass_fds=(theirs.fileno(), ready_w),
                                          start_new_session=True, stdin=subprocess.DEVNULL, env=self.env)
        except BaseException:
            mine.close()
            os.close(ready_r)
            raise
        finally:
            theirs.close()
            os.close(ready_w)
        self.control, self._ready_r, self._ready = mine, ready_r, False

    def alive(self) -> bool:
        """It has been started and has not ended."""
        return self.popen is not None and self.popen.poll() is None and self.control is not None

    def ready(self) -> bool:
        """Its preloaded imports are done. False while it boots, and for good if it died booting
        (a preloaded module that breaks the server must not stop workers from starting)."""
        if self._ready_r is None:
            return self._ready
        if readable(self._ready_r, 0):
            try:
                self._ready = os.read(self._ready_r, 1) == b"r"
            except OSError:
                self._ready = False
            os.close(self._ready_r)
            self._ready_r = None
        return self._ready

    def fork(self, target: Callable[..., Any], args: tuple[Any, ...], fds: Sequence[int]) -> ServedChild:
        """A child running ``target(fds, *args)`` (with its own copies of ``fds``); raises OSError if none."""
        payload = pickle.dumps((target, args))
        with self._lock:
            control = self.control
            if control is None:
                raise ForkServerGone("the fork server is stopped")
            try:
                socket.send_fds(control, [payload], list(fds))
                reply, got, _, _ = socket.recv_fds(control, 4096, 2)
            except OSError as exc:
                raise ForkServerGone(f"the fork server (pid {self.pid}) is gone: {exc}") from None
        if len(reply) < REPLY.size:
            for fd in got:
                os.close(fd)
            raise ForkServerGone(f"the fork server (pid {self.pid}) ended")
        pid = REPLY.unpack_from(reply)[0]
        if pid < 0:
            raise OSError(reply[REPLY.size:].decode(errors="replace"))
        return ServedChild(pid, got[0], got[1] if len(got) > 1 else None)

    def stop(self) -> None:
        """Ask it to end (its exit handlers run), reap it; killed if it has not ended in STOP_WAIT_SEC."""
        with self._lock:
            control, self.control = self.control, None
        if control is not None:
            control.close()  # end-of-file: the server's loop ends
        if self._ready_r is not None:
            os.close(self._ready_r)
            self._ready_r = None
        popen, self.popen = self.popen, None
        if popen is not None and not _wait_exit(popen, STOP_WAIT_SEC):
            popen.kill()
            popen.wait()

    def kill(self) -> None:
        """End it at once (it never forked a worker, or nothing it has is worth waiting for)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
        self.stop()


def _wait_exit(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    """Reap ``popen`` once it exits, within ``timeout``; False if it has not exited by then.

    A pidfd wakes the runner the moment the server exits; ``Popen.wait(timeout=...)`` polls
    with growing sleeps, which cost a run's end 8-16 ms after the server had gone.
    """
    try:
        pidfd = os.pidfd_open(popen.pid)  # our child, not waited for yet: still that process
    except (AttributeError, OSError):  # not Linux >= 5.3, or already reaped
        pidfd = None
    if pidfd is not None:
        try:
            readable(pidfd, timeout)
        finally:
            os.close(pidfd)
    try:
        popen.wait(timeout=0 if pidfd is not None else timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


# ---------------------------------------------------------------------------- the server's side
def _leave_now() -> None:
    """Registered first, so run last of the exit handlers: flush, and exit without the teardown."""
    bootstrap.flush_std()
    os._exit(_exit_status)


def _ignore(*_: Any) -> None:
    """SIGCHLD's handler: the signal only wakes the loop (through the wakeup fd)."""


class _Server:
    """The server's loop: fork on request, reap children, report each one's exit code."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.statuses: dict[int, int] = {}  # child pid -> the pipe its exit code goes down

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, _ignore)
        poller = select.poll()
        poller.register(self.control, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == self.wake_r:
                    self._drain_wake()
                    self._reap()
                elif not self._serve_one():
                    return

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.statuses.pop(pid, None)
            if fd is not None:
                try:
                    os.write(fd, STATUS.pack(os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass
                os.close(fd)

    def _serve_one(self) -> bool:
        """Answer one request; False once the runner's end has closed."""
        request, fds, flags, _ = socket.recv_fds(self.control, MAX_REQUEST, MAX_FDS)
        try:
            if not request:
                return False
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                self._refuse("the request was too large")
                return True
            try:
                target, args = pickle.loads(request)
            except Exception as exc:  # noqa: BLE001 - answered, the runner reports it
                self._refuse(f"cannot read the request: {exc!r}")
                return True
            self._fork(target, args, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _refuse(self, why: str) -> None:
        self.control.send(REPLY.pack(-1) + why.encode())

    def _fork(self, target: Callable[..., Any], args: tuple[Any, ...], fds: list[int]) -> None:
        status_r, status_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(status_r)
            os.close(status_w)
            self._refuse(f"cannot fork: {exc}")
            return
        if pid == 0:
            try:
                self._become_child(status_r, status_w)
            except BaseException:  # noqa: BLE001 - the child must never return into the server's loop
                traceback.print_exc()
                os._exit(1)
            bootstrap.run_request(target, fds, args)  # never returns
        pidfd = open_own_pidfd(pid)  # before any reap: only this loop reaps, and not before this returns
        self.statuses[pid] = status_w  # kept until the child is reaped: its exit code goes down it
        try:
            socket.send_fds(self.control, [REPLY.pack(pid)], [status_r] if pidfd is None else [status_r, pidfd])
        finally:
            os.close(status_r)
            if pidfd is not None:
                os.close(pidfd)

    def _become_child(self, status_r: int, status_w: int) -> None:
        """In the child: none of the server's descriptors or signal handling."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.control.close()
        for fd in (self.wake_r, self.wake_w, status_r, status_w, *self.statuses.values()):
            os.close(fd)


def serve() -> None:
    """The server process: ``argv`` = control socket fd, ready fd, preload (JSON), sys.path (JSON)."""
    global _exit_status
    atexit.register(_leave_now)  # first registered, so last run: after the preloaded modules' handlers
    control_fd, ready_fd, preload, search_path = sys.argv[1:]
    del sys.argv[1:]  # its children see ``sys.argv == ["-c"]``, not the server's plumbing
    control = socket.socket(fileno=int(control_fd))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its session gets no Ctrl-C; a stray one changes nothing
    bootstrap.add_search_path(json.loads(search_path))
    for name in json.loads(preload):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S112 - a worker imports it again and reports what is wrong
            continue
    try:
        os.write(int(ready_fd), b"r")
    except OSError:
        pass  # the runner stopped waiting for it (it stopped this server while it booted)
    os.close(int(ready_fd))
    server = _Server(control)
    try:
        server.run()
    except OSError:
        pass  # the runner died in the middle of a request (EPIPE, ECONNRESET): nothing to tell anyone
    _exit_status = 0
    sys.exit(0)
