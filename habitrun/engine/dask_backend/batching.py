"""How many subjects travel in one Dask task.

A Dask task costs a few milliseconds of scheduler and client work, which
dwarfs a 1 ms subject; a batch of them amortises it. Batches start at one
subject (nothing is known about the operator yet) and grow towards
``target_sec`` of work as durations come back, never so large that the
stage's tail runs on one worker while the others idle. Slow subjects (the
ones that time out or run out of memory) therefore travel alone.
"""

from __future__ import annotations

import math


class BatchSizer:
    """Running estimate of a subject's duration -> the next batch's size."""

    def __init__(self, target_sec: float, max_size: int = 1000, smoothing: float = 0.3) -> None:
        self.target_sec = target_sec
        self.max_size = max_size
        self.smoothing = smoothing
        self.mean_sec: float | None = None

    def observe(self, durations: list[float]) -> None:
        """Fold a finished batch's subject durations into the estimate."""
        if not durations:
            return
        batch_mean = sum(durations) / len(durations)
        if self.mean_sec is None:
            self.mean_sec = batch_mean
        else:
            self.mean_sec += self.smoothing * (batch_mean - self.mean_sec)

    def next_size(self, remaining: int, slots: int) -> int:
        """Subjects for the next batch, given those left to submit and the in-flight slots."""
        if remaining <= 0:
            return 0
        if self.mean_sec is None:
            return 1
        size = round(self.target_sec / max(self.mean_sec, 1e-6))
        fair = math.ceil(remaining / max(1, 2 * slots))  # leave work for every slot at the tail
        return max(1, min(size, fair, self.max_size, remaining))
