from pathlib import Path

from study_ops.util import scale

ROOT = Path(__file__).resolve().parent.parent


def load(subject):
    return len((ROOT / subject.fields["image"]).read_text())


def scaled(subject, factor):
    return scale(subject.inputs["load"], factor)
