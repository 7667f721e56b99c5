"""Peak-memory predictions: own history first, a robust upper fit over a feature, learning from a kill."""

from __future__ import annotations

import random

from habitrun.planner.memory_model import KILLED_GROWTH, MARGIN, OWN_MARGIN, PeakModel
from habitrun.planner.peak_history import hint_value, peak_model
from habitrun.store.trace import TRACE_COLUMNS


def model(points: dict[str, tuple[float, float]], baseline: float = 0.0) -> PeakModel:
    m = PeakModel(baseline_mb=baseline)
    for sid, (feature, _) in points.items():
        m.set_feature(sid, feature)
    for sid, (_, peak) in points.items():
        m.measured(sid, peak)
    return m


def test_nothing_measured_predicts_nothing():
    m = PeakModel()
    m.set_feature("a", 10.0)
    assert m.predict("a") is None and not m.knows_anything


def test_a_subject_own_peak_wins_over_the_fit():
    m = model({"a": (1.0, 100.0), "b": (2.0, 200.0), "c": (3.0, 300.0), "d": (4.0, 400.0)})
    m.measured("a", 90.0)  # a lower peak later: the largest stays
    assert m.predict("a") == 100.0 * OWN_MARGIN


def test_the_line_is_robust_to_an_outlier_and_lies_above_most_subjects():
    rng = random.Random(7)
    points = {f"s{i}": (x, 20.0 + 2.0 * x + rng.uniform(-5, 5)) for i, x in enumerate(range(10, 60))}
    points["odd"] = (30.0, 2000.0)  # one subject that blew up: neither slope nor level follows it
    m = model(points)
    kind, intercept, slope, _ = m.fitted()
    assert kind == "line" and 1.8 < slope < 2.2 and intercept < 40
    m.set_feature("new", 500.0)
    assert 1020 * MARGIN < m.predict("new") < 1080 * MARGIN  # extrapolated along the line, an upper fit
    under = sum(1 for sid, (x, y) in points.items() if y <= (intercept + slope * x))
    assert under >= 0.9 * len(points)


def test_one_small_subject_predicts_a_big_one_proportionally_above_the_worker_baseline():
    m = model({"small": (50.0, 66.0)}, baseline=16.0)
    m.set_feature("big", 600.0)
    assert abs(m.predict("big") - (16.0 + 50.0 / 50.0 * 600.0) * MARGIN) < 1e-6


def test_without_a_feature_the_upper_quantile_of_the_stage():
    m = model({f"s{i}": (None, float(i)) for i in range(1, 101)})  # type: ignore[misc]
    assert m.predict("unknown") == 90.0 * MARGIN


def test_a_kill_raises_the_prediction_above_what_it_was_seen_using_and_predicted():
    m = model({"a": (1.0, 50.0)})
    m.set_feature("big", 1.0)
    before = m.predict("big")
    m.killed("big", seen_mb=300.0, predicted_mb=before)
    assert m.predict("big") == 300.0 * KILLED_GROWTH
    m.killed("other", seen_mb=0.0, predicted_mb=80.0)  # never sampled: what it was predicted, and more
    assert m.predict("other") >= 80.0 * KILLED_GROWTH


def test_history_is_that_of_the_same_stage_code_and_finished_attempts():
    def row(sid: str, key: str, outcome: str, peak: float | None) -> tuple:
        values = dict.fromkeys(TRACE_COLUMNS)
        values.update(stage="s", subject=sid, key=key, outcome=outcome, peak_rss_mb=peak)
        return tuple(values[c] for c in TRACE_COLUMNS)

    rows = [row("a", "NEW.1", "done", 100.0), row("a", "OLD.1", "done", 900.0),  # other code: left out
            row("b", "NEW.2", "retried", None), row("b", "NEW.2", "done", 40.0)]
    m = peak_model(rows, {"a": 10.0, "b": 4.0}, "NEW")
    assert m.own == {"a": 100.0, "b": 40.0}
    assert sorted(m.points) == [(4.0, 40.0), (10.0, 100.0)]


def test_a_hint_is_a_non_negative_number_or_nothing():
    assert hint_value({"voxels": "1200"}, "voxels") == 1200.0
    assert hint_value({"voxels": "n/a"}, "voxels") is None
    assert hint_value({"voxels": "nan"}, "voxels") is None
    assert hint_value({}, "voxels") is None
