"""A subject's plan status from what the store holds for it: one decision table.

The planner first finds, per subject, what is stored under its current key
(:class:`Stored`), whether it is listed in ``force_rerun_subjects`` and the
stage's policy; :func:`decide` turns that into a status and a :class:`Reason`,
the first row of :data:`TABLE` that matches. Statuses that depend on other
stages (``blocked``, and ``stale`` because an upstream result changed) are set
by the planner around this table.

Every reason text the planner writes is a template here, in one place.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, NamedTuple

from habitrun.spec.policy import RunPolicy


class SubjectStatus(str, Enum):
    DONE = "done"
    FAILED = "failed"
    STALE = "stale"
    PENDING = "pending"
    FORCED = "forced"
    BLOCKED = "blocked"


class Stored(Enum):
    """What the store holds for a subject of a stage, under (or instead of) its current key.

    A result stored under the key an older habitrun gave the same inputs counts as stored under
    the current key (`run` moves it there): DONE or FAILED as it was recorded."""

    DONE = "done"  # a success under the current key
    UNREADABLE = "unreadable"  # a success under the current key whose result fails its check
    FAILED = "failed"  # a failure under the current key
    OTHER_KEY = "other key"  # nothing under the current key; its newest record has another key
    LOST = "lost"  # nothing under the current key; its record was in a damaged part of the store file
    NOTHING = "nothing"


class Reason(str, Enum):
    """Why a subject has its status: the text, a template filled by :meth:`text`."""

    RESUME_OFF = "resume is off"
    FORCE_LISTED = "listed in force_rerun_subjects"
    FAILURE_RETRIED = "recorded failure retried (retry_failed_subjects)"
    RESULT_UNREADABLE = "stored result unreadable: {why}"
    RECORD_LOST = "stored record unreadable (the store file is damaged)"
    KEY_CHANGED = "{changes}"  # the texts of planner.explain: what differs from the stored record's key
    UPSTREAM_RESULT_CHANGED = "upstream {name!r} reran with a different result"
    UPSTREAM_FAILED = "upstream {name!r} failed"
    UPSTREAM_SKIPPED = "upstream {name!r} was skipped"
    UPSTREAM_UNAVAILABLE = "upstream {name!r} failed or was skipped"
    NO_MEMBERS = "no subject succeeded in the stages it needs"

    def text(self, **details: Any) -> str:
        """The reason in words, its template filled with ``details``."""
        return self.value.format(**details) if details else self.value


class Decision(NamedTuple):
    status: SubjectStatus
    reason: Reason | None  # None: the status says it all (done, failed, pending)


ANY = None  # a table cell that matches every value

# (stored, forced, policy.resume, policy.retry_failed_subjects) -> decision; the first matching row decides.
TABLE: tuple[tuple[Stored | None, bool | None, bool | None, bool | None, Decision], ...] = (
    (Stored.OTHER_KEY, ANY, ANY, ANY, Decision(SubjectStatus.STALE, Reason.KEY_CHANGED)),
    (Stored.LOST, ANY, ANY, ANY, Decision(SubjectStatus.STALE, Reason.RECORD_LOST)),
    (Stored.NOTHING, ANY, ANY, ANY, Decision(SubjectStatus.PENDING, None)),
    # from here on something is stored under the current key
    (ANY, ANY, False, ANY, Decision(SubjectStatus.FORCED, Reason.RESUME_OFF)),
    (ANY, True, True, ANY, Decision(SubjectStatus.FORCED, Reason.FORCE_LISTED)),
    (Stored.DONE, False, True, ANY, Decision(SubjectStatus.DONE, None)),
    (Stored.UNREADABLE, False, True, ANY, Decision(SubjectStatus.STALE, Reason.RESULT_UNREADABLE)),
    (Stored.FAILED, False, True, True, Decision(SubjectStatus.FORCED, Reason.FAILURE_RETRIED)),
    (Stored.FAILED, False, True, False, Decision(SubjectStatus.FAILED, None)),
)


def decide(stored: Stored, forced: bool, policy: RunPolicy) -> Decision:
    """A subject's status and reason (see :data:`TABLE`); ``forced``: listed in force_rerun_subjects."""
    return _decide(stored, forced, policy.resume, policy.retry_failed_subjects)


def _decide(stored: Stored, forced: bool, resume: bool, retry_failed: bool) -> Decision:
    here = (stored, forced, resume, retry_failed)
    for *cells, decision in TABLE:
        if all(cell is ANY or cell == value for cell, value in zip(cells, here, strict=True)):
            return decision
    raise AssertionError(f"no row of the plan's decision table matches {here}")  # the table covers every case


def decisions(policy: RunPolicy) -> dict[tuple[Stored, bool], Decision]:
    """Every decision of one policy, (stored, forced) -> decision: looked up per subject.

    Made once per pair of the two policy fields the table reads, not once per stage."""
    return _decisions(policy.resume, policy.retry_failed_subjects)


@functools.cache
def _decisions(resume: bool, retry_failed: bool) -> dict[tuple[Stored, bool], Decision]:
    return {(stored, forced): _decide(stored, forced, resume, retry_failed)
            for stored in Stored for forced in (False, True)}
