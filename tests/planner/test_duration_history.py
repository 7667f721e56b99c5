"""planner/duration_history.py: a stage's typical subject duration, from its successful attempts of the same code."""

from __future__ import annotations

from pathlib import Path

from habitrun.planner.duration_history import typical_duration
from habitrun.planner.plan import plan_study
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.trace import TRACE_COLUMNS
from tests.planner.study import OPS_A, load, write_study


def row(stage: str, sid: str, key: str, outcome: str, wall: float | None, started: float | None = None,
        ended: float | None = None) -> tuple:
    values = dict.fromkeys(TRACE_COLUMNS) | {"run_id": "r1", "stage": stage, "subject": sid, "attempt": 1,
                                             "outcome": outcome, "wall_sec": wall, "started_at": started,
                                             "ended_at": ended, "key": key, "host": "h"}
    return tuple(values[c] for c in TRACE_COLUMNS)


def test_the_median_of_the_done_attempts_of_the_stage_and_its_current_code(tmp_path: Path) -> None:
    recipe = write_study(tmp_path)
    loaded, subjects = load(recipe)
    with CheckpointStore.open(loaded.store_dir()) as store:
        plan = plan_study(loaded, subjects, store)
        a, b = plan.stages["a"], plan.stages["b"]
        assert typical_duration(store, "a", a.key_prefix) is None  # no history yet
        store.put([], [row("a", "S1", a.keys["S1"], "done", 1.0), row("a", "S2", a.keys["S2"], "done", 2.0),
                       row("a", "S3", a.keys["S3"], "retried", 500.0),  # a failed attempt's time: left out
                       row("a", "S3", a.keys["S3"], "done", 4.0),
                       row("a", "S4", a.keys["S4"], "failed", 999.0),
                       row("a", "S5", a.keys["S5"], "done", None, started=100.0, ended=103.0),  # no wall: end - start
                       row("a", "S1", "OLDCODE." + a.keys["S1"].rsplit(".", 1)[-1], "done", 0.001),  # other code
                       row("b", "S1", b.keys["S1"], "done", 60.0)])  # another stage
        assert typical_duration(store, "a", a.key_prefix) == 2.5  # median of 1, 2, 3, 4
        assert typical_duration(store, "b", b.key_prefix) == 60.0
        assert typical_duration(store, "a", "") == 2.0  # without a prefix, every done attempt: 1, 2, 4, 3, 0.001
        assert typical_duration(None, "a", a.key_prefix) is None

        (tmp_path / "ops_a.py").write_text(OPS_A + "\n# the code changed\nVERSION = 2\n")
        loaded, subjects = load(recipe)
        changed = plan_study(loaded, subjects, store).stages["a"]
        assert changed.key_prefix != a.key_prefix
        assert typical_duration(store, "a", changed.key_prefix) is None  # learning starts again
