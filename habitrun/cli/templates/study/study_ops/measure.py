"""Per-subject operators: each call gets one subject and returns a small, picklable result."""

from __future__ import annotations

import csv


def read_grid(path: str) -> list[list[float]]:
    """A small image stored as CSV rows of numbers (a real study reads NIfTI with nibabel)."""
    with open(path, newline="") as handle:
        return [[float(v) for v in row] for row in csv.reader(handle) if row]


def measure(subject, scale: float = 1.0) -> dict:
    """A function operator: called once per subject with the stage's params.

    ``subject.fields`` holds the files habitrun found (``scan``, ``mask``: paths)
    and the columns of clinical.csv (``group``, ``age``).
    """
    scan, mask = read_grid(subject.fields["scan"]), read_grid(subject.fields["mask"])
    # zip(strict=True): a scan and mask of different shapes is an error, not a silent crop
    inside = [v for row, keep in zip(scan, mask, strict=True) for v, m in zip(row, keep, strict=True) if m]
    if not inside:
        raise ValueError(f"{subject.fields['mask']} marks no lesion")
    value = sum(inside) / len(inside) * scale
    note = subject.workdir / "measure.txt"  # a folder of this subject's own
    note.write_text(f"{subject.id} {value}\n")
    return {"value": value, "area": len(inside), "group": subject.fields["group"], "note": str(note)}


class Score:
    """A class operator: built once per worker (load a model here), then called per subject."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self, subject) -> dict:
        measured = subject.input("measure")  # the result of the stage it needs
        return {"score": measured["value"] + self.offset, "group": measured["group"]}
