"""One node's agent of a multi-node rank group: ``python -m habitrun.launcher.agent SPEC.json``.

What torchrun's elastic agent does on each node, with c10d rendezvous: meet
the other nodes (``rendezvous``), start this node's ``nproc_per_node`` ranks
with the torchrun environment (RANK = GROUP_RANK * nproc + LOCAL_RANK,
WORLD_SIZE = nnodes * nproc, MASTER_ADDR/PORT of node 0), watch them and the
store together: the first rank failure on any node stops every node's ranks
and is the root cause (node, host, rank, message, traceback); the whole group
restarts up to ``max_restarts`` times. SIGTERM/SIGINT/SIGHUP stop every
node's ranks with that signal.

The spec (JSON) holds: ``nnodes``, ``nproc_per_node``, ``rdzv_endpoint``,
``rdzv_timeout_sec``, ``run_id``, ``max_restarts``, ``log_dir`` (shared by
all nodes), ``name``, ``grace``, ``cwd``, ``env``, ``inputs``, ``workdir``,
``start_method``, and either ``command`` (argv) or ``function``
("module:attr") with ``args``. The agent writes ``log_dir/agent_<id>.json``
(its outcome) and node 0 ``log_dir/return_value.pkl`` (global rank 0's value).
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from habitrun.errors import LaunchError
from habitrun.launcher.groupspec import RankGroupSpec
from habitrun.launcher.ports import PortReservation
from habitrun.launcher.processes import start_group
from habitrun.launcher.rendezvous import Rendezvous
from habitrun.launcher.results import GroupResult
from habitrun.launcher.std import Std
from habitrun.launcher.supervisor import AttemptPlan, explain

POLL_SEC = 0.1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def agent_id() -> str:
    """This agent's name among its peers: srun's task id, else the one the starter gave."""
    return os.environ.get("SLURM_PROCID") or os.environ.get("HABITRUN_AGENT_ID", str(os.getpid()))


def _entry(spec: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    if spec.get("command"):
        return list(spec["command"]), ()
    module, _, attr = str(spec["function"]).partition(":")
    fn = getattr(importlib.import_module(module), attr)
    return fn, tuple(spec.get("args", ()))


class _Signals:
    """The stop signal this agent received, delivered through a pipe the wait can watch."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        self.signum: int | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on)

    def _on(self, signum: int, _frame: Any) -> None:
        self.signum = self.signum or signum
        try:
            os.write(self.w, b"x")
        except OSError:
            pass


def run_agent(spec: dict[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    """Run this node's part of the group to the end; this agent's outcome (also written to its file)."""
    nnodes, nproc = int(spec["nnodes"]), int(spec["nproc_per_node"])
    log_dir = str(spec["log_dir"])
    me = agent_id()
    host = socket.gethostname()
    sigs = _Signals()
    outcome: dict[str, Any] = {"agent": me, "host": host, "status": "failed", "error": None,
                               "traceback": None, "attempts": 0, "group_rank": None}
    rdzv = None
    try:
        rdzv = Rendezvous(str(spec["rdzv_endpoint"]), nnodes, str(spec["run_id"]), float(spec["rdzv_timeout_sec"]))
        for round_ in range(int(spec.get("max_restarts", 0)) + 1):
            outcome.update(_round(spec, rdzv, round_, nproc, nnodes, host, sigs, log_dir))
            outcome["attempts"] = round_ + 1
            if outcome["status"] != "failed" or round_ == int(spec.get("max_restarts", 0)):
                break
            say(f"[{spec.get('name', 'train')}] node {rdzv.group_rank} attempt {round_} failed: "
                f"{outcome['error']}; restarting ({round_ + 1}/{spec.get('max_restarts', 0)})")
    except LaunchError as exc:
        stopped = sigs.signum is not None
        outcome.update(status="interrupted" if stopped else "failed", error="interrupted" if stopped else str(exc))
    finally:
        if rdzv is not None:
            try:
                rdzv.leave()
            except Exception:  # noqa: BLE001 - the hosting agent is gone: nothing left to tell
                pass
    with open(os.path.join(log_dir, f"agent_{me}.json"), "w", encoding="utf-8") as f:
        json.dump(outcome, f)
    return outcome


def _round(spec: dict[str, Any], rdzv: Rendezvous, round_: int, nproc: int, nnodes: int, host: str,
           sigs: _Signals, log_dir: str) -> dict[str, Any]:
    """One attempt of the whole group, seen from this node."""
    reservation: list[PortReservation] = []

    def master_port(addr: str) -> int:
        reservation.append(PortReservation(addr))
        return reservation[0].port

    try:
        group_rank, master_addr, port = rdzv.join(round_, master_port, stopped=lambda: sigs.signum is not None)
        attempt_dir = os.path.join(log_dir, f"attempt_{round_}", f"node_{group_rank}")
        world = nnodes * nproc
        plan = AttemptPlan(nproc, str(spec["run_id"]), max_restarts=int(spec.get("max_restarts", 0)),
                           master_addr=master_addr, env=spec.get("env") or {}, inputs=spec.get("inputs"),
                           workdir=spec.get("workdir"))
        envs = plan.rank_envs(round_, port, attempt_dir)
        for local, env in envs.items():  # this node's ranks within the whole group
            rank = group_rank * nproc + local
            env.update(RANK=str(rank), GROUP_RANK=str(group_rank), ROLE_RANK=str(rank), WORLD_SIZE=str(world),
                       ROLE_WORLD_SIZE=str(world), GROUP_WORLD_SIZE=str(nnodes))
        entry, args = _entry(spec)
        grace = float(spec.get("grace", 15.0))
        group = RankGroupSpec(entry, dict.fromkeys(range(nproc), args), name=str(spec.get("name", "train")),
                              redirects=Std.NONE, tee=Std.ALL, start_method=str(spec.get("start_method", "spawn")),
                              cwd=spec.get("cwd"), grace=grace, period=POLL_SEC)
        ctx = start_group(group, envs, attempt_dir, attempt=round_)
        result = _watch(ctx, rdzv, sigs, grace, group_rank, host, nproc)
    finally:
        for r in reservation:
            r.release()
    return _verdict(rdzv, result, group_rank, log_dir)


def _watch(ctx: Any, rdzv: Rendezvous, sigs: _Signals, grace: float, group_rank: int, host: str,
           nproc: int) -> GroupResult:
    """Wait for this node's ranks, another node's failure, or a stop; stop the ranks when told."""
    while True:
        result = ctx.wait(POLL_SEC, wake=[sigs.r])
        if sigs.signum is not None:
            rdzv.request_stop(sigs.signum)
            return ctx.close(sigs.signum, grace)
        if result is not None:
            if result.failed:
                cause = result.root_cause()
                if cause is not None:
                    error, tb = explain(cause)
                    rank = group_rank * nproc + cause.local_rank
                    rdzv.report_failure({"node": group_rank, "host": host, "rank": rank,
                                         "at": cause.ended_at or time.time(),
                                         "error": f"node {group_rank} ({host}), global rank {rank}: {error}",
                                         "traceback": tb})
                return result
            rdzv.node_done()
            while not rdzv.all_done():  # our ranks are done: wait for the other nodes' (or a failure)
                if rdzv.failed() or rdzv.stop_requested() is not None or sigs.signum is not None:
                    break
                time.sleep(POLL_SEC)
            return result
        stop = rdzv.stop_requested()
        if stop is not None:
            return ctx.close(stop, grace)
        if rdzv.failed():
            return ctx.close(signal.SIGTERM, grace)


def _verdict(rdzv: Rendezvous, result: GroupResult, group_rank: int, log_dir: str) -> dict[str, Any]:
    failure = rdzv.root_cause()
    base = {"group_rank": group_rank}
    if failure is None and rdzv.failed():
        failure = {"node": None, "host": None, "rank": None, "traceback": None,
                   "error": "a node's rank group failed without a rank to blame"}
    if failure is not None:
        return {**base, "status": "failed", "error": failure["error"], "traceback": failure.get("traceback"),
                "root_cause": {k: failure[k] for k in ("node", "host", "rank")}}
    if rdzv.stop_requested() is not None:
        return {**base, "status": "interrupted", "error": "interrupted", "traceback": None}
    if result.failed:  # failed without an error we could name (e.g. killed by the stop of another node)
        return {**base, "status": "failed", "error": f"node {group_rank}: the rank group failed", "traceback": None}
    if group_rank == 0:
        with open(os.path.join(log_dir, "return_value.pkl"), "wb") as f:
            pickle.dump(result.return_values.get(0), f)
    return {**base, "status": "succeeded", "error": None, "traceback": None}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m habitrun.launcher.agent SPEC.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        spec = json.load(f)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    run_agent(spec, say)
    return 0  # the outcome is in the agent file; non-zero only when the agent itself broke


if __name__ == "__main__":
    sys.exit(main())
