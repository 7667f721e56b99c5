"""Write the demo's synthetic CT-like cohort as real NIfTI files: data/<subject>/{ct,mask}.nii.gz.

Deterministic: each subject's volume comes from a seed derived from its id,
and the files are gzipped without a timestamp, so the same bytes are written
on every machine. The files are shipped with the demo; run this to write
them again (or a cohort of another size):

    python recipes/demo/study_ops/cohort.py [FOLDER]

Label 1 lesions (clinical.csv) are larger, lobulated and heterogeneous;
label 0 lesions are small, round and homogeneous, so the features
downstream can tell them apart. Voxels are 0.8 x 0.8 x 1.5 mm.
"""

from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path

import numpy as np

SIZE = 32
SPACING = (0.8, 0.8, 1.5)
NOISE = 20.0
HERE = Path(__file__).resolve().parents[1]


def synthesize(subject: str, label: int, size: int = SIZE, noise: float = NOISE) -> tuple[np.ndarray, np.ndarray]:
    """(CT volume in HU as int16, lesion labels as uint8: 1 the index lesion, 2 a satellite) of one subject."""
    rng = np.random.default_rng(int("".join(ch for ch in subject if ch.isdigit()) or 0) + 1000)
    grid = np.indices((size, size, size), dtype=np.float32) - (size - 1) / 2.0
    grid[2] *= SPACING[2] / SPACING[0]  # round in millimetres, not in voxels
    radius = rng.uniform(0.24, 0.32) * size if label else rng.uniform(0.14, 0.2) * size
    distance = np.sqrt((grid ** 2).sum(axis=0))
    if label:  # lobulated outline: radius modulated by angle
        theta = np.arctan2(grid[1], grid[0])
        distance = distance * (1.0 + 0.18 * np.sin(3 * theta + rng.uniform(0, np.pi)))
    mask = distance <= radius
    volume = rng.normal(-800.0, noise, size=(size, size, size))  # lung parenchyma (HU)
    lesion_mean = rng.uniform(20.0, 60.0)
    lesion_std = rng.uniform(60.0, 90.0) if label else rng.uniform(10.0, 20.0)
    volume[mask] = rng.normal(lesion_mean, lesion_std, size=int(mask.sum()))
    labels = mask.astype(np.uint8)
    if rng.random() < 0.3:  # a small round satellite nodule in a corner: lesion 2
        corner = np.sqrt(((grid - grid[:, :1, :1, :1] - 5.0) ** 2).sum(axis=0)) <= 3.0
        volume[corner] = rng.normal(lesion_mean, 15.0, size=int(corner.sum()))
        labels[corner] = 2
    return np.round(volume).astype(np.int16), labels


def nifti_gz(array: np.ndarray) -> bytes:
    """A .nii.gz file's bytes, the same on every run (no timestamp in the gzip header)."""
    import nibabel as nib

    affine = np.diag([*SPACING, 1.0])
    image = nib.Nifti1Image(array, affine)
    image.header.set_xyzt_units("mm")
    return gzip.compress(image.to_bytes(), compresslevel=9, mtime=0)


def write_cohort(folder: Path = HERE) -> list[Path]:
    """Write data/<subject>/ct.nii.gz and mask.nii.gz for every subject of clinical.csv."""
    written = []
    with open(folder / "clinical.csv", newline="") as handle:
        subjects = [(row["subject"], int(row["label"])) for row in csv.DictReader(handle)]
    for subject, label in subjects:
        ct, mask = synthesize(subject, label)
        for name, array in (("ct", ct), ("mask", mask)):
            path = folder / "data" / subject / f"{name}.nii.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(nifti_gz(array))
            written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    files = write_cohort(target)
    print(f"wrote {len(files)} files under {target / 'data'}")
