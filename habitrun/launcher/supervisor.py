"""Run a rank group to the end: attempts, restarts, the attempt timeout, stop requests, root cause.

This is what ``torchrun`` does on one machine, as a library call: each attempt
gets a fresh ``attempt_<n>`` folder, a fresh rendezvous port and
TORCHELASTIC_RESTART_COUNT = n; when a rank fails the others are stopped and
the group restarts, up to ``max_restarts`` times; past that the launch fails
with the first failing rank's own message and traceback.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from habitrun.launcher.environment import rank_env
from habitrun.launcher.logdir import check_attempt_dirs
from habitrun.launcher.ports import PortReservation
from habitrun.launcher.processes import StdSpec, start_processes
from habitrun.launcher.results import GroupResult, RankResult
from habitrun.launcher.std import Std
from habitrun.launcher.streams import Console, default_console

STDERR_TAIL_LINES = 20


@dataclass
class LaunchResult:
    """How a launch ended. ``status``: succeeded, failed, timeout or interrupted."""

    status: str
    log_dir: str
    duration_sec: float
    attempts: list[GroupResult] = field(default_factory=list)
    root_cause: RankResult | None = None
    error: str | None = None
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @property
    def last(self) -> GroupResult | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def return_values(self) -> dict[int, Any]:
        return self.last.return_values if self.last else {}


def _stderr_tail(path: str | None, lines: int = STDERR_TAIL_LINES) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16384))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else None


def explain(rank: RankResult) -> tuple[str, str | None]:
    """(one-line error, traceback or stderr tail) for a failed rank."""
    if rank.error is not None:
        return f"{rank.describe()}: {rank.error.message}", rank.error.traceback
    tail = _stderr_tail(rank.stderr)
    hint = "no error file; decorate the entrypoint with habitrun.launcher.record (or torch's @record)"
    where = f", see {rank.stderr}" if rank.stderr else ""
    return f"{rank.describe()} ({hint}{where})", tail


def _readable(fds: Sequence[int]) -> bool:
    return bool(fds) and bool(mpc.wait(list(fds), 0))


def launch(
    entrypoint: Callable[..., Any] | Sequence[str],
    *,
    nprocs: int,
    log_dir: str | os.PathLike[str],
    name: str = "train",
    args: Mapping[int, tuple[Any, ...]] | tuple[Any, ...] = (),
    run_id: str | None = None,
    max_restarts: int = 0,
    redirects: StdSpec = Std.NONE,
    tee: StdSpec = Std.ALL,
    local_ranks_filter: Sequence[int] | None = None,
    start_method: str = "spawn",
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    inputs: str | None = None,
    workdir: str | None = None,
    grace: float = 15.0,
    timeout: float | None = None,
    period: float | None = None,
    console: Console | None = None,
    wake: Sequence[int] = (),
    hurry: Callable[[], bool] | None = None,
    stop_signal: Callable[[], int | None] | None = None,
    master_addr: str = "127.0.0.1",
) -> LaunchResult:
    """Run ``nprocs`` ranks of ``entrypoint`` until they succeed, fail past ``max_restarts``, time out or are woken.

    ``args``: one tuple for every rank, or a map by rank. Ranks inherit
    ``base_env`` (default: our environment) updated with ``env``. ``timeout``: seconds
    per attempt. ``wake``: file descriptors (a stop flag's) that, once
    readable, stop the group (``stop_signal()``, else SIGTERM; ``grace``; SIGKILL) with
    status interrupted: pass the signal the caller received, as torchrun forwards it.
    ``hurry``: asked when a ``wake`` fd becomes readable again during that grace
    (it is drained first); True (a second Ctrl-C) kills the ranks at once.
    """
    started = time.monotonic()
    log_root = os.path.abspath(os.fspath(log_dir))
    os.makedirs(log_root, exist_ok=True)
    check_attempt_dirs(log_root, max_restarts + 1)
    run_id = run_id or uuid.uuid4().hex
    per_rank = dict(args) if isinstance(args, Mapping) else dict.fromkeys(range(nprocs), tuple(args))
    say = console or default_console("err")
    out = LaunchResult(status="failed", log_dir=log_root, duration_sec=0.0)
    for attempt in range(max_restarts + 1):
        with PortReservation(master_addr) as port:
            attempt_dir = os.path.join(log_root, f"attempt_{attempt}")
            envs = {
                rank: rank_env(
                    rank,
                    nprocs,
                    run_id=run_id,
                    restart_count=attempt,
                    max_restarts=max_restarts,
                    master_addr=master_addr,
                    master_port=port.port,
                    error_file=os.path.join(attempt_dir, str(rank), "error.json"),
                    inputs=inputs,
                    workdir=workdir,
                    extra=env,
                    base=base_env,
                )
                for rank in range(nprocs)
            }
            ctx = start_processes(
                name,
                entrypoint,
                per_rank,
                envs,
                attempt_dir,
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
            try:
                result = ctx.wait(timeout, wake=wake)
            except BaseException:  # KeyboardInterrupt in a library caller: never leave ranks behind
                ctx.close(signal.SIGTERM, grace)
                raise
            if result is None:
                interrupted = _readable(wake)
                sig = (stop_signal() if interrupted and stop_signal else None) or signal.SIGTERM
                result = ctx.close(sig, grace, wake=wake, hurry=hurry)
                out.attempts.append(result)
                if interrupted:
                    out.status, out.error = "interrupted", "interrupted"
                    break
                out.status = "timeout"
                out.error = f"timeout: attempt {attempt} ran past {timeout:g}s; its ranks were stopped"
                hung = [r.local_rank for r in result.ranks.values() if r.stopped]
                out.traceback = f"ranks still running at the timeout: {hung}"
            else:
                out.attempts.append(result)
                if not result.failed:
                    out.status, out.error, out.traceback, out.root_cause = "succeeded", None, None, None
                    break
                out.status = "failed"
                out.root_cause = result.root_cause()
                if out.root_cause is not None:
                    out.error, out.traceback = explain(out.root_cause)
                else:
                    out.error, out.traceback = "the rank group failed", None
        if attempt < max_restarts:
            say(f"[{name}] attempt {attempt} {out.status}: {out.error}; restarting ({attempt + 1}/{max_restarts})")
    out.duration_sec = time.monotonic() - started
    return out
