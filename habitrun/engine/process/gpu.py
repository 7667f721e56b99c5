"""GPU pool detection and one-device-per-worker pinning.

Detection order: the runner's ``CUDA_VISIBLE_DEVICES`` when set (the user
or the batch system already chose the devices), else ``nvidia-smi -L``,
else none. No GPU detected means no capping: clamping workers to zero
would make no sense; the run says so (a warning, see :func:`no_gpu_reason`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping


def detect_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """Device ids a worker may be pinned to (``[]`` when none are detected)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        # CUDA stops at the first invalid entry; "-1" is the usual "no GPU".
        usable: list[str] = []
        for dev in ids:
            if dev.startswith("-"):
                break
            usable.append(dev)
        return usable
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    count = sum(1 for line in done.stdout.splitlines() if line.strip().startswith("GPU "))
    return [str(i) for i in range(count)]


def no_gpu_reason(env: Mapping[str, str] | None = None) -> str:
    """Why :func:`detect_gpus` found none, in the words of its detection order (for the warning)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return f"CUDA_VISIBLE_DEVICES={visible!r} names none"
    if shutil.which("nvidia-smi") is None:
        return "CUDA_VISIBLE_DEVICES is not set and there is no nvidia-smi"
    return "CUDA_VISIBLE_DEVICES is not set and nvidia-smi -L lists none"


def device_for_slot(devices: list[str], slot: int) -> str | None:
    """The device a worker in ``slot`` sees as its only GPU (``None``: leave it alone)."""
    if not devices:
        return None
    return devices[slot % len(devices)]
