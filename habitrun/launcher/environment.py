"""The environment of one rank: torchrun's variables, with torchrun's values, plus habitrun's two.

On one machine with one role torchrun sets (``python -m torch.distributed.run``):
RANK = LOCAL_RANK = ROLE_RANK, GROUP_RANK = 0, WORLD_SIZE = LOCAL_WORLD_SIZE =
ROLE_WORLD_SIZE = nproc, GROUP_WORLD_SIZE = 1, ROLE_NAME = default, and
OMP_NUM_THREADS = 1 when it is unset and more than one rank runs.

One deliberate difference: TORCHELASTIC_USE_AGENT_STORE is ``False``. torchrun's
agent hosts the rendezvous TCPStore itself; habitrun's launcher does not import
torch, so rank 0 hosts it on MASTER_PORT, which is what
``init_process_group("env://")`` does when that variable is False.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)
"""Every variable torchrun sets for a rank on one machine (compared with torchrun in a test)."""


def rank_env(
    local_rank: int,
    nprocs: int,
    *,
    run_id: str,
    restart_count: int,
    max_restarts: int,
    master_addr: str,
    master_port: int,
    error_file: str,
    inputs: str | None = None,
    workdir: str | None = None,
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of ``local_rank``: ``base`` (default os.environ), ``extra``, then ours."""
    env = dict(os.environ if base is None else base)
    env.update(extra or {})
    env.update(
        {
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(local_rank),
            "ROLE_NAME": "default",
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_ERROR_FILE": error_file,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        }
    )
    if "OMP_NUM_THREADS" not in env and nprocs > 1:
        env["OMP_NUM_THREADS"] = "1"
    if inputs is not None:
        env["HABITRUN_INPUTS"] = str(inputs)
    if workdir is not None:
        env["HABITRUN_WORKDIR"] = str(workdir)
    return env
