"""The one-node SLURM of ``slurm_up.sh`` for the tests marked ``slurm``: start it once, ask it about jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
UP = HERE / "slurm_up.sh"
DOWN = HERE / "slurm_down.sh"


def why_not_available() -> str | None:
    """None once the node is idle (starting it if needed), else why SLURM cannot run here."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "SLURM needs a POSIX host"
    if os.geteuid() != 0:
        return "slurm_up.sh must run as root (it installs packages and starts slurmctld/slurmd)"
    if shutil.which("sinfo") is None and shutil.which("apt-get") is None:
        return "SLURM is not installed and there is no apt-get to install it"
    try:
        done = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "slurm_up.sh did not finish within 600 s"
    if done.returncode != 0:
        return f"slurm_up.sh failed (exit {done.returncode}): {done.stderr.strip()[-800:]}"
    return None


def jobs(name: str | None = None) -> dict[str, str]:
    """Jobs in ``squeue`` now (job id -> state), optionally only those named ``name``."""
    cmd = ["squeue", "--noheader", "--format=%i %T"]
    if name:
        cmd.append(f"--name={name}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


def wait_no_jobs(timeout: float = 30.0, name: str | None = None) -> dict[str, str]:
    """Jobs still queued or running after waiting up to ``timeout`` s for none to be left."""
    deadline = time.monotonic() + timeout
    left = jobs(name)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = jobs(name)
    return left


def job_of(pid: int) -> str | None:
    """The SLURM job a process runs in (its SLURM_JOB_ID), None if it is not in one or is gone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"SLURM_JOB_ID="):
            return item.split(b"=", 1)[1].decode()
    return None
