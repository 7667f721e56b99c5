"""Run a multi-node rank group: one agent per node (``agent``), started here or through ``srun``.

``via="local"`` starts the ``nnodes`` agents on this machine (trying a
multi-node recipe out, tests); ``via="srun"`` starts them with ``srun --nodes N
--ntasks-per-node 1`` inside (or as) a SLURM allocation, the rendezvous on the
allocation's first host unless ``rdzv_endpoint`` says otherwise. No
``--node-rank`` is ever passed: c10d rendezvous orders the nodes itself.

A stop (a readable ``wake`` fd) sends ``stop_signal()`` (default SIGTERM) to
the agents, which stop every node's ranks with it; past the grace they are
killed. The outcome comes from the agents' files in ``log_dir``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import multiprocessing.connection as mpc
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from habitrun.errors import LaunchError
from habitrun.launcher.lifeline import die_with_parent
from habitrun.launcher.ports import PortReservation
from habitrun.launcher.rendezvous import SLURM_FIRST_HOST
from habitrun.launcher.signalling import StopChannel

AGENT_CRASH_GRACE_SEC = 10.0  # the other agents' time to notice on their own before they are stopped


@dataclass
class NodesResult:
    """How a multi-node launch ended. ``status``: succeeded, failed or interrupted."""

    status: str
    log_dir: str
    attempts: int
    return_value: Any = None
    error: str | None = None
    traceback: str | None = None
    root_cause: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


def agent_command(spec_path: str, *, via: str, nnodes: int, srun_args: Sequence[str] = ()) -> list[str]:
    """The argv that starts the agents (all ``nnodes`` of them for srun, one for local)."""
    agent = [sys.executable, "-m", "habitrun.launcher.agent", spec_path]
    if via == "srun":
        return ["srun", "--nodes", str(nnodes), "--ntasks-per-node", "1", "--ntasks", str(nnodes),
                "--kill-on-bad-exit=1", *srun_args, *agent]
    return agent


def launch_nodes(
    spec: dict[str, Any],
    *,
    via: str,
    log_dir: str,
    grace: float = 15.0,
    wake: Sequence[int] = (),
    hurry: Callable[[], bool] | None = None,
    stop_signal: Callable[[], int | None] | None = None,
    srun_args: Sequence[str] = (),
) -> NodesResult:
    """Start the agents for ``spec`` (see ``agent``), wait for them, and read their outcome."""
    nnodes = int(spec["nnodes"])
    log_dir = os.path.abspath(log_dir)
    os.makedirs(log_dir, exist_ok=True)
    for old in [*glob.glob(os.path.join(log_dir, "agent_*.json")), os.path.join(log_dir, "return_value.pkl")]:
        with contextlib.suppress(OSError):
            os.unlink(old)
    spec = {**spec, "nnodes": nnodes, "log_dir": log_dir}
    if not spec.get("rdzv_endpoint"):
        with PortReservation("127.0.0.1") as port:  # a free port here; on a cluster's first host, likely too
            spec["rdzv_endpoint"] = (f"127.0.0.1:{port.port}" if via == "local"
                                     else f"{SLURM_FIRST_HOST}:{port.port}")
    spec_path = os.path.join(log_dir, "agents.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2)
    procs = _start(spec_path, via=via, nnodes=nnodes, srun_args=srun_args)
    interrupted = _wait(procs, grace=grace, stop=StopChannel(wake, hurry, stop_signal))
    return _outcome(log_dir, nnodes, interrupted, [p.returncode for p in procs])


def _start(spec_path: str, *, via: str, nnodes: int, srun_args: Sequence[str]) -> list[subprocess.Popen[bytes]]:
    parent = os.getpid()
    procs: list[subprocess.Popen[bytes]] = []
    count = 1 if via == "srun" else nnodes
    try:
        for i in range(count):
            env = {**os.environ, "HABITRUN_AGENT_ID": str(i)}
            procs.append(subprocess.Popen(  # noqa: S603 - our own argv, never a shell
                agent_command(spec_path, via=via, nnodes=nnodes, srun_args=srun_args), env=env,
                preexec_fn=lambda: die_with_parent(parent, signal.SIGTERM),  # noqa: PLW1509
            ))
    except OSError as exc:
        for p in procs:
            p.kill()
            p.wait()
        what = "srun (is this a SLURM node?)" if via == "srun" else "the node agent"
        raise LaunchError(f"cannot start {what}: {exc}") from None
    return procs


def _wait(procs: list[subprocess.Popen[bytes]], *, grace: float, stop: StopChannel) -> bool:
    """Until every agent has exited; True if a stop was asked for."""
    stopped_at: float | None = None
    crash_at: float | None = None
    killed = False
    while any(p.poll() is None for p in procs):
        if stop.wake:
            ready = mpc.wait(list(stop.wake), 0.1)
        else:
            time.sleep(0.1)
            ready = []
        now = time.monotonic()
        if ready:
            stop.drain()
        if ready and stopped_at is None:
            _signal(procs, stop.signum())
            stopped_at = now
        elif ready and stop.hurried() and not killed:
            _signal(procs, signal.SIGKILL)
            killed = True
        if crash_at is None and any(p.returncode not in (None, 0) for p in procs):
            crash_at = now  # an agent broke: the others get a moment to see it in the store
        if crash_at is not None and now - crash_at > AGENT_CRASH_GRACE_SEC and stopped_at is None:
            _signal(procs, signal.SIGTERM)
            stopped_at = now
        if stopped_at is not None and now - stopped_at > grace + AGENT_CRASH_GRACE_SEC and not killed:
            _signal(procs, signal.SIGKILL)
            killed = True
    return stopped_at is not None and crash_at is None


def _signal(procs: list[subprocess.Popen[bytes]], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.send_signal(sig)


def _outcome(log_dir: str, nnodes: int, interrupted: bool, codes: list[int | None]) -> NodesResult:
    agents = []
    for path in sorted(glob.glob(os.path.join(log_dir, "agent_*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                agents.append(json.load(f))
        except (OSError, ValueError):
            continue
    attempts = max((int(a.get("attempts") or 0) for a in agents), default=0)
    failed = [a for a in agents if a.get("status") == "failed"]
    if failed:
        first = next((a for a in failed if a.get("root_cause")), failed[0])
        return NodesResult("failed", log_dir, attempts, error=first.get("error"), traceback=first.get("traceback"),
                           root_cause=first.get("root_cause"))
    if interrupted or any(a.get("status") == "interrupted" for a in agents):
        return NodesResult("interrupted", log_dir, attempts, error="interrupted")
    if len(agents) < nnodes or any(a.get("status") != "succeeded" for a in agents):
        return NodesResult("failed", log_dir, attempts,
                           error=f"{nnodes - len(agents)} of {nnodes} node agent(s) ended without an outcome "
                                 f"(exit codes {codes}); see the agents' output above")
    value = None
    with contextlib.suppress(OSError, pickle.UnpicklingError, EOFError):
        with open(os.path.join(log_dir, "return_value.pkl"), "rb") as f:
            value = pickle.load(f)
    return NodesResult("succeeded", log_dir, attempts, return_value=value)
