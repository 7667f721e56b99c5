"""Normalise intensities: clip to a lung window and scale to [0, 1]."""

from __future__ import annotations

import numpy as np


def normalise(subject, window: tuple[float, float] = (-1000.0, 400.0)) -> dict:
    data = np.load(subject.input("synthesize")["volume"])
    low, high = window
    volume = (np.clip(data["volume"], low, high) - low) / (high - low)
    path = subject.workdir / "normalised.npz"
    np.savez_compressed(path, volume=volume.astype(np.float32), mask=data["mask"])
    return {"volume": str(path)}
