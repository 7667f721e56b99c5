"""A running rank group, whatever its ranks run: start, watch, signal, reap and collect them.

``ProcessContext`` holds what both rank kinds share; ``function_ranks`` and
``command_ranks`` say how one rank of their kind is started and released.
Every rank leads its own session and process group, so signalling the group
reaches the rank's children too; a watchdog process and PR_SET_PDEATHSIG make
sure nothing outlives a launcher that is killed.

Waiting is event-driven: a pidfd per rank (readable when it exits) plus any
caller file descriptors (a stop flag) go into one ``select``.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from habitrun.errors import LaunchError
from habitrun.launcher.errorfile import ERROR_FILE_ENV, read_error_file
from habitrun.launcher.groupspec import RankGroupSpec
from habitrun.launcher.logdir import claim_log_dir
from habitrun.launcher.results import GroupResult, RankResult
from habitrun.launcher.signalling import drain, open_pidfd, signal_group
from habitrun.launcher.std import plan_streams
from habitrun.launcher.streams import Pump, default_console
from habitrun.launcher.watchdog import Watchdog


class RankProcess(ABC):
    """One started rank: its pid, a pidfd where the system has them, and how to poll and release it."""

    def __init__(self, pid: int | None) -> None:
        self.pid: int = int(pid or 0)
        self.pidfd: int | None = open_pidfd(self.pid)

    @abstractmethod
    def poll(self) -> int | None:
        """Its exit code once it has exited (negative: the signal), else None."""

    def wait_fd(self) -> int:
        """A descriptor that turns readable when the rank exits."""
        return self.pidfd if self.pidfd is not None else self._exit_fd()

    @abstractmethod
    def _exit_fd(self) -> int:
        """The kind's own exit descriptor, where there is no pidfd."""

    def return_value(self) -> Any:
        """What the rank returned, once it exited with 0 (None for a command)."""
        return None

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class ProcessContext(ABC):
    """A running rank group. ``wait``/``poll`` return a GroupResult once every rank is done.

    Subclasses (one per rank kind) supply ``_prepare`` (check the entrypoint
    before any rank starts) and ``_spawn`` (start one rank).
    """

    def __init__(self, spec: RankGroupSpec, envs: Mapping[int, Mapping[str, str]], log_dir: str, *,
                 attempt: int = 0) -> None:
        self.spec = spec
        self.name = spec.name
        self.nprocs = len(envs)
        if set(envs) != set(range(self.nprocs)) or set(spec.args) != set(range(self.nprocs)):
            raise LaunchError(f"ranks must be numbered 0..{self.nprocs - 1} in both args and envs")
        if self.nprocs < 1:
            raise LaunchError("a rank group needs at least one rank")
        self.args = dict(spec.args)
        self.log_dir = os.path.abspath(log_dir)
        self.attempt = attempt
        self.grace = spec.grace
        self.period = spec.period
        self._rank_dirs = {r: os.path.join(self.log_dir, str(r)) for r in range(self.nprocs)}
        self._plans = plan_streams(self.nprocs, self._rank_dirs, spec.redirects, spec.tee, spec.local_ranks_filter)
        self.envs: dict[int, dict[str, str]] = {
            rank: {**envs[rank], ERROR_FILE_ENV: os.path.join(self._rank_dirs[rank], "error.json")}
            for rank in range(self.nprocs)
        }
        self._handles: dict[int, RankProcess] = {}
        self._results: dict[int, RankResult] = {}
        self._pump = Pump()
        self._watchdog: Watchdog | None = None
        self._seen = 0
        self._closed = False
        self._result: GroupResult | None = None

    # -- the rank kind's part -------------------------------------------------------------

    @abstractmethod
    def _prepare(self) -> None:
        """Check the entrypoint (raise LaunchError) before any rank starts."""

    @abstractmethod
    def _spawn(self, rank: int) -> RankProcess:
        """Start rank ``rank`` (raise LaunchError when it cannot start)."""

    # -- starting -------------------------------------------------------------------------

    def start(self) -> None:
        claim_log_dir(self.log_dir)
        for d in self._rank_dirs.values():
            os.makedirs(d, exist_ok=True)
        self._prepare()
        self._watchdog = Watchdog()
        try:
            for rank in range(self.nprocs):
                self._track(rank, self._spawn(rank))
        except BaseException:
            self._pump.start()
            self.close(signal.SIGKILL, 0)
            raise
        self._pump.start()

    def _track(self, rank: int, handle: RankProcess) -> None:
        assert self._watchdog is not None
        self._handles[rank] = handle
        self._watchdog.watch(handle.pid, handle.pidfd)  # its own pidfd, taken before we could reap it
        plan = self._plans[rank]
        self._results[rank] = RankResult(
            local_rank=rank,
            pid=handle.pid,
            error_file=self.envs[rank][ERROR_FILE_ENV],
            stdout=plan["out"].path,
            stderr=plan["err"].path,
        )

    def _stream_target(self, rank: int, stream: str) -> str | int | None:
        """What the child writes ``stream`` to: its log file's path, a pipe's write end (teed), or None."""
        plan = self._plans[rank][stream]
        if plan.mode == "inherit":
            return None
        if plan.mode == "file":
            return plan.path
        read_fd, write_fd = os.pipe()
        console = self.spec.console or default_console(stream)
        assert plan.path is not None
        self._pump.add(read_fd, plan.path, f"[{self.name}/{rank}] ", console)
        return write_fd

    # -- watching -------------------------------------------------------------------------

    def pids(self) -> dict[int, int]:
        return {r: h.pid for r, h in self._handles.items()}

    def _reap(self) -> bool:
        """Record ranks that exited since last time; True if any did."""
        fresh = False
        for rank, handle in self._handles.items():
            res = self._results[rank]
            if res.exitcode is not None:
                continue
            code = handle.poll()
            if code is None:
                continue
            if not fresh:
                self._seen += 1
                fresh = True
            res.exitcode = code
            res.ended_at = time.time()
            res.seen = self._seen
        return fresh

    def _live(self) -> list[int]:
        return [r for r, res in self._results.items() if res.exitcode is None]

    def _live_fds(self) -> list[int]:
        return [self._handles[r].wait_fd() for r in self._live()]

    def poll(self) -> GroupResult | None:
        """Non-blocking: None while ranks run; the result once all succeeded or one failed.

        When a rank has failed the others are closed first (SIGTERM, the grace, SIGKILL).
        """
        if self._result is not None:
            return self._result
        self._reap()
        results = self._results.values()
        if any(r.failed for r in results) or all(r.exitcode == 0 for r in results):
            self.close(signal.SIGTERM, self.grace)
            return self._result
        return None

    def wait(self, timeout: float | None = None, *, wake: Sequence[int] = ()) -> GroupResult | None:
        """Block until ``poll()`` has a result, ``timeout`` passes, or a ``wake`` fd is readable.

        Returns None on timeout or wake-up (the group keeps running; call close()).
        Interrupted (KeyboardInterrupt: SIGINT to the ranks), it closes the group, then re-raises.
        """
        try:
            return self._wait(timeout, wake)
        except BaseException as exc:  # non-daemon ranks would hold the interpreter's exit
            self.close(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM, self.grace)
            raise

    def _wait(self, timeout: float | None, wake: Sequence[int]) -> GroupResult | None:
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            result = self.poll()
            if result is not None:
                return result
            slice_ = self.period
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                slice_ = left if slice_ is None else min(slice_, left)
            ready = mpc.wait([*self._live_fds(), *wake], slice_)
            if any(fd in ready for fd in wake):
                return None

    # -- stopping -------------------------------------------------------------------------

    def close(self, death_sig: int = signal.SIGTERM, timeout: float | None = None, *,
              wake: Sequence[int] = (), hurry: Callable[[], bool] | None = None) -> GroupResult:
        """Stop every rank and its children: ``death_sig``, up to ``timeout`` (the grace), then SIGKILL.

        With ``hurry``, whenever a ``wake`` fd becomes readable during the grace it is
        drained and ``hurry()`` asked: True (say, a second Ctrl-C) ends the grace at once.
        """
        if self._result is not None:
            return self._result
        grace = self.grace if timeout is None else timeout
        watch = list(wake) if hurry is not None else []
        for fd in watch:
            drain(fd)  # what woke us already: only what comes later may cut the grace
        if hurry is not None and hurry():
            grace = 0.0  # already asked twice
        self._reap()
        self._signal_running(death_sig)
        self._kill_groups(self._exited())  # their leftover children
        self._wait_out_grace(grace, watch, hurry)
        self._kill_groups(list(self._handles))
        self._reap_all()
        return self._finish()

    def _exited(self) -> list[int]:
        return [rank for rank, res in self._results.items() if res.exitcode is not None and rank in self._handles]

    def _signal_running(self, sig: int) -> None:
        """Send ``sig`` to every running rank's group; they count as stopped, not failed on their own."""
        for rank in self._live():
            self._results[rank].stopped = True
            signal_group(self._handles[rank].pid, sig, self._handles[rank].pidfd)

    def _kill_groups(self, ranks: Sequence[int]) -> None:
        for rank in ranks:
            signal_group(self._handles[rank].pid, signal.SIGKILL, self._handles[rank].pidfd)

    def _wait_out_grace(self, grace: float, watch: list[int], hurry: Callable[[], bool] | None) -> None:
        """Until every rank has exited, the grace has passed, or ``hurry()`` cuts it short."""
        deadline = time.monotonic() + max(grace, 0)
        while self._live():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready = mpc.wait([*self._live_fds(), *watch], left)
            if self._hurried([fd for fd in watch if fd in ready], watch, hurry):
                return
            self._reap()

    @staticmethod
    def _hurried(woken: list[int], watch: list[int], hurry: Callable[[], bool] | None) -> bool:
        """Drain the ``woken`` fds (forgetting closed ones) and ask ``hurry``."""
        if not woken:
            return False
        for fd in woken:
            if not drain(fd):
                watch.remove(fd)  # closed: it cannot wake us again
        return hurry is not None and hurry()

    def _reap_all(self) -> None:
        """After SIGKILL: until every rank is reaped."""
        while self._live():
            mpc.wait(self._live_fds(), 1.0)
            self._reap()

    def _finish(self) -> GroupResult:
        """Stop the pump and the watchdog, collect the result, release the ranks."""
        self._pump.stop()
        if self._watchdog is not None:
            self._watchdog.close()
        self._result = self._collect()
        for handle in self._handles.values():
            handle.close()
        self._closed = True
        return self._result

    def _collect(self) -> GroupResult:
        for rank, res in self._results.items():
            if res.exitcode == 0:
                res.return_value = self._handles[rank].return_value()
            elif res.failed:
                res.error = read_error_file(res.error_file)
        return GroupResult(attempt=self.attempt, ranks=dict(self._results))
