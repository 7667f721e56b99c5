"""Planning at scale: N subjects x 3 map stages, everything already done.

Builds a study in a temporary folder (manifest, operators, recipe), fills its
checkpoint store with a success for every subject of every stage through
``CheckpointStore.put`` (batches of 1000), then times a full re-plan: load
the recipe, read the manifest, open the store (for writing: the plan keeps the
digests of the files it reads), plan. Prints a table.

Then the same with two file columns (``subjects.files: [image, mask]``): one
small real file per subject and column (200,000 files for 100,000 subjects).
The first plan reads and hashes every file (the store's file table is empty);
it is compared with ``cat`` and ``b2sum`` reading the same files (warm page
cache for all three). The no-op plan, everything done and the table filled,
costs one ``stat`` per file.

    /work/venv/bin/python benchmarks/plan_scale.py [--subjects 100000] [--repeat 3] [--file-bytes 1024]

With ``--sizes 10000,100000,1000000`` it instead builds a study of each size
and plans it in a fresh process (``--repeat`` times) the way `habitrun plan`
does (the store opened read-only, beside the manifest), printing each step's
wall time, the CPU time, the per-subject cost and the process's peak RSS, and how much
each step grows from one size to the next (10x the subjects should cost 10x).
``--keep DIR`` builds each study in DIR once and reuses it (a 10^6 store takes
minutes to fill); ``--against TREE`` also plans each study with the habitrun of
another source tree (alternating fresh processes) and prints the ratios; ``--steps``
first prints the CPU of each step at the largest size (manifest, key parts, each
stage's query, one after another rather than beside each other):

    nice python benchmarks/plan_scale.py --sizes 10000,100000,1000000 --repeat 3 \\
        --keep /tmp/plan-scale --against /path/to/other/checkout --steps
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


FILES_RECIPE = RECIPE.replace(
    "subjects: {manifest: subjects.csv}", "subjects: {manifest: subjects.csv, files: [image, mask]}"
).replace("name: plan-scale", "name: plan-scale-files")


def build_with_files(folder: Path, n: int, size: int) -> tuple[Path, int]:
    """The study with an image and a mask file per subject; returns the recipe and the bytes written."""
    (folder / "ops.py").write_text(OPS)
    total = 0
    for column in ("img", "msk"):
        data = folder / "data" / column
        for start in range(0, n, 1000):  # 1000 files a folder, like a study's series folders
            sub = data / f"{start // 1000:03d}"
            sub.mkdir(parents=True)
            for i in range(start, min(n, start + 1000)):
                body = (f"{column} S{i:06d} ".encode() * (size // 12 + 1))[:size]
                (sub / f"S{i:06d}.dat").write_bytes(body)
                total += len(body)
    lines = ["subject_id,site,age,image,mask"]
    lines += [f"S{i:06d},site{i % 7},{20 + i % 60},data/img/{i // 1000:03d}/S{i:06d}.dat,"
              f"data/msk/{i // 1000:03d}/S{i:06d}.dat" for i in range(n)]
    (folder / "subjects.csv").write_text("\n".join(lines) + "\n")
    recipe = folder / "recipe.yaml"
    recipe.write_text(FILES_RECIPE)
    return recipe, total


def fill_store(recipe: Path) -> tuple[int, float]:
    """A success for every subject of every stage; (records, seconds)."""
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
                                components=stage.components_json(sid)))
            if len(batch) == 1000:
                store.put(batch)
                n_records += len(batch)
                batch = []
        store.put(batch)
        n_records += len(batch)
    store.close()
    return n_records, time.perf_counter() - t0


def forget_files(recipe: Path) -> None:
    """Empty the store's file table and column snapshots: the next plan hashes every file again."""
    con = sqlite3.connect(load_recipe(recipe).store_dir() / "cache.db")
    con.execute("DELETE FROM habitrun_file")
    con.execute("DELETE FROM habitrun_meta WHERE name LIKE 'files:%'")
    con.commit()
    con.close()


def floor_sec(tool: str, folder: Path) -> float | None:
    """Seconds for ``tool`` to read every data file (find | xargs), or None without it."""
    if shutil.which(tool) is None:
        return None
    t0 = time.perf_counter()
    subprocess.run(f"find data -type f -print0 | xargs -0 {tool} > /dev/null", shell=True, cwd=folder, check=True)
    return time.perf_counter() - t0


def with_files(n: int, repeat: int, size: int) -> None:
    with tempfile.TemporaryDirectory(prefix="habitrun-plan-files-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        recipe, total = build_with_files(folder, n, size)
        print(f"\nwith 2 file columns: {2 * n:,} files of {size} bytes ({total / 1e6:.0f} MB), "
              f"written in {time.perf_counter() - t0:.1f} s")
        n_records, _ = fill_store(recipe)
        floor_sec("cat", folder)  # warm the page cache for everyone alike
        print(f"{'run':>4} {'first plan (hash all)':>22} {'cpu':>7} {'MB/s':>6} {'no-op plan (stat)':>18} {'cpu':>7}")
        best_first = best_noop = best_noop_cpu = None
        for i in range(repeat):
            forget_files(recipe)
            first, plan = plan_once(recipe)
            assert plan.counts()["done"] == n_records, plan.counts()
            noop, plan = plan_once(recipe)
            assert plan.counts()["done"] == n_records, plan.counts()
            print(f"{i + 1:>4} {first['total']:>21.3f}s {first['cpu']:>6.3f}s {total / 1e6 / first['total']:>6.0f} "
                  f"{noop['total']:>17.3f}s {noop['cpu']:>6.3f}s")
            best_first = first["total"] if best_first is None else min(best_first, first["total"])
            best_noop = noop["total"] if best_noop is None else min(best_noop, noop["total"])
            best_noop_cpu = noop["cpu"] if best_noop_cpu is None else min(best_noop_cpu, noop["cpu"])
        print()
        for tool in ("cat", "b2sum"):
            sec = floor_sec(tool, folder)
            if sec is not None and best_first:
                print(f"{tool + ' of the same files':<28} {sec:7.3f} s  {total / 1e6 / sec:6.0f} MB/s   "
                      f"first plan / {tool}: {best_first / sec:.2f}x")
        print(f"best first plan (hash {2 * n:,} files, incl. manifest): {best_first:.3f} s")
        print(f"best no-op plan (stat {2 * n:,} files, incl. manifest): {best_noop:.3f} s wall, "
              f"{best_noop_cpu:.3f} s cpu   (target <= 1.5 s)")
        print(f"files hashed per second (first plan): {2 * n / best_first:,.0f}; cpu count {os.cpu_count()}")


def _subjects_and_store(loaded: Any, read_only: bool) -> tuple[Any, CheckpointStore]:
    """The subjects and the store. ``read_only`` as `habitrun plan` gets them: side by side when
    the habitrun under test can (habitrun.study.opening, formerly habitrun.planner.opening), else one after the other. Otherwise
    the store opened for writing (the plan keeps the digests of the files it read), after."""
    def open_store() -> CheckpointStore:
        return CheckpointStore.open(loaded.store_dir(), create=False, read_only=read_only)

    if not read_only:
        return load_subjects(loaded), open_store()
    try:
        from habitrun.study.opening import subjects_and_store
    except ImportError:
        try:
            from habitrun.planner.opening import subjects_and_store
        except ImportError:  # an older tree (--against)
            return load_subjects(loaded), open_store()
    return subjects_and_store(loaded, open_store)


def plan_once(recipe: Path, read_only: bool = False) -> tuple[dict[str, float], object]:
    """Wall times of each step, and the CPU time of the plan step (the machine is shared)."""
    times: dict[str, float] = {}
    c0 = time.process_time()
    t0 = time.perf_counter()
    loaded = load_recipe(recipe)
    t1 = time.perf_counter()
    subjects, store = _subjects_and_store(loaded, read_only)
    t3 = time.perf_counter()
    c3 = time.process_time()
    plan = plan_study(loaded, subjects, store)
    t4 = time.perf_counter()
    times["plan_cpu"] = time.process_time() - c3
    times["cpu"] = time.process_time() - c0  # user + system time of every step (the machine is shared)
    store.close()
    times.update(load_recipe=t1 - t0, subjects_store=t3 - t1, plan=t4 - t3, total=t4 - t0)
    return times, plan


STEPS = ("load_recipe", "subjects_store", "plan", "total")


def measure_child(recipe: Path) -> None:
    """One plan in this (fresh) process; prints its step times and peak RSS as JSON."""
    times, plan = plan_once(recipe, read_only=True)
    times["done"] = plan.counts()[SubjectStatus.DONE.value]
    times["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(times))


def breakdown_child(recipe: Path) -> None:
    """The CPU time of each step of a plan, one step after another in this process (no thread
    beside), the cycle collector off as plan_study has it; prints them as JSON."""
    import gc

    from habitrun.planner.context import build_context
    from habitrun.planner.keys import subject_parts
    from habitrun.planner.plan import outcome_ranges

    cpu: dict[str, float] = {}

    def timed(name: str, step: Any) -> Any:
        c0 = time.process_time()
        out = step()
        cpu[name] = time.process_time() - c0
        return out

    gc.disable()
    loaded = load_recipe(recipe)
    subjects = timed("manifest", lambda: load_subjects(loaded))
    store = timed("open store", lambda: CheckpointStore.open(loaded.store_dir(), create=False, read_only=True))
    timed("key parts", lambda: subject_parts(subjects))
    context = build_context(loaded, subjects, store)
    for stage, prefix in outcome_ranges(loaded.recipe, {n: i.fingerprint for n, i in context.stages.items()}, context):
        timed(f"stage {stage} query", lambda stage=stage, prefix=prefix: store.outcome_texts(stage, prefix))
    store.close()
    print(json.dumps(cpu))


def breakdown(recipe: Path, repeat: int, trees: dict[str, str | None]) -> None:
    """Medians of :func:`breakdown_child`'s CPU times, each tree in alternating fresh processes."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(repeat):
        for name, tree in trees.items():
            runs[name].append(_child(recipe, tree, "--breakdown-child"))
    print(f"CPU of each step, one after another (median of {repeat} fresh processes):")
    for name, got in runs.items():
        steps = " ".join(f"{k} {statistics.median(r[k] for r in got):.3f}s" for k in got[0])
        print(f"{name:>7}: {steps}")


def _child(recipe: Path, tree: str | None, mode: str = "--measure") -> dict[str, float]:
    """One measured plan in a fresh process, importing habitrun from ``tree`` (None: this one)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    done = subprocess.run([sys.executable, __file__, mode, str(recipe)],
                          capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _study(n: int, keep: Path | None, tmp: Path) -> tuple[Path, int, float]:
    """The study of ``n`` subjects with its store filled: built in ``tmp``, or reused from ``keep``."""
    folder = (keep / f"plan-scale-{n}") if keep is not None else tmp / f"plan-scale-{n}"
    marker = folder / "built.json"
    if marker.is_file():
        info = json.loads(marker.read_text())
        return folder / "recipe.yaml", info["records"], 0.0
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    recipe = build(folder, n)
    n_records, build_sec = fill_store(recipe)
    marker.write_text(json.dumps({"records": n_records}))
    return recipe, n_records, build_sec


def sweep(sizes: list[int], repeat: int, keep: Path | None = None, against: str | None = None,
          steps: bool = False) -> None:
    """Each size built and planned in fresh processes; medians of wall, CPU and peak RSS, growth per 10x.

    With ``against`` (another source tree), its habitrun plans the same studies in alternating
    runs, so both sides see the same machine load."""
    trees: dict[str, str | None] = {"this": None}
    if against is not None:
        trees = {"this": str(Path(__file__).resolve().parents[1]), "against": against}
    print(f"manifest + plan, N subjects x 3 map stages, everything stored as done; "
          f"median of {repeat} fresh processes (min-max of total); cpu = user + system of the steps")
    print(f"{'tree':>7} {'subjects':>9} {'build s':>8} " + " ".join(f"{s:>13}" for s in STEPS)
          + f" {'cpu':>8} {'total range':>15} {'us/subject':>10} {'peak RSS MB':>11}")
    rows: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="habitrun-plan-scale-") as tmp:
        for n in sizes:
            recipe, n_records, build_sec = _study(n, keep, Path(tmp))
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for _ in range(repeat):
                for name, tree in trees.items():
                    runs[name].append(_child(recipe, tree))
            for name in trees:
                got = runs[name]
                assert all(r["done"] == n_records for r in got), got
                med = {k: statistics.median(r[k] for r in got) for k in (*STEPS, "cpu", "peak_rss_mb")}
                totals = [r["total"] for r in got]
                rows[(name, n)] = med
                print(f"{name:>7} {n:>9,} {build_sec:>8.1f} " + " ".join(f"{med[s]:>12.3f}s" for s in STEPS)
                      + f" {med['cpu']:>7.2f}s {min(totals):>7.2f}-{max(totals):<7.2f}"
                      f" {med['total'] / n * 1e6:>10.1f} {med['peak_rss_mb']:>11.0f}", flush=True)
        if steps:  # the last size's study, still there
            breakdown(recipe, repeat, trees)
    for name in trees:
        ordered = sorted(n for tree, n in rows if tree == name)
        for small, big in zip(ordered, ordered[1:], strict=False):
            a, b = rows[(name, small)], rows[(name, big)]
            growth = " ".join(f"{s} x{b[s] / a[s]:.1f}" for s in (*STEPS, "cpu") if a[s] > 0)
            print(f"{name}: {small:,} -> {big:,} subjects (x{big / small:g}): {growth}; "
                  f"peak RSS x{b['peak_rss_mb'] / a['peak_rss_mb']:.1f}")
    if against is not None:
        for n in sizes:
            a, b = rows[("this", n)], rows[("against", n)]
            print(f"{n:>9,} subjects: this / against: wall {a['total'] / b['total']:.2f}, "
                  f"cpu {a['cpu'] / b['cpu']:.2f}, peak RSS {a['peak_rss_mb'] / b['peak_rss_mb']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default=None,
                        help="comma-separated subject counts, e.g. 10000,100000,1000000: the scaling table")
    parser.add_argument("--keep", type=Path, default=None,
                        help="with --sizes: build each study in this folder once and reuse it on later runs")
    parser.add_argument("--against", default=None,
                        help="with --sizes: another source tree whose habitrun plans the same studies, alternating")
    parser.add_argument("--steps", action="store_true",
                        help="with --sizes: also the CPU of each step (manifest, key parts, each stage's query) "
                             "at the largest size, run one after another")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)  # the child of --sizes
    parser.add_argument("--breakdown-child", type=Path, default=None, help=argparse.SUPPRESS)  # of --steps
    parser.add_argument("--file-bytes", type=int, default=1024, help="size of each input file")
    parser.add_argument("--no-files", action="store_true", help="skip the study with file columns")
    args = parser.parse_args()
    if args.measure is not None:
        measure_child(args.measure)
        return
    if args.breakdown_child is not None:
        breakdown_child(args.breakdown_child)
        return
    if args.sizes:
        sweep([int(x) for x in args.sizes.split(",")], args.repeat, args.keep, args.against, args.steps)
        return
    with tempfile.TemporaryDirectory(prefix="habitrun-plan-scale-") as tmp:
        recipe = build(Path(tmp), args.subjects)
        n_records, build_sec = fill_store(recipe)
        print(f"subjects: {args.subjects:,}   stages: 3   records stored: {n_records:,}")
        print(f"build store (put, batches of 1000): {build_sec:8.2f} s  ({build_sec / n_records * 1e6:.0f} us/record)")
        print()
        print(f"{'run':>4} {'load_recipe':>12} {'subjects+store':>15} {'plan':>8} {'plan cpu':>9} {'total':>8}")
        best = best_plan = None
        for i in range(args.repeat):
            times, plan = plan_once(recipe)
            counts = plan.counts()
            assert counts[SubjectStatus.DONE.value] == n_records, counts
            print(f"{i + 1:>4} {times['load_recipe']:>11.3f}s {times['subjects_store']:>14.3f}s "
                  f"{times['plan']:>7.3f}s {times['plan_cpu']:>8.3f}s {times['total']:>7.3f}s")
            best = times["total"] if best is None else min(best, times["total"])
            best_plan = times["plan"] if best_plan is None else min(best_plan, times["plan"])
        print()
        print(f"best plan step (keys + store + statuses, all done): {best_plan:.3f} s")
        print(f"best total (recipe + manifest + store + plan):      {best:.3f} s")
    if not args.no_files:
        with_files(args.subjects, args.repeat, args.file_bytes)


if __name__ == "__main__":
    main()
