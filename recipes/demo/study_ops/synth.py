"""Synthesize one subject's CT-like volume and lesion mask, deterministically from its seed.

Label 1 lesions are larger, lobulated and heterogeneous; label 0 lesions are
small, round and homogeneous, so the features downstream can tell them apart.
"""

from __future__ import annotations

import numpy as np


def synthesize(subject, size: int = 32, noise: float = 20.0) -> dict:
    seed = int(subject.fields["seed"])
    label = int(subject.fields["label"])
    rng = np.random.default_rng(seed)
    grid = np.indices((size, size, size), dtype=np.float32) - (size - 1) / 2.0
    radius = rng.uniform(0.24, 0.32) * size if label else rng.uniform(0.14, 0.2) * size
    distance = np.sqrt((grid ** 2).sum(axis=0))
    if label:  # lobulated outline: radius modulated by angle
        theta = np.arctan2(grid[1], grid[0])
        distance = distance * (1.0 + 0.18 * np.sin(3 * theta + rng.uniform(0, np.pi)))
    mask = distance <= radius
    volume = rng.normal(-800.0, noise, size=(size, size, size)).astype(np.float32)  # lung parenchyma (HU)
    lesion_mean = rng.uniform(20.0, 60.0)
    lesion_std = rng.uniform(60.0, 90.0) if label else rng.uniform(10.0, 20.0)
    volume[mask] = rng.normal(lesion_mean, lesion_std, size=int(mask.sum()))
    path = subject.workdir / "volume.npz"
    np.savez_compressed(path, volume=volume, mask=mask)
    print(f"{subject.id}: lesion of {int(mask.sum())} voxels, radius {radius:.1f}")
    return {"volume": str(path), "voxels": int(mask.sum())}
