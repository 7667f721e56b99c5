"""c10d-style rendezvous of the node agents of a multi-node rank group, on torch's TCPStore.

One agent per node meets the others at ``rdzv_endpoint`` (host:port). The
agent that can bind the endpoint hosts the store (on the endpoint's host;
with several agents on one host the first one), the others connect to it.
Each round (the group's first start, then every restart) the agents join
under a fresh key prefix and get their GROUP_RANK in order of arrival, as
torchrun's c10d backend does (never from a --node-rank). Node 0 then
publishes MASTER_ADDR:MASTER_PORT for the ranks' own process group.

During a round the store carries what every agent must know at once: the
first failure (node, rank, message, traceback), a stop request, and how many
nodes have finished. torch is imported only here, and only by agents.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import time
from typing import Any

from habitrun.errors import LaunchError


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); a clear error otherwise."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"rdzv_endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


SLURM_FIRST_HOST = "slurm-first-host"  # an endpoint host the agents resolve from their SLURM step


def resolve_endpoint(endpoint: str) -> str:
    """``slurm-first-host:PORT`` -> the first host of this SLURM step's (or job's) node list."""
    host, port = parse_endpoint(endpoint)
    if host != SLURM_FIRST_HOST:
        return endpoint
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise LaunchError("the rendezvous is on the SLURM allocation's first host, but this agent "
                          "runs outside SLURM (no SLURM_STEP_NODELIST); give rdzv_endpoint: host:port")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise LaunchError(f"cannot expand the SLURM node list {nodelist!r} with scontrol: {exc}") from None
    if not out:
        raise LaunchError(f"the SLURM node list {nodelist!r} names no host")
    return f"{out[0]}:{port}"


def address_towards(host: str, port: int) -> str:
    """This node's address as seen on the route to ``host:port`` (what other nodes can reach)."""
    with socket.create_connection((host, port), timeout=30) as sock:
        return str(sock.getsockname()[0])


class Rendezvous:
    """This agent's handle on the group's store."""

    def __init__(self, endpoint: str, nnodes: int, run_id: str, timeout_sec: float) -> None:
        from torch.distributed import TCPStore

        endpoint = resolve_endpoint(endpoint)
        self.host, self.port = parse_endpoint(endpoint)
        self.nnodes = nnodes
        self.run_id = run_id
        self.timeout_sec = timeout_sec
        timeout = datetime.timedelta(seconds=timeout_sec)
        self.hosting = False
        try:
            self.store = TCPStore(self.host, self.port, None, True, timeout, wait_for_workers=False)
            self.hosting = True
        except Exception:  # noqa: BLE001 - the port is taken (another agent hosts) or not ours: connect
            try:
                self.store = TCPStore(self.host, self.port, None, False, timeout)
            except Exception as exc:  # noqa: BLE001 - torch's message names the endpoint
                raise LaunchError(f"cannot reach the rendezvous store at {endpoint} within "
                                  f"{timeout_sec:g} s (rdzv_timeout_sec): {exc}") from None
        self.round = -1
        self.group_rank = -1
        self._stopped: Any = lambda: False

    def _key(self, name: str) -> str:
        return f"habitrun/{self.run_id}/{self.round}/{name}"

    def _wait_for(self, name: str, what: Any) -> None:
        """Wait for a key in short slices, so a stop (a signal to the agent) is seen within a second."""
        deadline = time.monotonic() + self.timeout_sec
        while not self.store.check([self._key(name)]):
            if self._stopped():
                raise LaunchError("interrupted")
            if time.monotonic() >= deadline:
                raise LaunchError(f"rendezvous round {self.round}: {what()} within {self.timeout_sec:g} s "
                                  "(rdzv_timeout_sec)")
            time.sleep(0.05)

    def join(self, round_: int, master_port: Any, stopped: Any = lambda: False) -> tuple[int, str, int]:
        """Meet the other nodes for ``round_``: (group rank, MASTER_ADDR, MASTER_PORT).

        ``master_port`` is called by node 0 only, to reserve the ranks' port on its host;
        ``stopped()`` True ends the wait with LaunchError("interrupted").
        """
        self._stopped = stopped
        self.round = round_
        arrived = int(self.store.add(self._key("joined"), 1))
        if arrived > self.nnodes:
            raise LaunchError(f"rendezvous round {round_}: more agents than nnodes={self.nnodes} joined")
        self.group_rank = arrived - 1
        if arrived == self.nnodes:
            self.store.set(self._key("complete"), "1")
        self._wait_for("complete", lambda: f"only {int(self.store.add(self._key('joined'), 0))} of "
                                           f"{self.nnodes} nodes joined")
        if self.group_rank == 0:
            addr = "127.0.0.1" if self.host in ("127.0.0.1", "localhost") else address_towards(self.host, self.port)
            self.store.set(self._key("master"), f"{addr}:{master_port(addr)}")
        self._wait_for("master", lambda: "node 0 did not publish MASTER_ADDR")
        addr, _, port = self.store.get(self._key("master")).decode().rpartition(":")
        return self.group_rank, addr, int(port)

    # -- during a round
    def report_failure(self, info: dict[str, Any]) -> None:
        """Record this node's own failure (``info["at"]``: when its failing rank exited)."""
        self.store.set(self._key(f"failure/{self.group_rank}"), json.dumps(info))
        self.store.add(self._key("failures"), 1)

    def failed(self) -> bool:
        """Has any node's rank failed in this round?"""
        return int(self.store.add(self._key("failures"), 0)) > 0

    def root_cause(self, settle_sec: float = 1.0) -> dict[str, Any] | None:
        """The earliest of the nodes' own failures (a rank whose peer died fails too, later).

        Waits ``settle_sec`` so that a node whose rank failed at about the same time can report.
        """
        if not self.failed():
            return None
        time.sleep(settle_sec)
        found = []
        for node in range(self.nnodes):
            key = self._key(f"failure/{node}")
            if self.store.check([key]):
                found.append(json.loads(self.store.get(key).decode()))
        return min(found, key=lambda f: (f.get("at") or float("inf"), f.get("rank", 0))) if found else None

    def request_stop(self, signum: int) -> None:
        self.store.set(self._key("stop"), str(signum))

    def stop_requested(self) -> int | None:
        if not self.store.check([self._key("stop")]):
            return None
        return int(self.store.get(self._key("stop")).decode())

    def node_done(self) -> None:
        self.store.add(self._key("done"), 1)

    def all_done(self) -> bool:
        return int(self.store.add(self._key("done"), 0)) >= self.nnodes

    def leave(self, wait_sec: float = 30.0) -> None:
        """Say this agent is finished; the hosting agent waits for the others before its store goes."""
        key = f"habitrun/{self.run_id}/left"
        self.store.add(key, 1)
        if self.hosting:
            deadline = time.monotonic() + wait_sec
            while int(self.store.add(key, 0)) < self.nnodes and time.monotonic() < deadline:
                time.sleep(0.05)
