"""Radiomics-style first-order and shape features of each subject's lesion, read from NIfTI files.

A class operator: habitrun builds it once per worker (the place to import a
library or load a model), then calls it once per subject. The subject's
``ct`` and ``mask`` fields are the files habitrun found on disk
(``subjects.from`` in the recipe); nibabel reads them, as in any imaging study.
The mask labels each lesion 1, 2, ...: every lesion gets its features, and
the index lesion's (label 1) are the subject's row in the training table.
With ``images_from: STAGE`` the two files are that stage's outputs instead (the
DICOM demo: ``dcm2niix``'s NIfTI files of the subject's two series).
"""

from __future__ import annotations

import numpy as np


class FirstOrderShape:
    def __init__(self, bins: int = 32, window: tuple[float, float] = (-1000.0, 400.0),
                 images_from: str | None = None) -> None:
        import nibabel  # imported once per worker

        self.nibabel = nibabel
        self.bins = bins
        self.window = window
        self.images_from = images_from

    def __call__(self, subject) -> dict:
        files = subject.input(self.images_from) if self.images_from else subject.fields
        ct = self.nibabel.load(files["ct"])
        mask_image = self.nibabel.load(files["mask"])
        if ct.shape != mask_image.shape:
            raise ValueError(f"ct {ct.shape} and mask {mask_image.shape} differ in shape")
        volume = np.asarray(ct.dataobj, dtype=np.float64)
        labels = np.asarray(mask_image.dataobj)
        lesions = [int(v) for v in np.unique(labels) if v != 0]
        if not lesions:
            raise ValueError(f"{files['mask']} has no lesion (every voxel is 0)")
        spacing = tuple(float(z) for z in ct.header.get_zooms()[:3])
        per_lesion = {str(k): self.lesion(volume, labels == k, spacing) for k in lesions}
        index = per_lesion[str(lesions[0])]  # the index lesion (label 1): one row per subject for training
        print(f"{subject.id}: {len(lesions)} lesion(s), index lesion {index['volume_mm3']:.0f} mm3")
        return {**index, "lesion_count": len(lesions), "lesions": per_lesion}

    def lesion(self, volume: np.ndarray, mask: np.ndarray, spacing: tuple[float, float, float]) -> dict:
        """First-order (HU in a lung window, scaled to [0, 1]) and shape (mm) features of one lesion."""
        low, high = self.window
        values = (np.clip(volume[mask], low, high) - low) / (high - low)
        mean, std = float(values.mean()), float(values.std())
        centred = (values - mean) / (std or 1.0)
        hist, _ = np.histogram(values, bins=self.bins, range=(0.0, 1.0))
        p = hist[hist > 0] / hist.sum()
        voxel_mm3 = spacing[0] * spacing[1] * spacing[2]
        volume_mm3 = float(mask.sum()) * voxel_mm3
        # surface: the faces between lesion and background voxels, each the area of its two other sides
        face_mm2 = (spacing[1] * spacing[2], spacing[0] * spacing[2], spacing[0] * spacing[1])
        padded = np.pad(mask, 1).astype(np.int8)
        surface = sum(float(np.count_nonzero(np.diff(padded, axis=a))) * face_mm2[a] for a in range(3))
        sphericity = (np.pi ** (1 / 3) * (6 * volume_mm3) ** (2 / 3)) / surface if surface else 0.0
        return {
            "mean": mean,
            "std": std,
            "skewness": float((centred ** 3).mean()),
            "kurtosis": float((centred ** 4).mean() - 3.0),
            "entropy": float(-(p * np.log2(p)).sum()),
            "energy": float((p ** 2).sum()),
            "p10": float(np.percentile(values, 10)),
            "p90": float(np.percentile(values, 90)),
            "volume_mm3": volume_mm3,
            "surface_mm2": surface,
            "sphericity": float(sphericity),
        }
