"""Planning at scale: N subjects x 3 map stages, everything already done.

Builds a study in a temporary folder (manifest, operators, recipe), fills its
checkpoint store with a success for every subject of every stage through
``CheckpointStore.put`` (batches of 1000), then times a full re-plan the way
`habitrun plan` does it: load the recipe, read the manifest, open the store,
plan. Prints a table.

    /work/venv/bin/python benchmarks/plan_scale.py [--subjects 100000] [--repeat 3]

With ``--sizes 10000,100000,1000000`` it instead builds a study of each size
and plans it in a fresh process (``--repeat`` times), printing each step's
time, the per-subject cost and the planning process's peak RSS, and how much
each step grows from one size to the next (10x the subjects should cost 10x).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from habitrun.planner import SubjectStatus, plan_study
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from habitrun.store import CheckpointStore, Record

RECIPE = """\
habitrun: 1
name: plan-scale
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: a, operator: "ops:first", params: {k: 1}}
  - {name: b, operator: "ops:second", needs: [a]}
  - {name: c, operator: "ops:third", needs: [b], params: {bins: [1, 2, 3]}}
"""

OPS = """\
def first(subject, k):
    return k

def second(subject):
    return 2

def third(subject, bins):
    return len(bins)
"""


def build(folder: Path, n: int) -> Path:
    (folder / "ops.py").write_text(OPS)
    lines = ["subject_id,site,age,seed"]
    lines += [f"S{i:06d},site{i % 7},{20 + i % 60},{i * 7919 % 100003}" for i in range(n)]
    (folder / "subjects.csv").write_text("\n".join(lines) + "\n")
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE)
    return recipe


def plan_once(recipe: Path) -> tuple[dict[str, float], object]:
    """Wall times of each step, and the CPU time of the plan step (the machine is shared)."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    loaded = load_recipe(recipe)
    t1 = time.perf_counter()
    subjects = load_subjects(loaded)
    t2 = time.perf_counter()
    store = CheckpointStore.open(loaded.store_dir(), create=False)
    t3 = time.perf_counter()
    c3 = time.process_time()
    plan = plan_study(loaded, subjects, store)
    t4 = time.perf_counter()
    times["plan_cpu"] = time.process_time() - c3
    store.close()
    times.update(load_recipe=t1 - t0, load_subjects=t2 - t1, open_store=t3 - t2, plan=t4 - t3, total=t4 - t0)
    return times, plan


def fill_store(recipe: Path) -> tuple[int, float]:
    """Store a success for every subject of every stage; (records, seconds)."""
    loaded = load_recipe(recipe)
    subjects = load_subjects(loaded)
    store = CheckpointStore.open(loaded.store_dir())
    first = plan_study(loaded, subjects, store)
    t0 = time.perf_counter()
    n_records = 0
    for stage in first:
        batch: list[Record] = []
        for sid, key in stage.keys.items():
            batch.append(Record(stage=stage.name, key=key, subject_id=sid, ok=True, result=1,
                                components=stage.components[sid]))
            if len(batch) == 1000:
                store.put(batch)
                n_records += len(batch)
                batch = []
        store.put(batch)
        n_records += len(batch)
    build_sec = time.perf_counter() - t0
    store.close()
    return n_records, build_sec


STEPS = ("load_recipe", "load_subjects", "open_store", "plan", "total")


def measure_child(recipe: Path) -> None:
    """One plan in this (fresh) process; prints its step times and peak RSS as JSON."""
    times, plan = plan_once(recipe)
    times["done"] = plan.counts()[SubjectStatus.DONE.value]
    times["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(times))


def sweep(sizes: list[int], repeat: int) -> None:
    """Each size built and planned in a fresh process; medians, peak RSS and growth per 10x."""
    print(f"manifest + plan, N subjects x 3 map stages, everything stored as done; "
          f"median of {repeat} fresh processes (min-max of total)")
    print(f"{'subjects':>9} {'build s':>8} " + " ".join(f"{s:>13}" for s in STEPS)
          + f" {'total range':>15} {'us/subject':>10} {'peak RSS MB':>11}")
    rows: dict[int, dict[str, float]] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="habitrun-plan-scale-") as tmp:
            recipe = build(Path(tmp), n)
            n_records, build_sec = fill_store(recipe)
            runs = []
            for _ in range(repeat):
                done = subprocess.run([sys.executable, __file__, "--measure", str(recipe)],
                                      capture_output=True, text=True, check=True)
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        assert all(r["done"] == n_records for r in runs), runs
        med = {k: statistics.median(r[k] for r in runs) for k in (*STEPS, "peak_rss_mb")}
        totals = [r["total"] for r in runs]
        rows[n] = med
        print(f"{n:>9,} {build_sec:>8.1f} " + " ".join(f"{med[s]:>12.3f}s" for s in STEPS)
              + f" {min(totals):>7.2f}-{max(totals):<7.2f} {med['total'] / n * 1e6:>10.1f}"
              f" {med['peak_rss_mb']:>11.0f}", flush=True)
    ordered = sorted(rows)
    for small, big in zip(ordered, ordered[1:], strict=False):
        factor = big / small
        growth = " ".join(f"{s} x{rows[big][s] / rows[small][s]:.1f}" for s in STEPS if rows[small][s] > 0)
        print(f"{small:,} -> {big:,} subjects (x{factor:g}): {growth}; "
              f"peak RSS x{rows[big]['peak_rss_mb'] / rows[small]['peak_rss_mb']:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default=None,
                        help="comma-separated subject counts, e.g. 10000,100000,1000000: the scaling table")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)  # the child of --sizes
    args = parser.parse_args()
    if args.measure is not None:
        measure_child(args.measure)
        return
    if args.sizes:
        sweep([int(x) for x in args.sizes.split(",")], args.repeat)
        return
    with tempfile.TemporaryDirectory(prefix="habitrun-plan-scale-") as tmp:
        recipe = build(Path(tmp), args.subjects)
        n_records, build_sec = fill_store(recipe)
        print(f"subjects: {args.subjects:,}   stages: 3   records stored: {n_records:,}")
        print(f"build store (put, batches of 1000): {build_sec:8.2f} s  ({build_sec / n_records * 1e6:.0f} us/record)")
        print()
        print(f"{'run':>4} {'load_recipe':>12} {'load_subjects':>14} {'open_store':>11} {'plan':>8} "
              f"{'plan cpu':>9} {'total':>8}")
        best = best_plan = None
        for i in range(args.repeat):
            times, plan = plan_once(recipe)
            counts = plan.counts()
            assert counts[SubjectStatus.DONE.value] == n_records, counts
            print(f"{i + 1:>4} {times['load_recipe']:>11.3f}s {times['load_subjects']:>13.3f}s "
                  f"{times['open_store']:>10.3f}s {times['plan']:>7.3f}s {times['plan_cpu']:>8.3f}s "
                  f"{times['total']:>7.3f}s")
            best = times["total"] if best is None else min(best, times["total"])
            best_plan = times["plan"] if best_plan is None else min(best_plan, times["plan"])
        print()
        print(f"best plan step (keys + store + statuses, all done): {best_plan:.3f} s")
        print(f"best total (recipe + manifest + store + plan):      {best:.3f} s")


if __name__ == "__main__":
    main()
