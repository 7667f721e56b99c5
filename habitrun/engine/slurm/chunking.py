"""How a stage's subjects are cut into array tasks: chunks of about ``chunk_minutes``, arrays within MaxArraySize.

A chunk is the work of one array task (one warm worker session). Too small and
the queue and start-up cost dominates (each task waits in the queue and starts
a Python); too large and a lost task loses much and the tail of the stage is
long. With learned durations a chunk is sized to take about ``chunk_minutes``
of its task's ``workers``, or less when that still leaves each of up to 100
tasks a minute of work; without, a stage is cut into about 100 tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from habitrun.spec.policy import SlurmSettings

T = TypeVar("T")

FIRST_RUN_TASKS = 100
"""Without history a stage becomes about this many array tasks (fewer when it has fewer subjects)."""

MIN_TASK_SEC = 60.0
"""With learned durations a chunk holds at least this much work (when the target allows): spreading a
stage over more tasks than that only buys queueing and start-up (each task waits and starts a Python)."""

TIME_SHARE = 0.8
"""Share of a task's wall time before its warning (``time - signal_sec``) that its chunk may fill."""


def chunk_size(subjects: int, workers: int, typical_sec: float | None, settings: SlurmSettings) -> int:
    """Subjects per array task (≥ 1).

    ``settings.chunk_size`` when set; else, knowing a typical subject's duration, as many as
    ``workers`` finish in ``chunk_minutes`` (and, with a ``time`` limit, in 80% of the time left
    before the warning signal) -- fewer when that spreads the stage over up to 100 tasks of at
    least a minute of work each (a big cluster runs them side by side) --, at most the stage's
    subjects; the tasks that makes evenly filled (2000 of 1200 at most: two of 1000, not 1200 and 800);
    else ``ceil(subjects / 100)``.
    """
    if settings.chunk_size is not None:
        return settings.chunk_size
    if typical_sec is None:
        return max(1, math.ceil(subjects / FIRST_RUN_TASKS))
    wall = settings.chunk_minutes * 60.0
    time_sec = settings.time_sec()
    if time_sec is not None:
        wall = min(wall, max(0.0, time_sec - settings.signal_sec) * TIME_SHARE)
    per_subject = max(typical_sec, 1e-3) / max(1, workers)  # a task's wall time per subject
    by_target = math.floor(wall / per_subject)
    spread = max(math.ceil(subjects / FIRST_RUN_TASKS), math.ceil(MIN_TASK_SEC / per_subject))
    size = max(1, min(by_target, spread, subjects))
    tasks = math.ceil(subjects / size) if subjects else 1
    return max(1, math.ceil(subjects / tasks))  # the same number of tasks, evenly filled


def split(tasks: Sequence[T], size: int) -> list[list[T]]:
    """``tasks`` in chunks of ``size`` (the last one may be shorter), in their order."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, not {size}")
    return [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]


def array_parts(chunks: int, max_array_size: int) -> list[tuple[int, int]]:
    """(offset, count) of each ``sbatch --array=0-(count-1)`` call submitting ``chunks`` chunks.

    Task indices must be below the cluster's MaxArraySize, so a larger batch is several arrays;
    chunk index = offset + SLURM_ARRAY_TASK_ID.
    """
    if max_array_size < 1:
        raise ValueError(f"max array size must be at least 1, not {max_array_size}")
    return [(offset, min(max_array_size, chunks - offset)) for offset in range(0, max(0, chunks), max_array_size)]
