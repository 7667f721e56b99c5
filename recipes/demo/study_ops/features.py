"""Radiomics-style first-order and shape features of the lesion.

A class operator: habitrun builds it once per worker (the place to load a
model or set up a library), then calls it once per subject.
"""

from __future__ import annotations

import numpy as np


class FirstOrderShape:
    def __init__(self, bins: int = 32) -> None:
        self.bins = bins
        self.edges = np.linspace(0.0, 1.0, bins + 1)

    def __call__(self, subject) -> dict:
        data = np.load(subject.input("normalise")["volume"])
        volume, mask = data["volume"], data["mask"]
        values = volume[mask].astype(np.float64)
        mean, std = float(values.mean()), float(values.std())
        centred = (values - mean) / (std or 1.0)
        hist, _ = np.histogram(values, bins=self.edges)
        p = hist[hist > 0] / hist.sum()
        voxels = int(mask.sum())
        # surface: voxel faces between lesion and background
        faces = sum(int(np.count_nonzero(np.diff(mask.astype(np.int8), axis=a))) for a in range(3))
        sphericity = (np.pi ** (1 / 3) * (6 * voxels) ** (2 / 3)) / faces if faces else 0.0
        return {
            "mean": mean,
            "std": std,
            "skewness": float((centred ** 3).mean()),
            "kurtosis": float((centred ** 4).mean() - 3.0),
            "entropy": float(-(p * np.log2(p)).sum()),
            "energy": float((p ** 2).sum()),
            "p10": float(np.percentile(values, 10)),
            "p90": float(np.percentile(values, 90)),
            "voxels": voxels,
            "surface": faces,
            "sphericity": float(sphericity),
        }
