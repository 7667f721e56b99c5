"""A memory budget under a real memory limit (a cgroup v1 memory cgroup of 1.5 GB, made and removed here).

The study is skewed: 3 subjects of about 600 MB and 12 of about 50 MB,
sleeping so that cores are not the limit, `workers: 4`. With fixed workers
and no budget the kernel's OOM killer takes a subject (asserted: the limit
is real); with `memory_budget_mb: auto` nothing is killed and every subject
is done. Wall times are compared in benchmarks/memory_admission.py.
"""

from __future__ import annotations

import json

from habitrun.cli.memory_text import run_memory
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.trace import TRACE_COLUMNS
from tests.engine.memstudy import MemoryCgroup, cgroup_v1_available, make_skewed_study

LIMIT_MB = 1536


def trace_rows(recipe) -> list[dict]:
    with CheckpointStore.open(recipe.parent / ".habitrun" / "store", create=False, read_only=True) as store:
        return [dict(zip(TRACE_COLUMNS, row, strict=True)) for row in store.trace(stage="hog")]


def provenance(recipe) -> dict:
    (run,) = (recipe.parent / ".habitrun" / "runs").iterdir()
    return json.loads((run / "provenance.json").read_text())


def test_budget_admits_by_predicted_memory_where_fixed_workers_get_oom_killed(tmp_path):
    why = cgroup_v1_available()
    assert why is None, f"this test needs a cgroup v1 memory controller, as root: {why}"

    # the big ones hold their memory long enough to meet whatever their workers' staggered starts
    fixed = make_skewed_study(tmp_path / "fixed", big_hold=0.8, policy={"memory_budget_mb": None})
    with MemoryCgroup(LIMIT_MB) as cg:
        run = cg.run(["run", str(fixed)], cwd=fixed.parent)
        kills = cg.oom_kills()
    rows = trace_rows(fixed)
    assert kills > 0, f"no OOM kill with fixed workers: the limit is not real\n{run.stdout}\n{run.stderr}"
    assert any(r["kind"] == "oom" for r in rows), rows

    budget = make_skewed_study(tmp_path / "budget", big_hold=0.8, policy={"memory_budget_mb": "auto"})
    with MemoryCgroup(LIMIT_MB) as cg:
        run = cg.run(["run", str(budget)], cwd=budget.parent)
        kills = cg.oom_kills()
    rows = trace_rows(budget)
    assert run.returncode == 0, run.stdout + run.stderr
    assert kills == 0, (kills, run.stdout + run.stderr)
    assert sorted(r["subject"] for r in rows if r["outcome"] == "done") == [f"s{i:02d}" for i in range(15)]
    assert all(r["outcome"] == "done" for r in rows), rows  # no attempt killed, none retried
    big = [r["peak_rss_mb"] for r in rows if r["subject"] in ("s00", "s01", "s02")]
    assert min(big) > 550, big  # the big ones really took their memory

    memory = run_memory(provenance(budget))
    assert 0.8 * LIMIT_MB * 0.85 < memory["budget_mb"] < 0.85 * LIMIT_MB, memory  # auto: of the cgroup limit
    assert "cgroup limit" in memory["source"]
    hog = memory["stages"]["hog"]
    assert hog["predicted_subjects"] == 14  # all but the probe, which ran alone with nothing known
    assert hog["ran_alone"] >= 1 and hog["oom_retried_alone"] == 0


def test_a_subject_killed_for_memory_beside_others_is_retried_alone_and_not_charged(tmp_path):
    """The manifest's memory_hint says every subject is alike; one takes ten times the others' memory.

    Admission packs it beside the small ones, the kernel kills it; it runs again alone and succeeds, and
    no failure is recorded for it: the kill is counted in the run's memory facts, not charged.
    """
    why = cgroup_v1_available()
    assert why is None, f"this test needs a cgroup v1 memory controller, as root: {why}"
    recipe = make_skewed_study(tmp_path / "liar", small=7, big=1, small_mb=40, big_mb=330, hint=1, big_from=4, sleep=0.8,
                               policy={"memory_budget_mb": "auto", "memory_hint": "hint", "auto_retry_rounds": 0})
    with MemoryCgroup(450) as cg:
        run = cg.run(["run", str(recipe)], cwd=recipe.parent)
        kills = cg.oom_kills()
    assert run.returncode == 0, run.stdout + run.stderr  # no retry rounds: only admission's retry saved it
    assert kills >= 1, "the big subject was never killed: the hint did not mislead admission"
    rows = trace_rows(recipe)
    assert sorted(r["subject"] for r in rows) == [f"s{i:02d}" for i in range(8)]  # one attempt each, all done
    assert all(r["outcome"] == "done" for r in rows), rows
    hog = run_memory(provenance(recipe))["stages"]["hog"]
    assert hog["oom_retried_alone"] == kills, hog
