"""Train stages across nodes: ``launch.via`` (local agents, srun) from a recipe's stage to the ranks and back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from habitrun.engine.control import StopFlag
from habitrun.engine.train import run_train_stage
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec
from tests.launcher.conftest import is_alive, needs_torch

pytestmark = [pytest.mark.torch, needs_torch]
REPO = Path(__file__).resolve().parents[2]

TRAINER = '''
import json, os, time
from pathlib import Path

NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID")


def main():
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    work = Path(os.environ["HABITRUN_WORKDIR"])
    env = {name: os.environ.get(name) for name in NAMES}
    (work / f"rank{rank}.json").write_text(json.dumps({**env, "pid": os.getpid()}))
    dist.init_process_group("gloo")
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    while (work / "hang").exists():
        time.sleep(0.2)
    world = dist.get_world_size()
    dist.destroy_process_group()
    return {"rank": rank, "sum": float(value.item()), "world": world}
'''


@pytest.fixture
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    (root / "ops").mkdir(parents=True)
    (root / "ops" / "__init__.py").write_text("")
    (root / "ops" / "nodes_trainer.py").write_text(TRAINER)
    return root


def ranks(work: Path) -> dict[int, dict[str, str]]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in work.glob("rank*.json")}


HABITRUN_LIKE = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from habitrun.engine.control import StopFlag
from habitrun.engine.signals import stop_on_signals
from habitrun.engine.train import run_train_stage
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec
if __name__ == "__main__":
    stage = StageSpec(name="train", kind="train", entrypoint="ops.nodes_trainer:main",
                      launch={{"nnodes": 2, "nproc_per_node": 1, "via": "local", "rdzv_timeout_sec": 60}})
    tmp = Path({tmp!r})
    with stop_on_signals(StopFlag()) as stop:
        out = run_train_stage(stage, RunPolicy(graceful_shutdown_sec=3), stage_dir=tmp / "run",
                              workdir=tmp / "work", inputs={{}}, search_path=({root!r},), run_id="r", stop=stop)
    print("OUTCOME", out.ok, out.error, flush=True)
"""


@pytest.mark.timeout(120)
def test_sigterm_to_habitrun_leaves_no_rank_on_either_agent(study: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hang").touch()
    script = tmp_path / "habitrun_like.py"
    script.write_text(HABITRUN_LIKE.format(repo=str(REPO), tmp=str(tmp_path), root=str(study)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while len(ranks(work)) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the ranks never started"
            time.sleep(0.05)
        time.sleep(0.5)  # past the all_reduce, in the wait
        seen = ranks(work)
        assert {seen[0]["GROUP_RANK"], seen[1]["GROUP_RANK"]} == {"0", "1"}
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "OUTCOME False interrupted" in out, out
    pids = [int(r["pid"]) for r in ranks(work).values()]
    deadline = time.monotonic() + 10
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if is_alive(p)], "a rank outlived habitrun's SIGTERM"


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
@pytest.mark.timeout(150)
def test_a_train_stage_via_srun_runs_the_all_reduce_in_a_slurm_job(study: Path, tmp_path: Path) -> None:
    from tests.cluster.slurm import wait_no_jobs

    stage = StageSpec(name="train", kind="train", entrypoint="ops.nodes_trainer:main",
                      launch={"nnodes": 1, "nproc_per_node": 2, "via": "srun", "rdzv_timeout_sec": 60})
    stop = StopFlag()
    try:
        out = run_train_stage(stage, RunPolicy(graceful_shutdown_sec=3), stage_dir=tmp_path / "run",
                              workdir=tmp_path / "work", inputs={}, search_path=(str(study),), run_id="r", stop=stop)
    finally:
        stop.close()
    assert out.ok, (out.error, out.traceback)
    assert out.result == {"rank": 0, "sum": 3.0, "world": 2}
    seen = ranks(tmp_path / "work")
    assert sorted(seen) == [0, 1]
    assert seen[0]["SLURM_JOB_ID"] and seen[0]["SLURM_JOB_ID"] == seen[1]["SLURM_JOB_ID"], "not run by srun"
    assert seen[0]["GROUP_RANK"] == seen[1]["GROUP_RANK"] == "0"
    assert wait_no_jobs(15) == {}
