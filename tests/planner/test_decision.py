"""The plan's decision table: (what is stored, forced, policy) -> (status, reason), one case per row."""

from __future__ import annotations

import itertools

import pytest

from habitrun.planner.decision import (
    TABLE,
    Decision,
    Reason,
    Stored,
    SubjectStatus,
    decide,
    decisions,
)
from habitrun.spec.policy import RunPolicy

S = SubjectStatus
# One case per row of the table, in its order: (stored, forced, resume, retry_failed) -> expected.
ROWS = [
    pytest.param(Stored.OTHER_KEY, True, False, True, S.STALE, Reason.KEY_CHANGED, id="stored-under-another-key"),
    pytest.param(Stored.LOST, True, True, False, S.STALE, Reason.RECORD_LOST, id="record-lost-in-damaged-store"),
    pytest.param(Stored.NOTHING, True, False, True, S.PENDING, None, id="nothing-stored"),
    pytest.param(Stored.FAILED, False, False, False, S.FORCED, Reason.RESUME_OFF, id="resume-off"),
    pytest.param(Stored.UNREADABLE, True, True, False, S.FORCED, Reason.FORCE_LISTED, id="force-listed"),
    pytest.param(Stored.DONE, False, True, True, S.DONE, None, id="done"),
    pytest.param(Stored.UNREADABLE, False, True, False, S.STALE, Reason.RESULT_UNREADABLE, id="result-unreadable"),
    pytest.param(Stored.FAILED, False, True, True, S.FORCED, Reason.FAILURE_RETRIED, id="failure-retried"),
    pytest.param(Stored.FAILED, False, True, False, S.FAILED, None, id="failure-kept"),
]


@pytest.mark.parametrize(("stored", "forced", "resume", "retry", "status", "reason"), ROWS)
def test_each_row_of_the_table(stored: Stored, forced: bool, resume: bool, retry: bool,
                               status: SubjectStatus, reason: Reason | None) -> None:
    policy = RunPolicy(resume=resume, retry_failed_subjects=retry)
    assert decide(stored, forced, policy) == Decision(status, reason)


def test_one_case_per_row_and_each_case_decided_by_its_own_row() -> None:
    assert len(ROWS) == len(TABLE)
    for (*cells, decision), case in zip(TABLE, ROWS, strict=True):
        here = case.values[:4]
        assert all(cell is None or cell == value for cell, value in zip(cells, here, strict=True)), case.id
        assert decision == Decision(*case.values[4:]), case.id


@pytest.mark.parametrize(("resume", "retry"), list(itertools.product((False, True), repeat=2)))
def test_every_case_is_decided_and_the_stored_subjects_follow_the_policy(resume: bool, retry: bool) -> None:
    policy = RunPolicy(resume=resume, retry_failed_subjects=retry)
    table = decisions(policy)
    assert set(table) == set(itertools.product(Stored, (False, True)))
    for (stored, forced), (status, reason) in table.items():
        if stored in (Stored.DONE, Stored.UNREADABLE, Stored.FAILED):
            if not resume:
                assert (status, reason) == (S.FORCED, Reason.RESUME_OFF)
            elif forced:
                assert (status, reason) == (S.FORCED, Reason.FORCE_LISTED)
        if status in (S.DONE, S.FAILED, S.PENDING):
            assert reason is None  # the status says it all; the others say why
        else:
            assert reason is not None


def test_reason_texts_fill_their_templates() -> None:
    assert Reason.RESUME_OFF.text() == "resume is off"
    assert Reason.RESULT_UNREADABLE.text(why="checksum mismatch") == "stored result unreadable: checksum mismatch"
    assert Reason.UPSTREAM_RESULT_CHANGED.text(name="a") == "upstream 'a' reran with a different result"
    assert Reason.UPSTREAM_UNAVAILABLE.text(name="b") == "upstream 'b' failed or was skipped"
