"""BLAS/OpenMP thread caps for worker processes.

Two workers on two cores each starting a BLAS pool as wide as the machine
oversubscribe it badly; the caps override (never ``setdefault``) whatever
the runner's shell exported, and must be in place before the operator's
module loads its native libraries, because most read them only once.
"""

from __future__ import annotations

import os
import sys

THREAD_ENV_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)


def thread_env(threads: int) -> dict[str, str]:
    """The environment entries that cap every common thread pool to ``threads``."""
    value = str(max(1, int(threads)))
    return dict.fromkeys(THREAD_ENV_VARS, value)


def apply_thread_caps(threads: int) -> None:
    """Set the caps in this (worker) process; tell torch too if it is already loaded."""
    os.environ.update(thread_env(threads))
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(max(1, int(threads)))
        except Exception:  # noqa: BLE001 - a broken torch must not stop the worker
            pass
