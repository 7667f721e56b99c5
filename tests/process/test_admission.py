"""Memory admission on real worker processes: a budget, predictions, what may run beside what.

The predictions are given (a PeakModel with the history a trace would
give); the subjects really take their memory. Overlaps are read from the
subjects' own start and end times (monotonic, one machine).
"""

from __future__ import annotations

from habitrun.planner.memory_model import PeakModel
from tests.process.conftest import op, run

HOLD = op("hold", module="memops")


def model_with(history: dict[str, float], features: dict[str, float] | None = None) -> PeakModel:
    model = PeakModel()
    for sid, value in (features or {}).items():
        model.set_feature(sid, value)
    for sid, peak in history.items():
        model.measured(sid, peak)
    return model


def overlaps(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def results(got: dict) -> dict[str, dict]:
    assert all(o.ok for o in got.values()), {s: o.error for s, o in got.items() if not o.ok}
    return {sid: o.result for sid, o in got.items()}


def test_two_big_subjects_never_run_together_while_small_ones_fill_the_other_workers(make_backend, tasks):
    backend = make_backend(workers=4, memory_budget_mb=400)
    history = {"B1": 230.0, "B2": 230.0, **{f"s{i}": 30.0 for i in range(6)}}
    backend.forecast = model_with(history)
    subjects = [{"id": "B1", "mb": 150, "sec": 0.8}, {"id": "B2", "mb": 150, "sec": 0.8},
                *({"id": f"s{i}", "mb": 5, "sec": 0.3} for i in range(6))]
    got = results(run(backend, HOLD, tasks(*subjects)))
    assert not overlaps(got["B1"], got["B2"])
    assert any(overlaps(got["B1"], got[f"s{i}"]) for i in range(6))  # the budget left room beside it: used
    stats = backend.memory_facts()["stages"]["s"]
    assert stats["predicted_subjects"] == 8 and stats["waits"] >= 1
    assert stats["median_abs_error_mb"] is not None


def test_a_subject_predicted_over_the_whole_budget_runs_alone(make_backend, tasks):
    backend = make_backend(workers=3, memory_budget_mb=300)
    backend.forecast = model_with({"X": 900.0, **{f"s{i}": 30.0 for i in range(5)}})
    subjects = [{"id": "X", "mb": 5, "sec": 0.4}, *({"id": f"s{i}", "mb": 5, "sec": 0.3} for i in range(5))]
    got = results(run(backend, HOLD, tasks(*subjects)))
    assert not any(overlaps(got["X"], got[f"s{i}"]) for i in range(5))
    stats = backend.memory_facts()["stages"]["s"]
    assert stats["over_budget"] == ["X"] and stats["ran_alone"] == 1


def test_with_nothing_known_the_smallest_runs_alone_first_then_the_rest_side_by_side(make_backend, tasks):
    backend = make_backend(workers=3, memory_budget_mb=600)
    sizes = {"a": 40.0, "b": 10.0, "c": 30.0, "d": 20.0, "e": 35.0}
    backend.forecast = model_with({}, features=sizes)
    subjects = [{"id": sid, "mb": int(size), "sec": 0.4} for sid, size in sizes.items()]
    got = results(run(backend, HOLD, tasks(*subjects)))
    first = min(got, key=lambda sid: got[sid]["start"])
    assert first == "b"  # the smallest input: the probe
    assert not any(overlaps(got["b"], got[sid]) for sid in got if sid != "b")
    rest = [got[sid] for sid in got if sid != "b"]
    assert any(overlaps(x, y) for i, x in enumerate(rest) for y in rest[i + 1:])  # learned: then in parallel
    assert backend.memory_facts()["stages"]["s"]["predicted_subjects"] == 4


def test_with_nothing_known_and_a_roomy_budget_there_is_no_probe_the_workers_fill_at_once(make_backend, tasks):
    backend = make_backend(workers=3, memory_budget_mb=6000)  # 2000 MB a slot: far over 20 fresh workers
    sizes = {"a": 10.0, "b": 20.0, "c": 30.0}
    backend.forecast = model_with({}, features=sizes)
    got = results(run(backend, HOLD, tasks(*({"id": sid, "mb": int(size), "sec": 0.6} for sid, size in sizes.items()))))
    assert overlaps(got["a"], got["b"]) and overlaps(got["b"], got["c"]) and overlaps(got["a"], got["c"])
    stats = backend.memory_facts()["stages"]["s"]
    assert stats["ran_alone"] == 0
    assert stats["predicted_subjects"] == 0  # a slot's share is no prediction: no error recorded for it


def test_a_worker_grown_by_a_leak_is_recycled_when_memory_is_short(make_backend, tasks):
    backend = make_backend(workers=2, memory_budget_mb=400)
    backend.forecast = model_with({"L": 260.0, "B": 250.0})
    subjects = [{"id": "L", "mb": 150, "sec": 0.1, "leak": 1}, {"id": "B", "mb": 20, "sec": 0.1}]
    got = results(run(backend, HOLD, tasks(*subjects)))
    assert got["L"]["end"] <= got["B"]["start"]  # the larger first, then the other: they do not fit together
    assert got["B"]["pid"] != got["L"]["pid"]
    assert backend.memory_facts()["stages"]["s"]["recycled_workers"] >= 1

