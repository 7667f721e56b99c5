"""The BIDS shorthand: ``subjects: {bids: data/, datatype: anat, suffix: [T1w, mask]}``.

It expands to ordinary path templates, so BIDS needs no index and no pybids.
The subset covered: ``sub-<label>/[ses-<label>/]<datatype>/sub-<label>[_ses-<label>]_<suffix><extension>``
with labels of letters and digits; a file name with any other entity
(``acq-``, ``run-``, ``desc-`` ...) is not matched (write a ``from`` template
for those). One subject per participant, or per participant and session.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from habitrun.spec.recipe import SubjectsSpec

LABEL = "[a-zA-Z0-9]+"
PARTICIPANTS = "participants.tsv"
"""Joined on participant_id when the BIDS folder has it and no manifest is given."""


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def bids_templates(spec: SubjectsSpec) -> list[str]:
    """The templates a BIDS shorthand stands for: without, then with a session level."""
    root = _literal((spec.bids or ".").rstrip("/") or "/")
    root = "" if root == "/" else root
    datatype = _literal(spec.datatype or "")
    plain = f"{root}/sub-{{subject}}/{datatype}/sub-{{subject}}_{{suffix}}{{extension}}"
    with_session = (f"{root}/sub-{{subject}}/ses-{{session}}/{datatype}/"
                    f"sub-{{subject}}_ses-{{session}}_{{suffix}}{{extension}}")
    if spec.session == "none":
        return [plain]
    if spec.session == "required":
        return [with_session]
    return [plain, with_session]


def bids_patterns(spec: SubjectsSpec) -> dict[str, str]:
    """Regexes of the entities: labels, the listed suffixes and extensions."""
    suffixes = sorted(spec.suffix or (), key=len, reverse=True)
    extensions = sorted(spec.extension, key=len, reverse=True)
    return {
        "subject": spec.fields.get("subject", LABEL),
        "session": spec.fields.get("session", LABEL),
        "suffix": "|".join(re.escape(s) for s in suffixes) or "(?!)",
        "extension": "|".join(re.escape(e) for e in extensions),
    }


def bids_id(values: dict[str, str]) -> str:
    """``sub-01``, or ``sub-01_ses-02`` when the file is in a session folder."""
    session = values.get("session")
    return f"sub-{values['subject']}" + (f"_ses-{session}" if session else "")
