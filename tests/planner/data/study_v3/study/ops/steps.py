"""Operators of the issue 31 fixture study: read a file, scale, tabulate."""
from pathlib import Path


def load(subject):
    return {"value": len(Path(subject.fields["image"]).read_text()), "label": f"{subject.id:>6}"}


def scale(subject, factor=2):
    return subject.inputs["load"]["value"] * factor


def table(collection):
    return dict(sorted((sid, value) for sid, value in collection.items()))
