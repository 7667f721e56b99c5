"""Multi-node rank groups: one agent per node, c10d rendezvous on torch's TCPStore, real gloo all_reduce.

The "nodes" are two agent processes on this machine (``via: local``), each with its own ranks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from habitrun.launcher.nodes import launch_nodes
from tests.launcher.conftest import needs_torch

pytestmark = [pytest.mark.torch, needs_torch]
REPO = Path(__file__).resolve().parents[2]


def spec(marker_dir: Path, nnodes: int = 2, nproc: int = 1, max_restarts: int = 0, **kwargs: Any) -> dict[str, Any]:
    return {"nnodes": nnodes, "nproc_per_node": nproc, "rdzv_timeout_sec": 60, "run_id": "t",
            "max_restarts": max_restarts, "name": "train", "grace": 3, "cwd": str(REPO),
            "function": "tests.launcher.multinode_ranks:all_reduce", "args": [str(marker_dir), *kwargs.values()]}


def envs(marker_dir: Path, attempt: int = 0) -> dict[int, dict[str, Any]]:
    return {int(json.loads(p.read_text())["RANK"]): json.loads(p.read_text())
            for p in marker_dir.glob(f"rank*-attempt{attempt}.json")}


@pytest.mark.timeout(120)
def test_two_agents_run_a_real_all_reduce_and_agree_on_ranks(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    result = launch_nodes(spec(marks), via="local", log_dir=str(tmp_path / "logs"))
    assert result.ok, (result.error, result.traceback)
    assert result.return_value == {"rank": 0, "sum": 3.0, "world": 2}
    seen = envs(marks)
    assert sorted(seen) == [0, 1]
    assert {seen[r]["GROUP_RANK"] for r in seen} == {"0", "1"}
    for rank, env in seen.items():
        assert env["GROUP_RANK"] == str(rank) and env["ROLE_RANK"] == str(rank) and env["LOCAL_RANK"] == "0"
        assert env["WORLD_SIZE"] == "2" and env["ROLE_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["LOCAL_WORLD_SIZE"] == "1"
    assert seen[0]["MASTER_ADDR"] == seen[1]["MASTER_ADDR"] == "127.0.0.1"
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]
    assert (tmp_path / "logs" / "attempt_0" / "node_0").is_dir() and (tmp_path / "logs" / "attempt_0" / "node_1").is_dir()


@pytest.mark.timeout(120)
def test_a_rank_failing_on_agent_1_restarts_both_groups_of_two_ranks(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    # global rank 3 is node 1's second rank; it fails in attempt 0 only
    result = launch_nodes(spec(marks, nproc=2, max_restarts=1, fail_rank=3, fail_attempts=1), via="local",
                          log_dir=str(tmp_path / "logs"))
    assert result.ok, (result.error, result.traceback)
    assert result.attempts == 2
    assert result.return_value == {"rank": 0, "sum": 10.0, "world": 4}
    first, second = envs(marks, 0), envs(marks, 1)
    assert sorted(second) == [0, 1, 2, 3]
    assert {e["pid"] for e in first.values()}.isdisjoint(e["pid"] for e in second.values())
    for rank, env in second.items():
        assert env["GROUP_RANK"] == str(rank // 2) and env["LOCAL_RANK"] == str(rank % 2)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "1"


@pytest.mark.timeout(120)
def test_without_restarts_the_failure_is_the_root_cause_with_node_rank_and_traceback(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    started = time.monotonic()
    result = launch_nodes(spec(marks, fail_rank=1, fail_attempts=1), via="local", log_dir=str(tmp_path / "logs"))
    assert result.status == "failed"
    assert result.root_cause is not None and result.root_cause["rank"] == 1 and result.root_cause["node"] == 1
    assert "node 1" in result.error and "global rank 1" in result.error
    assert "fails on purpose in attempt 0" in result.error
    assert "RuntimeError" in (result.traceback or "")
    assert time.monotonic() - started < 60, "rank 0 should have been stopped, not left waiting for its peer"


@pytest.mark.timeout(60)
def test_a_node_that_never_comes_is_named_after_rdzv_timeout_sec() -> None:
    from habitrun.errors import LaunchError
    from habitrun.launcher.ports import PortReservation
    from habitrun.launcher.rendezvous import Rendezvous

    with PortReservation() as reserved:
        port = reserved.port
    rdzv = Rendezvous(f"127.0.0.1:{port}", 2, "t", 1.0)
    try:
        assert rdzv.hosting
        with pytest.raises(LaunchError, match=r"only 1 of 2 nodes joined within 1 s \(rdzv_timeout_sec\)"):
            rdzv.join(0, lambda addr: 1)
    finally:
        del rdzv
