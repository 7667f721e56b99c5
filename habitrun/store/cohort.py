"""The cohort accounted for: subjects found, those left out before the run (incomplete, excluded), those in it.

A subject that leaves the cohort quietly changes a collect's table and a model's
training set: the run writes this account into its folder (cohort.json) when it
starts, so the summary, `status` and the report say who is missing and why, and
``policy.require_complete_cohort`` can refuse a collect or train stage on a
partial cohort (:func:`missing_from`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COHORT_FILE = "cohort.json"
NAMED = 5  # ids named in one line; the rest are counted
PARTIAL_COHORT = "partial_cohort"  # the kind of a group stage's refusal (require_complete_cohort)


@dataclass
class Cohort:
    """How many subjects were found, which were left out before the run and why, how many are in it."""

    found: int
    in_run: int
    incomplete: list[tuple[str, str]] = field(default_factory=list)
    """(id, what is missing: ``mask`` or ``ct, mask``), sorted by id."""
    excluded: list[str] = field(default_factory=list)
    """Ids subjects.include / subjects.exclude left out."""

    @classmethod
    def of(cls, subjects: Sequence[Any]) -> Cohort:
        """The account of a subject table (spec/subjects.py): its discovery report and include/exclude."""
        excluded = list(getattr(subjects, "excluded", ()))
        report = getattr(subjects, "discovery", None)
        left = set(excluded)
        incomplete = [] if report is None else [(sid, ", ".join(cols)) for sid, cols in report.incomplete
                                                if sid not in left]
        found = report.found if report is not None else len(subjects) + len(excluded)
        return cls(found=max(found, len(subjects) + len(incomplete) + len(excluded)), in_run=len(subjects),
                   incomplete=incomplete, excluded=excluded)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (cohort.json, `status --json`)."""
        return {"found": self.found, "in_run": self.in_run,
                "incomplete": [{"subject": sid, "missing": what} for sid, what in self.incomplete],
                "excluded": list(self.excluded)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cohort:
        return cls(found=int(data.get("found", 0)), in_run=int(data.get("in_run", 0)),
                   incomplete=[(str(d.get("subject")), str(d.get("missing", ""))) for d in data.get("incomplete", ())],
                   excluded=[str(sid) for sid in data.get("excluded", ())])

    def write(self, folder: Path) -> None:
        """Into the run folder (raises OSError)."""
        (folder / COHORT_FILE).write_text(json.dumps(self.as_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def read(cls, folder: Path) -> Cohort | None:
        """A run folder's account; None for a run made before it was written, or an unreadable one."""
        try:
            data = json.loads((folder / COHORT_FILE).read_text(encoding="utf-8"))
            return cls.from_dict(data) if isinstance(data, dict) else None
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    @property
    def partial(self) -> bool:
        """Some found subjects are not in the run for want of a file (exclusion is the user's choice)."""
        return bool(self.incomplete)

    def incomplete_text(self) -> str:
        """``1 incomplete (missing mask: S003)``: grouped by what is missing, the first ids named."""
        by_what: dict[str, list[str]] = {}
        for sid, what in self.incomplete:
            by_what.setdefault(what, []).append(sid)
        parts = [f"missing {what}: {named(sids)}" for what, sids in by_what.items()]
        return f"{len(self.incomplete)} incomplete ({'; '.join(parts)})"

    def flow_text(self) -> str:
        """``40 found → 1 incomplete (missing mask: S003) → 39 in the run`` (exclusions too, when any)."""
        steps = [f"{self.found} found"]
        if self.incomplete:
            steps.append(self.incomplete_text())
        if self.excluded:
            steps.append(f"{len(self.excluded)} excluded by include/exclude ({named(self.excluded)})")
        steps.append(f"{self.in_run} in the run")
        return " → ".join(steps)

    def line(self, members: dict[str, int]) -> str | None:
        """The flow and how many subjects each collect/train stage took (``→ table took 38``); None when
        every subject found is in the run and every such stage took them all (nothing to account for)."""
        if not (self.incomplete or self.excluded or any(n < self.in_run for n in members.values())):
            return None
        return self.flow_text() + "".join(f" → {name} took {n}" for name, n in members.items())


def named(ids: Sequence[str], limit: int = NAMED) -> str:
    """``S1, S2, S3 ... and 4 more``."""
    more = f" ... and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def missing_from(cohort: Cohort, in_run: Sequence[str], members: Sequence[str] | None) -> list[tuple[str, str]]:
    """Who a group stage would go without, each with why: incomplete, or failed/skipped upstream.

    ``members``: the subjects the stage would take (None: it takes no subjects, only group results)."""
    out = [(sid, f"incomplete: missing {what}") for sid, what in cohort.incomplete]
    if members is not None:
        taken = set(members)
        out.extend((sid, "failed or skipped upstream") for sid in in_run if sid not in taken)
    return out


def refusal_text(stage: str, missing: list[tuple[str, str]]) -> str:
    """The one line of a group stage that refuses a partial cohort."""
    shown = ", ".join(f"{sid} ({why})" for sid, why in missing[:NAMED])
    more = f" ... and {len(missing) - NAMED} more" if len(missing) > NAMED else ""
    return (f"stage {stage!r} not run: require_complete_cohort is on and {len(missing)} subject(s) "
            f"are missing from the cohort: {shown}{more}")
