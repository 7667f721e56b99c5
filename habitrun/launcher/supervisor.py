"""Run a rank group to the end: attempts, restarts, the attempt timeout, stop requests, root cause.

This is what ``torchrun`` does on one machine, as a library call: each attempt
gets a fresh ``attempt_<n>`` folder, a fresh rendezvous port and
TORCHELASTIC_RESTART_COUNT = n; when a rank fails the others are stopped and
the group restarts, up to ``max_restarts`` times; past that the launch fails
with the first failing rank's own message and traceback.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from habitrun.launcher.environment import rank_env
from habitrun.launcher.group import ProcessContext
from habitrun.launcher.groupspec import RankGroupSpec
from habitrun.launcher.logdir import check_attempt_dirs
from habitrun.launcher.ports import PortReservation
from habitrun.launcher.processes import start_group
from habitrun.launcher.results import GroupResult, RankResult
from habitrun.launcher.signalling import StopChannel
from habitrun.launcher.std import Std, StdSpec
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
    if rank.signal is not None:  # no handler runs on a signal: faulthandler may have printed the stack
        hint = "a signal leaves no error file; its Python stack, if it printed one, ends its stderr"
    else:
        hint = "no error file; decorate the entrypoint with habitrun.launcher.record (or torch's @record)"
    where = f", see {rank.stderr}" if rank.stderr else ""
    return f"{rank.describe()} ({hint}{where})", tail


@dataclass(frozen=True)
class AttemptPlan:
    """How many attempts a launch may make, how long each may run, and each rank's environment."""

    nprocs: int
    run_id: str
    max_restarts: int = 0
    timeout: float | None = None
    master_addr: str = "127.0.0.1"
    env: Mapping[str, str] | None = None
    base_env: Mapping[str, str] | None = None
    inputs: str | None = None
    workdir: str | None = None

    def rank_envs(self, attempt: int, master_port: int, attempt_dir: str) -> dict[int, dict[str, str]]:
        """Every rank's complete environment for one attempt."""
        return {
            rank: rank_env(
                rank,
                self.nprocs,
                run_id=self.run_id,
                restart_count=attempt,
                max_restarts=self.max_restarts,
                master_addr=self.master_addr,
                master_port=master_port,
                error_file=os.path.join(attempt_dir, str(rank), "error.json"),
                inputs=self.inputs,
                workdir=self.workdir,
                extra=self.env,
                base=self.base_env,
            )
            for rank in range(self.nprocs)
        }


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
    The options are those of ``RankGroupSpec``, ``AttemptPlan`` and ``StopChannel``.
    """
    per_rank = dict(args) if isinstance(args, Mapping) else dict.fromkeys(range(nprocs), tuple(args))
    group = RankGroupSpec(entrypoint, per_rank, name=name, redirects=redirects, tee=tee,
                          local_ranks_filter=local_ranks_filter, start_method=start_method, cwd=cwd,
                          console=console, grace=grace, period=period)
    plan = AttemptPlan(nprocs, run_id or uuid.uuid4().hex, max_restarts=max_restarts, timeout=timeout,
                       master_addr=master_addr, env=env, base_env=base_env, inputs=inputs, workdir=workdir)
    return launch_group(group, plan, log_dir, StopChannel(wake, hurry, stop_signal))


def launch_group(group: RankGroupSpec, plan: AttemptPlan, log_dir: str | os.PathLike[str],
                 stop: StopChannel | None = None) -> LaunchResult:
    """``launch`` with its options as values: one attempt after another until one ends the launch."""
    started = time.monotonic()
    stop = stop or StopChannel()
    log_root = os.path.abspath(os.fspath(log_dir))
    os.makedirs(log_root, exist_ok=True)
    check_attempt_dirs(log_root, plan.max_restarts + 1)
    say = group.console or default_console("err")
    out = LaunchResult(status="failed", log_dir=log_root, duration_sec=0.0)
    for attempt in range(plan.max_restarts + 1):
        if _run_attempt(group, plan, stop, out, attempt):
            break
        if attempt < plan.max_restarts:
            say(f"[{group.name}] attempt {attempt} {out.status}: {out.error}; "
                f"restarting ({attempt + 1}/{plan.max_restarts})")
    out.duration_sec = time.monotonic() - started
    return out


def _run_attempt(group: RankGroupSpec, plan: AttemptPlan, stop: StopChannel, out: LaunchResult,
                 attempt: int) -> bool:
    """Run one attempt and record how it ended in ``out``; True when it ends the launch."""
    with PortReservation(plan.master_addr) as port:
        attempt_dir = os.path.join(out.log_dir, f"attempt_{attempt}")
        ctx = start_group(group, plan.rank_envs(attempt, port.port, attempt_dir), attempt_dir, attempt=attempt)
        try:
            result = ctx.wait(plan.timeout, wake=stop.wake)
        except BaseException:  # KeyboardInterrupt in a library caller: never leave ranks behind
            ctx.close(signal.SIGTERM, group.grace)
            raise
        if result is None:
            return _stop_attempt(ctx, group, plan, stop, out)
        out.attempts.append(result)
        return _judge(result, out)


def _stop_attempt(ctx: ProcessContext, group: RankGroupSpec, plan: AttemptPlan, stop: StopChannel,
                  out: LaunchResult) -> bool:
    """The attempt was woken (a stop: it ends the launch) or timed out; close its ranks."""
    interrupted = stop.requested()
    sig = stop.signum() if interrupted else signal.SIGTERM
    result = ctx.close(sig, group.grace, wake=stop.wake, hurry=stop.hurry)
    out.attempts.append(result)
    if interrupted:
        out.status, out.error = "interrupted", "interrupted"
        return True
    out.status = "timeout"
    out.error = f"timeout: attempt {result.attempt} ran past {plan.timeout:g}s; its ranks were stopped"
    hung = [r.local_rank for r in result.ranks.values() if r.stopped]
    out.traceback = f"ranks still running at the timeout: {hung}"
    return False


def _judge(result: GroupResult, out: LaunchResult) -> bool:
    """An attempt whose ranks all ended: succeeded (ends the launch) or failed, with its root cause."""
    if not result.failed:
        out.status, out.error, out.traceback, out.root_cause = "succeeded", None, None, None
        return True
    out.status = "failed"
    out.root_cause = result.root_cause()
    if out.root_cause is not None:
        out.error, out.traceback = explain(out.root_cause)
    else:
        out.error, out.traceback = "the rank group failed", None
    return False
