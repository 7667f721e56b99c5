"""Start a group of ranks and watch, signal and reap them: ``start_processes`` and its context.

Two entrypoint kinds, as in torch.distributed.elastic: a picklable function
(run in a ``multiprocessing`` child, spawn by default, with one argument tuple
per rank) and a command (an argv list, exec'd directly, never through a shell).
Every rank leads its own session and process group, so signalling the group
reaches the rank's children too; a watchdog process and PR_SET_PDEATHSIG make
sure nothing outlives a launcher that is killed.

Waiting is event-driven: a pidfd per rank (readable when it exits) plus any
caller file descriptors (a stop flag) go into one ``select``.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from habitrun.errors import LaunchError
from habitrun.launcher._child import FunctionRankSpec, run_function_rank
from habitrun.launcher.errorfile import ERROR_FILE_ENV, read_error_file
from habitrun.launcher.lifeline import TRAMPOLINE
from habitrun.launcher.logdir import claim_log_dir
from habitrun.launcher.results import GroupResult, RankResult
from habitrun.launcher.signalling import drain, signal_group
from habitrun.launcher.std import Std, to_map
from habitrun.launcher.streams import Console, Pump, default_console
from habitrun.launcher.watchdog import Watchdog

StdSpec = Std | str | Mapping[int, Std | str] | None


@dataclass(frozen=True)
class StreamPlan:
    """Where one stream of one rank goes: ``tee`` (pipe -> file + console), ``file`` or ``inherit``."""

    mode: str
    path: str | None


def plan_streams(
    nprocs: int,
    rank_dirs: Mapping[int, str],
    redirects: StdSpec,
    tee: StdSpec,
    local_ranks_filter: Sequence[int] | None,
) -> dict[int, dict[str, StreamPlan]]:
    """Decide every rank's stdout and stderr.

    - teed (and the rank passes ``local_ranks_filter``): its log file and the console, prefixed;
    - redirected, or teed/unselected but filtered out: its log file only;
    - neither: straight to the launcher's console, unprefixed, no log file (torchrun's default).
    """
    red = to_map(redirects, nprocs)
    tees = to_map(tee, nprocs)
    shown = set(range(nprocs)) if local_ranks_filter is None else set(local_ranks_filter)
    plans: dict[int, dict[str, StreamPlan]] = {}
    for rank in range(nprocs):
        plans[rank] = {}
        for stream, flag, fname in (("out", Std.OUT, "stdout.log"), ("err", Std.ERR, "stderr.log")):
            path = os.path.join(rank_dirs[rank], fname)
            if flag in tees[rank] and rank in shown:
                plans[rank][stream] = StreamPlan("tee", path)
            elif flag in red[rank] or flag in tees[rank] or rank not in shown:
                plans[rank][stream] = StreamPlan("file", path)
            else:
                plans[rank][stream] = StreamPlan("inherit", None)
    return plans


class _Handle:
    """A started rank: a Popen or a multiprocessing.Process behind one small interface."""

    def __init__(self, proc: subprocess.Popen[bytes] | mp.process.BaseProcess, result_path: str | None) -> None:
        self.proc = proc
        self.pid: int = int(proc.pid or 0)
        self.result_path = result_path
        try:
            self.pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def poll(self) -> int | None:
        if isinstance(self.proc, subprocess.Popen):
            return self.proc.poll()
        return self.proc.exitcode

    def wait_fd(self) -> int:
        if self.pidfd is not None:
            return self.pidfd
        if isinstance(self.proc, subprocess.Popen):
            raise LaunchError("this system has no pidfd_open; command ranks need Linux 5.3+")
        return int(self.proc.sentinel)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if not isinstance(self.proc, subprocess.Popen):
            self.proc.close()


class ProcessContext:
    """A running rank group. ``wait``/``poll`` return a GroupResult once every rank is done."""

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | Sequence[str],
        args: Mapping[int, tuple[Any, ...]],
        envs: Mapping[int, Mapping[str, str]],
        log_dir: str,
        *,
        attempt: int = 0,
        redirects: StdSpec = Std.NONE,
        tee: StdSpec = Std.ALL,
        local_ranks_filter: Sequence[int] | None = None,
        start_method: str = "spawn",
        cwd: str | None = None,
        console: Console | None = None,
        grace: float = 15.0,
        period: float | None = None,
    ) -> None:
        self.name = name
        self.entrypoint = entrypoint
        self.nprocs = len(envs)
        if set(envs) != set(range(self.nprocs)) or set(args) != set(range(self.nprocs)):
            raise LaunchError(f"ranks must be numbered 0..{self.nprocs - 1} in both args and envs")
        if self.nprocs < 1:
            raise LaunchError("a rank group needs at least one rank")
        self.args = dict(args)
        self.log_dir = os.path.abspath(log_dir)
        self.attempt = attempt
        self.start_method = start_method
        self.cwd = cwd
        self.grace = grace
        self.period = period
        self._console = console
        self._rank_dirs = {r: os.path.join(self.log_dir, str(r)) for r in range(self.nprocs)}
        self._plans = plan_streams(self.nprocs, self._rank_dirs, redirects, tee, local_ranks_filter)
        self.envs: dict[int, dict[str, str]] = {}
        for rank in range(self.nprocs):
            env = dict(envs[rank])
            env[ERROR_FILE_ENV] = os.path.join(self._rank_dirs[rank], "error.json")
            self.envs[rank] = env
        self._handles: dict[int, _Handle] = {}
        self._results: dict[int, RankResult] = {}
        self._pump = Pump()
        self._watchdog: Watchdog | None = None
        self._seen = 0
        self._closed = False
        self._result: GroupResult | None = None

    # -- starting -------------------------------------------------------------------------

    def start(self) -> None:
        claim_log_dir(self.log_dir)
        for d in self._rank_dirs.values():
            os.makedirs(d, exist_ok=True)
        is_command = not callable(self.entrypoint)
        program = self._resolve_program() if is_command else None
        payloads = None if is_command else self._pickle_payloads()
        self._watchdog = Watchdog()
        try:
            for rank in range(self.nprocs):
                if is_command:
                    assert program is not None
                    handle = self._start_command(rank, program)
                else:
                    assert payloads is not None
                    handle = self._start_function(rank, payloads[rank])
                self._handles[rank] = handle
                self._watchdog.watch(handle.pid)
                plan = self._plans[rank]
                self._results[rank] = RankResult(
                    local_rank=rank,
                    pid=handle.pid,
                    error_file=self.envs[rank][ERROR_FILE_ENV],
                    stdout=plan["out"].path,
                    stderr=plan["err"].path,
                )
        except BaseException:
            self._pump.start()
            self.close(signal.SIGKILL, 0)
            raise
        self._pump.start()

    def _resolve_program(self) -> str:
        argv = list(self.entrypoint)  # type: ignore[arg-type]
        if not argv or not all(isinstance(a, str) for a in argv):
            raise LaunchError(f"a command entrypoint is a non-empty list of strings, got {argv!r}")
        prog = argv[0]
        if os.sep in prog:
            full = prog if os.path.isabs(prog) else os.path.join(self.cwd or os.getcwd(), prog)
            if not os.access(full, os.X_OK):
                raise LaunchError(f"command {prog!r}: {full} is not an executable file")
            return full
        found = shutil.which(prog, path=self.envs[0].get("PATH"))
        if found is None:
            raise LaunchError(f"command {prog!r} not found on the ranks' PATH")
        return prog

    def _pickle_payloads(self) -> dict[int, bytes]:
        out = {}
        for rank in range(self.nprocs):
            try:
                out[rank] = pickle.dumps((self.entrypoint, tuple(self.args[rank])))
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(
                    f"the function entrypoint {getattr(self.entrypoint, '__qualname__', self.entrypoint)!r} "
                    f"or rank {rank}'s arguments cannot be pickled: {exc} "
                    "(define the function at module level)"
                ) from None
        return out

    def _stream_target(self, rank: int, stream: str) -> tuple[Any, int | None]:
        """(what the child writes to, the parent's read end to pump or None)."""
        plan = self._plans[rank][stream]
        if plan.mode == "inherit":
            return None, None
        if plan.mode == "file":
            return plan.path, None
        read_fd, write_fd = os.pipe()
        console = self._console or default_console(stream)
        assert plan.path is not None
        self._pump.add(read_fd, plan.path, f"[{self.name}/{rank}] ", console)
        return write_fd, read_fd

    def _start_command(self, rank: int, program: str) -> _Handle:
        argv = [program, *list(self.entrypoint)[1:], *map(str, self.args[rank])]  # type: ignore[arg-type]
        files = []
        targets: dict[str, Any] = {}
        for stream in ("out", "err"):
            target, _ = self._stream_target(rank, stream)
            if isinstance(target, str):
                target = open(target, "ab")  # noqa: SIM115 - closed right after Popen
                files.append(target)
            elif isinstance(target, int):
                files.append(target)
            targets[stream] = target
        try:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", TRAMPOLINE, str(os.getpid()), *argv],
                env=self.envs[rank],
                cwd=self.cwd,
                stdout=targets["out"],
                stderr=targets["err"],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start rank {rank} of {self.name!r}: {exc}") from exc
        finally:
            for f in files:
                if isinstance(f, int):
                    os.close(f)
                else:
                    f.close()
        return _Handle(proc, None)

    def _start_function(self, rank: int, payload: bytes) -> _Handle:
        ctx = mp.get_context(self.start_method)
        out, _ = self._stream_target(rank, "out")
        err, _ = self._stream_target(rank, "err")
        conns = [mpc.Connection(fd, readable=False) for fd in (out, err) if isinstance(fd, int)]
        targets = [
            conns.pop(0) if isinstance(t, int) else t for t in (out, err)
        ]
        result_path = os.path.join(self._rank_dirs[rank], "result.pkl")
        close_fds: tuple[int, ...] = ()
        if self.start_method == "fork" and self._watchdog is not None:
            close_fds = (self._watchdog.fileno(),)
        spec = FunctionRankSpec(
            payload=payload,
            env=self.envs[rank],
            stdout=targets[0],
            stderr=targets[1],
            result_path=result_path,
            parent_pid=None if self.start_method == "forkserver" else os.getpid(),
            close_fds=close_fds,
            cwd=self.cwd,
        )
        proc = ctx.Process(target=run_function_rank, args=(spec,), name=f"{self.name}-rank{rank}")
        try:
            proc.start()
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"cannot start rank {rank} of {self.name!r}: {exc}") from exc
        finally:
            for t in targets:
                if isinstance(t, mpc.Connection):
                    t.close()
        return _Handle(proc, result_path)

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
            fds = [self._handles[r].wait_fd() for r in self._live()]
            ready = mpc.wait([*fds, *wake], slice_)
            if any(fd in ready for fd in wake):
                return None

    def close(self, death_sig: int = signal.SIGTERM, timeout: float | None = None, *,
              wake: Sequence[int] = (), hurry: Callable[[], bool] | None = None) -> GroupResult:
        """Stop every rank and its children: ``death_sig``, up to ``timeout`` (the grace), then SIGKILL.

        With ``hurry``, whenever a ``wake`` fd becomes readable during the grace it is
        drained and ``hurry()`` asked: True (say, a second Ctrl-C) ends the grace at once.
        """
        if self._result is not None:
            return self._result
        timeout = self.grace if timeout is None else timeout
        watch = list(wake) if hurry is not None else []
        for fd in watch:
            drain(fd)  # what woke us already: only what comes later may cut the grace
        if hurry is not None and hurry():
            timeout = 0.0  # already asked twice
        self._reap()
        live = self._live()
        for rank in live:
            self._results[rank].stopped = True
            signal_group(self._handles[rank].pid, death_sig, self._handles[rank].pidfd)
        for rank, res in self._results.items():
            if res.exitcode is not None and rank in self._handles:
                signal_group(self._handles[rank].pid, signal.SIGKILL, self._handles[rank].pidfd)  # its leftover children
        deadline = time.monotonic() + max(timeout, 0)
        while self._live():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = mpc.wait([*(self._handles[r].wait_fd() for r in self._live()), *watch], left)
            woken = [fd for fd in watch if fd in ready]
            if woken:
                for fd in woken:
                    if not drain(fd):
                        watch.remove(fd)  # closed: it cannot wake us again
                if hurry is not None and hurry():
                    break
            self._reap()
        for rank in self._handles:
            signal_group(self._handles[rank].pid, signal.SIGKILL, self._handles[rank].pidfd)
        while self._live():
            mpc.wait([self._handles[r].wait_fd() for r in self._live()], 1.0)
            self._reap()
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
            handle = self._handles[rank]
            if res.exitcode == 0 and handle.result_path:
                try:
                    with open(handle.result_path, "rb") as f:
                        res.return_value = pickle.load(f)
                except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
                    res.return_value = None
            elif res.failed:
                res.error = read_error_file(res.error_file)
        return GroupResult(attempt=self.attempt, ranks=dict(self._results))


def start_processes(
    name: str,
    entrypoint: Callable[..., Any] | Sequence[str],
    args: Mapping[int, tuple[Any, ...]],
    envs: Mapping[int, Mapping[str, str]],
    log_dir: str,
    *,
    attempt: int = 0,
    redirects: StdSpec = Std.NONE,
    tee: StdSpec = Std.ALL,
    local_ranks_filter: Sequence[int] | None = None,
    start_method: str = "spawn",
    cwd: str | None = None,
    console: Console | None = None,
    grace: float = 15.0,
    period: float | None = None,
) -> ProcessContext:
    """Start one rank per entry of ``envs`` (complete environments, see ``rank_env``).

    ``entrypoint`` is a picklable function (called as ``fn(*args[rank])``, its
    return value in the result) or an argv list (``args[rank]`` appended).
    Logs go to ``log_dir/<rank>/stdout.log|stderr.log|error.json`` and set
    TORCHELASTIC_ERROR_FILE; a ``log_dir`` holding anything is refused, never emptied.
    """
    ctx = ProcessContext(
        name,
        entrypoint,
        args,
        envs,
        log_dir,
        attempt=attempt,
        redirects=redirects,
        tee=tee,
        local_ranks_filter=local_ranks_filter,
        start_method=start_method,
        cwd=cwd,
        console=console,
        grace=grace,
        period=period,
    )
    ctx.start()
    return ctx
