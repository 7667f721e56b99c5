"""Write the DICOM demo's raw scanner output: each subject's CT and lesion mask as DICOM series.

The same synthetic volumes as the NIfTI demo (:func:`cohort.synthesize`), written
slice by slice with pydicom the way a scanner exports them: one file per slice,
a series per volume ("ct", and the lesion labels as a second series "mask"),
with positions, orientation, spacing and rescale tags, so ``dcm2niix`` turns
each series into a NIfTI file. Deterministic (UIDs derived from the subject
id), so the same files are written on every machine. Shipped with the demo;
run this to write them again:

    python recipes/demo/study_ops/dicoms.py [FOLDER] [N_SUBJECTS]

``write_series(folder, subject, name, volume)`` is also what the tests use to
make series of their own (and a corrupt one).
"""

from __future__ import annotations

import csv
import hashlib
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]
SUBJECTS = 6  # the first subjects of clinical.csv: the DICOM demo is small
ROOT_UID = "1.2.826.0.1.3680043.8.498"  # pydicom's organisational root, for example UIDs


def uid(*parts: str) -> str:
    """A valid, deterministic DICOM UID from ``parts``."""
    number = int(hashlib.sha256("/".join(parts).encode()).hexdigest()[:24], 16)
    return f"{ROOT_UID}.{number}"[:64]


def write_series(folder: Path, subject: str, name: str, volume: np.ndarray,
                 spacing: tuple[float, float, float] = (0.8, 0.8, 1.5), intercept: float = 0.0) -> list[Path]:
    """Write ``volume`` (x, y, z) as one DICOM file per z slice under ``folder/name/``; the paths."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian

    out = []
    series_uid, study_uid = uid(subject, name, "series"), uid(subject, "study")
    target = folder / name
    target.mkdir(parents=True, exist_ok=True)
    for z in range(volume.shape[2]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = uid(subject, name, str(z))
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study_uid, series_uid
        ds.FrameOfReferenceUID = uid(subject, "frame")
        ds.PatientID = ds.PatientName = subject
        ds.Modality, ds.SeriesDescription, ds.ProtocolName = "CT", name, name
        ds.Manufacturer = "habitrun synthetic"
        ds.StudyDate = ds.SeriesDate = "20240101"
        ds.SeriesNumber = 1 if name == "ct" else 2
        ds.InstanceNumber = z + 1
        ds.ImagePositionPatient = [0.0, 0.0, float(z * spacing[2])]
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.PixelSpacing = [float(spacing[1]), float(spacing[0])]  # row spacing (y), column spacing (x)
        ds.SliceThickness = float(spacing[2])
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.Rows, ds.Columns = volume.shape[1], volume.shape[0]
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope = intercept, 1.0
        ds.PixelData = np.ascontiguousarray(volume[:, :, z].T.astype("<i2")).tobytes()  # rows are y
        path = target / f"{z + 1:03d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        out.append(path)
    return out


def write_dicom_cohort(folder: Path = HERE, subjects: int = SUBJECTS) -> list[Path]:
    """dicom/<subject>/{ct,mask}/NNN.dcm for the first ``subjects`` of clinical.csv, and the
    manifest dicom.csv naming each subject's folder."""
    # cohort.py is beside this file: importable when run as a script, or with this folder on the path
    from cohort import synthesize

    with open(folder / "clinical.csv", newline="") as handle:
        rows = [(row["subject"], int(row["label"])) for row in csv.DictReader(handle)][:subjects]
    written = [folder / "dicom.csv"]
    lines = ["subject,label,dicom"] + [f"{s},{label},dicom/{s}" for s, label in rows]
    (folder / "dicom.csv").write_text("\n".join(lines) + "\n")
    for subject, label in rows:
        ct, mask = synthesize(subject, label)
        written += write_series(folder / "dicom" / subject, subject, "ct", ct)
        written += write_series(folder / "dicom" / subject, subject, "mask", mask.astype(np.int16))
    return written


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    files = write_dicom_cohort(target, int(sys.argv[2]) if len(sys.argv) > 2 else SUBJECTS)
    print(f"wrote {len(files) - 1} DICOM files under {target / 'dicom'} and {files[0]}")
