"""A subject's peak memory before it runs: its own history, else a robust upper fit over a cheap feature.

Three sources, in this order (:meth:`PeakModel.predict`):

1. the subject's own measured peaks (the trace of earlier runs of the same
   stage and code, and this run's attempts): their maximum, with a small margin;
2. a fit over a feature known before running (the size of its input files, or
   a numeric manifest column the user names, ``memory_hint``) from every
   subject measured so far: with at least ``MIN_LINE_POINTS`` points spread
   over the feature, a Theil-Sen line (median of pairwise slopes: one odd
   subject cannot tilt it) whose intercept is the ``QUANTILE`` of the
   residuals, so about nine subjects in ten lie under it; with fewer, a
   proportional fit above the worker's own baseline at the same quantile;
3. without a feature, the ``QUANTILE`` of every measured peak of the stage.

With nothing measured at all the model says None: the caller starts
conservatively (one subject alone) and learns from it. An out-of-memory kill
is a lesson (:meth:`PeakModel.killed`): the subject's prediction rises above
the memory it was last seen using.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

QUANTILE = 0.9  # the fits are upper fits: about nine subjects in ten peak below them
MARGIN = 1.1  # on top of the fit: a subject's peak varies a little from run to run
OWN_MARGIN = 1.05  # on top of a subject's own measured peak
KILLED_GROWTH = 1.5  # a subject killed for memory needs at least this much more than it was seen using
MIN_LINE_POINTS = 4
MIN_SPREAD = 1.5  # largest feature over smallest: below, a line's slope is noise
BASELINE_STEP_MB = 2.0
MAX_LINE_POINTS = 100  # the line is fitted on the last this many points (pairs grow as the square)
REFIT_ALWAYS = 20  # the fit is made again after each of the first this many peaks, then at every ~5 % more


def quantile(values: Iterable[float], q: float) -> float:
    """Nearest-rank upper quantile of ``values`` (not empty)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class PeakModel:
    """Predicted peak resident MB per subject of one stage, learning as subjects finish."""

    def __init__(self, *, baseline_mb: float = 0.0) -> None:
        self.own: dict[str, float] = {}  # subject -> its largest measured peak
        self.floor: dict[str, float] = {}  # subject -> at least this (it was killed for memory)
        self.features: dict[str, float] = {}  # subject -> its feature, where known
        self.points: list[tuple[float, float]] = []  # (feature, peak) of measured subjects
        self.peaks: list[float] = []  # every measured peak
        self.baseline_mb = baseline_mb  # a fresh worker's own memory (the part of a peak no input explains)
        self.version = 0  # bumped whenever a prediction may have changed
        self._fit: tuple[str, float, float, float] | None = None  # see fitted, cached

    # ------------------------------------------------------------ learning
    def set_feature(self, subject: str, value: float | None) -> None:
        if value is not None and value >= 0:
            self.features[subject] = float(value)

    def measured(self, subject: str, peak_mb: float) -> None:
        """``subject`` ran to its end and peaked at ``peak_mb``."""
        if peak_mb is None or peak_mb <= 0:
            return
        self.own[subject] = max(peak_mb, self.own.get(subject, 0.0))
        self.peaks.append(peak_mb)
        feature = self.features.get(subject)
        if feature is not None:
            self.points.append((feature, peak_mb))
        count = len(self.peaks)
        if count <= REFIT_ALWAYS or count % (count // REFIT_ALWAYS) == 0:  # later, at every ~5 % more
            self._fit = None
            self.version += 1

    def killed(self, subject: str, seen_mb: float, predicted_mb: float | None) -> None:
        """``subject`` was killed for memory while using ``seen_mb`` (predicted: ``predicted_mb``)."""
        floor = max(seen_mb, predicted_mb or 0.0) * KILLED_GROWTH
        self.floor[subject] = max(floor, self.floor.get(subject, 0.0))
        self.version += 1

    def set_baseline(self, mb: float) -> None:
        """A fresh worker's own memory, as measured (changes of under ``BASELINE_STEP_MB`` are ignored)."""
        if abs(mb - self.baseline_mb) >= BASELINE_STEP_MB:
            self.baseline_mb = mb
            self._fit = None
            self.version += 1

    # ------------------------------------------------------------ predicting
    @property
    def knows_anything(self) -> bool:
        return bool(self.peaks)

    def predict(self, subject: str) -> float | None:
        """Predicted peak MB of ``subject``; None when nothing at all is known yet."""
        floor = self.floor.get(subject, 0.0)
        own = self.own.get(subject)
        if own is not None:
            return max(own * OWN_MARGIN, floor)
        fit = self.fitted()
        if fit is None:
            return floor or None
        kind, a, b, flat = fit
        feature = self.features.get(subject)
        guess = flat if kind == "flat" or feature is None else a + b * feature
        return max(guess * MARGIN, floor, self.baseline_mb)

    def fitted(self) -> tuple[str, float, float, float] | None:
        """The stage-wide fit: (kind, a, b, flat) with kind "line" (a + b x), "ratio" (baseline a + b x) or
        "flat"; ``flat`` is the upper quantile of every measured peak (for a subject without a feature)."""
        if self._fit is None and self.peaks:
            self._fit = self._make_fit()
        return self._fit

    def _make_fit(self) -> tuple[str, float, float, float]:
        flat = quantile(self.peaks, QUANTILE)
        points = self.points[-MAX_LINE_POINTS:]
        if not points:
            return ("flat", flat, 0.0, flat)
        xs = [x for x, _ in points]
        low, high = min(xs), max(xs)
        if len(points) >= MIN_LINE_POINTS and low > 0 and high >= MIN_SPREAD * low:
            slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:]
                      if x2 != x1]
            slope = max(0.0, median(slopes)) if slopes else 0.0
            return ("line", quantile([y - slope * x for x, y in points], QUANTILE), slope, flat)
        base = min(self.baseline_mb, min(y for _, y in points)) if self.baseline_mb else 0.0
        ratios = [(y - base) / x for x, y in points if x > 0]
        if not ratios:
            return ("flat", flat, 0.0, flat)
        return ("ratio", base, max(0.0, quantile(ratios, QUANTILE)), flat)
