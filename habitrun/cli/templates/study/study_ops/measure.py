"""Per-subject operators: each call gets one subject and returns a small, picklable result."""

from __future__ import annotations


def measure(subject, scale: float = 1.0) -> dict:
    """A function operator: called once per subject with the stage's params."""
    value = float(subject.fields["value"]) * scale
    note = subject.workdir / "measure.txt"  # a folder of this subject's own
    note.write_text(f"{subject.id} {value}\n")
    return {"value": value, "group": subject.fields["group"], "note": str(note)}


class Score:
    """A class operator: built once per worker (load a model here), then called per subject."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self, subject) -> dict:
        measured = subject.input("measure")  # the result of the stage it needs
        return {"score": measured["value"] + self.offset, "group": measured["group"]}
