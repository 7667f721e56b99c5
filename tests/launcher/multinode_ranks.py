"""Rank functions for the multi-node tests: a real gloo all_reduce across the agents' ranks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV_NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
             "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def all_reduce(marker_dir: str, fail_rank: int = -1, fail_attempts: int = 0, hang: bool = False) -> dict:
    """Sum every rank's (rank + 1) with gloo; record this rank's environment and pid in ``marker_dir``.

    ``fail_rank`` raises before the collective in the first ``fail_attempts`` attempts; ``hang``
    waits forever after it (for stop tests).
    """
    import torch
    import torch.distributed as dist

    env = {name: os.environ.get(name) for name in ENV_NAMES}
    rank = int(env["RANK"])
    attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
    Path(marker_dir, f"rank{rank}-attempt{attempt}.json").write_text(json.dumps({**env, "pid": os.getpid()}))
    if rank == fail_rank and attempt < fail_attempts:
        raise RuntimeError(f"rank {rank} fails on purpose in attempt {attempt}")
    dist.init_process_group("gloo")
    try:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        if hang:
            while True:
                time.sleep(1)
        return {"rank": rank, "sum": float(value.item()), "world": dist.get_world_size()}
    finally:
        dist.destroy_process_group()
