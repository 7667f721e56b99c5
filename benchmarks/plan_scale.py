"""Planning at scale: N subjects x 3 map stages, everything already done.

Builds a study in a temporary folder (manifest, operators, recipe), fills its
checkpoint store with a success for every subject of every stage through
``CheckpointStore.put`` (batches of 1000), then times a full re-plan the way
`habitrun plan` does it: load the recipe, read the manifest, open the store,
plan. Prints a table.

    /work/venv/bin/python benchmarks/plan_scale.py [--subjects 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="habitrun-plan-scale-") as tmp:
        recipe = build(Path(tmp), args.subjects)
        loaded = load_recipe(recipe)
        subjects = load_subjects(loaded)
        store = CheckpointStore.open(loaded.store_dir())
        first = plan_study(loaded, subjects, store)
        t0 = time.perf_counter()
        n_records = 0
        for stage in first:
            batch: list[Record] = []
            for sid, key in stage.keys.items():
                batch.append(Record(stage=stage.name, key=key, subject_id=sid, ok=True, result=1, components=stage.components[sid]))
                if len(batch) == 1000:
                    store.put(batch)
                    n_records += len(batch)
                    batch = []
            store.put(batch)
            n_records += len(batch)
        build_sec = time.perf_counter() - t0
        store.close()

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
