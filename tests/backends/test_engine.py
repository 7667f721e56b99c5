"""What the engine does on top of every backend: retry rounds, fail-fast, resume, a stop and its resume.

The backend is chosen by the study's policy, as in a real run; which behaviour
applies to which backend: tests/backends/variants.py (and docs/backends.md).
"""

from __future__ import annotations

import signal

from habitrun.engine.contract import FailureKind
from habitrun.engine.control import StopFlag
from habitrun.engine.events import SubjectDone
from habitrun.errors import EXIT_FAILED_SUBJECTS, EXIT_INTERRUPTED, EXIT_OK
from tests.backends.conftest import started
from tests.backends.study import failed_ids, make_study, run
from tests.backends.variants import for_backends


@for_backends("retry")
def test_retry_rounds_rerun_the_failures_auto_retry_on_names(variant, tmp_path):
    recipe = make_study(tmp_path, variant, [{"id": "S0", "do": "raise_once"}, {"id": "S1", "do": "raise"},
                                            {"id": "S2"}], auto_retry_rounds=1, auto_retry_on=["exception"])
    summary = run(recipe)
    assert summary.exit_code == EXIT_FAILED_SUBJECTS
    assert failed_ids(summary) == [("work", "S1")]
    assert summary.failures[0].kind == FailureKind.EXCEPTION
    calls = started(tmp_path / "markers")
    assert (calls["S0"], calls["S1"], calls["S2"]) == (2, 2, 1)  # one retry round each, none for a success
    assert summary.stages["work"].done == 2 and summary.stages["after"].skipped == 1


@for_backends("retry_death")
def test_default_retry_rounds_rerun_a_dead_worker_but_not_an_exception(variant, tmp_path):
    recipe = make_study(tmp_path, variant, [{"id": "S0", "do": "die_once"}, {"id": "S1", "do": "raise"},
                                            {"id": "S2"}], auto_retry_rounds=1)
    summary = run(recipe)
    assert failed_ids(summary) == [("work", "S1")]
    calls = started(tmp_path / "markers")
    assert (calls["S0"], calls["S1"], calls["S2"]) == (2, 1, 1)
    assert summary.stages["work"].done == 2


@for_backends("fail_fast")
def test_fail_fast_stops_the_run_at_the_first_failure(variant, tmp_path):
    subjects = [{"id": "S0", "do": "raise"}] + [{"id": f"S{i}", "do": "sleep", "sec": 0.3} for i in range(1, 8)]
    recipe = make_study(tmp_path, variant, subjects, on_subject_failure="fail_fast")
    summary = run(recipe)
    assert (summary.outcome, summary.exit_code) == ("failed", EXIT_FAILED_SUBJECTS)
    assert (summary.stop_reason or "").startswith("fail_fast: subject S0 failed")
    assert failed_ids(summary) == [("work", "S0")]
    work = summary.stages["work"]
    assert work.failed == 1 and work.not_run >= 3 and work.done + work.not_run == 7, work
    calls = started(tmp_path / "markers")
    assert len([sid for sid in calls if not sid.startswith("second-")]) <= 5
    assert not [sid for sid in calls if sid.startswith("second-")], "the next stage ran after fail_fast"


@for_backends("resume")
def test_a_second_run_does_no_work_and_retries_failures_only_when_asked(variant, tmp_path):
    recipe = make_study(tmp_path, variant, [{"id": f"S{i}"} for i in range(3)])
    (tmp_path / "fail.txt").write_text("S1\n")
    first = run(recipe)
    assert failed_ids(first) == [("work", "S1")]
    calls = started(tmp_path / "markers")
    assert calls == {"S0": 1, "S1": 1, "S2": 1, "second-S0": 1, "second-S2": 1}

    (tmp_path / "fail.txt").unlink()
    again = run(recipe)  # the failure stays recorded: nothing to do
    assert started(tmp_path / "markers") == calls
    assert again.noop and again.exit_code == EXIT_FAILED_SUBJECTS
    assert [(f.stage, f.subject_id, f.recorded) for f in again.failures] == [("work", "S1", True)]

    retried = run(recipe, "policy.retry_failed_subjects=true")
    assert (retried.outcome, retried.exit_code) == ("success", EXIT_OK)
    calls.update({"S1": 2, "second-S1": 1})
    assert started(tmp_path / "markers") == calls  # only the failed subject, and what needs it


@for_backends("stop_resume")
def test_a_run_stopped_mid_stage_resumes_without_redoing_or_losing_a_subject(variant, tmp_path):
    recipe = make_study(tmp_path, variant, [{"id": f"S{i}", "do": "sleep", "sec": 0.15} for i in range(8)])
    stop = StopFlag()

    def ctrl_c_after_the_first_subject(event):
        if isinstance(event, SubjectDone):
            stop.set("signal SIGINT", signum=signal.SIGINT)  # what the runner's SIGINT handler does

    try:
        first = run(recipe, stop=stop, observer=ctrl_c_after_the_first_subject)
    finally:
        stop.close()
    assert (first.outcome, first.exit_code) == ("interrupted", EXIT_INTERRUPTED)
    # the first subject, and at most what each of the two workers had started (and queued) by then
    assert 1 <= first.stages["work"].done <= 5 and first.stages["work"].not_run >= 3, first.stages["work"]
    assert "after" not in first.stages or first.stages["after"].done == 0
    assert not first.failures

    second = run(recipe)
    assert (second.outcome, second.exit_code) == ("success", EXIT_OK)
    assert second.stages["work"].cached == first.stages["work"].done
    calls = started(tmp_path / "markers")
    assert calls == {**{f"S{i}": 1 for i in range(8)}, **{f"second-S{i}": 1 for i in range(8)}}, calls
