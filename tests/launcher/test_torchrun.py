"""The same ranks under torchrun and under habitrun: same variable names, same meaning, a real gloo all-reduce.

(Function ranks running DistributedDataParallel over gloo: the demo test in test_train_stage.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from habitrun.launcher import TORCHRUN_VARIABLES, launch
from tests.launcher.conftest import needs_torch

pytestmark = [pytest.mark.torch, needs_torch]

RANK_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
base = set(json.load(open(os.environ["BASE_KEYS_FILE"])))
new = {k: v for k, v in os.environ.items() if k not in base}
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"env": new, "sum": t.item()}, f)
"""
# PYTHONFAULTHANDLER: habitrun sets it for command ranks (a segfault leaves a stack in the rank's stderr)
IGNORED = {"_", "BASE_KEYS_FILE", "PYTHONPATH", "HABITRUN_INPUTS", "HABITRUN_WORKDIR", "PYTHONFAULTHANDLER"}


@pytest.mark.timeout(240)
def test_torchrun_and_habitrun_give_ranks_the_same_environment(tmp_path, console):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    (tmp_path / "base.json").write_text(json.dumps(sorted([*env, "BASE_KEYS_FILE"])))
    env["BASE_KEYS_FILE"] = str(tmp_path / "base.json")
    runs = {}
    for who in ("torchrun", "habitrun"):
        out = tmp_path / who
        out.mkdir()
        if who == "torchrun":
            proc = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                 "--log_dir", str(tmp_path / "torchrun_logs"), str(script), str(out)],
                env=env, capture_output=True, text=True, timeout=200,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
        else:
            result = launch([sys.executable, str(script), str(out)], nprocs=2, log_dir=tmp_path / "ours",
                            env={"BASE_KEYS_FILE": env["BASE_KEYS_FILE"]}, console=console,
                            base_env=env)
            assert result.ok, (result.error, result.traceback)
        runs[who] = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}

    theirs, ours = runs["torchrun"], runs["habitrun"]
    for rank in range(2):
        t_env, o_env = theirs[rank]["env"], ours[rank]["env"]
        assert set(t_env) - IGNORED == set(o_env) - IGNORED  # the same names ...
        assert set(t_env) - IGNORED == set(TORCHRUN_VARIABLES)
        for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
                     "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                     "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS",
                     "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
            assert t_env[name] == o_env[name], name  # ... and the same values
        for e in (t_env, o_env):  # same meaning where values must differ
            assert int(e["MASTER_PORT"]) > 0 and e["TORCHELASTIC_RUN_ID"]
            assert e["TORCHELASTIC_ERROR_FILE"].endswith(os.path.join("attempt_0", str(rank), "error.json"))
        # torchrun's agent hosts the store; habitrun's rank 0 does (documented in environment.py)
        assert (t_env["TORCHELASTIC_USE_AGENT_STORE"], o_env["TORCHELASTIC_USE_AGENT_STORE"]) == ("True", "False")
        assert theirs[rank]["sum"] == ours[rank]["sum"] == 3.0
