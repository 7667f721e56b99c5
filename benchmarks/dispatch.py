"""Dispatch overhead: habitrun's process backend against the usual process pools.

N subjects of an operator that busy-loops w ms, on 2 workers, side by side in
one run. habitrun writes every batch of outcomes to a real CheckpointStore
(when ``habitrun.store.checkpoint`` is importable) and every subject gets its
own log file, so its column pays for durability the others do not.

    python benchmarks/dispatch.py --quick          # N=1000
    python benchmarks/dispatch.py                  # N=2000 and 20000

Per-subject overhead = (wall - N*w/workers) / N; efficiency = ideal / wall.
The isolated-mode table compares a fresh process per subject (private
forkserver with the operator's module preloaded) to spawn-per-subject.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)


def busy(subject, ms=1.0):
    """The habitrun operator: spin ``ms`` milliseconds."""
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass
    return 1


def busy_plain(ms: float) -> int:
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass
    return 1


def run_habitrun(n: int, ms: float, workers: int, mode: str = "persistent") -> float:
    from habitrun.engine.contract import OperatorRef, SubjectTask
    from habitrun.engine.control import StopFlag
    from habitrun.engine.process import ProcessBackend
    from habitrun.spec.policy import RunPolicy

    try:
        from habitrun.store.checkpoint import CheckpointStore, Record
    except ImportError:  # the store is not there yet: measure dispatch alone
        CheckpointStore = Record = None  # noqa: N806

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = CheckpointStore.open(root / "store") if CheckpointStore else None
        policy = RunPolicy(workers=workers, parallel_mode=mode, subject_timeout_sec=600)
        backend = ProcessBackend.from_policy(policy)
        op = OperatorRef("bench", "dispatch:busy", {"ms": ms}, search_path=(HERE,))
        # warm the workers up (as a study's earlier stage would)
        warm = [SubjectTask(key=f"w{i}", subject_id=f"w{i}", fields={}, inputs={}, workdir=str(root / "wd"),
                            log_path=str(root / "logs" / "warm.log"))
                for i in range(workers * 2)]
        backend.run_tasks(op, warm, lambda batch: None, StopFlag())
        tasks = [SubjectTask(key=f"k{i}", subject_id=f"S{i}", fields={}, inputs={}, workdir=str(root / "wd" / f"S{i}"),
                             log_path=str(root / "logs" / f"S{i}.log")) for i in range(n)]
        done = 0

        def report(batch):
            nonlocal done
            done += len(batch)
            if store is not None:
                store.put([Record(stage="bench", key=o.task.key, subject_id=o.task.subject_id, ok=o.ok, result=o.result, error=o.error, kind=o.kind)
                           for o in batch])

        t0 = time.perf_counter()
        backend.run_tasks(op, tasks, report, StopFlag())
        wall = time.perf_counter() - t0
        backend.close()
        if store is not None:
            store.close()
        assert done == n, (done, n)
        return wall


POLICY: dict = {}  # --policy KEY=VALUE: more policy for the habitrun-engine column


def budget_value(text: str) -> int | str | None:
    """A --memory-budget value as the recipe would hold it: a number of MB, 'auto' or null."""
    return None if text in ("null", "none") else text if text == "auto" else int(text)


def run_habitrun_engine(n: int, ms: float, workers: int) -> float:
    """The whole engine, as `habitrun run` does it: a recipe, a plan, the process backend,
    every outcome stored in the checkpoint store and written to the event log. Timed from the
    measured stage's start to its end (a first stage of the same operator warms the workers)."""
    import json

    from habitrun.engine.events import Event, StageFinished, StageStarted
    from habitrun.engine.runner import run_study
    from habitrun.spec.loader import load_recipe

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i}\n" for i in range(n)))
        recipe = {
            "habitrun": 1, "name": "dispatch-bench", "subjects": {"manifest": "subjects.csv"},
            "policy": {"workers": workers, "subject_timeout_sec": 600, "auto_retry_rounds": 0, **POLICY},
            "stages": [
                {"name": "warm", "operator": "dispatch:busy", "params": {"ms": 0.0}},
                {"name": "bench", "operator": "dispatch:busy", "params": {"ms": ms}},
            ],
        }
        (root / "recipe.yaml").write_text(json.dumps(recipe))
        (root / "dispatch.py").write_text(Path(__file__).read_text())
        marks: dict[str, float] = {}

        def observe(event: Event) -> None:
            if isinstance(event, (StageStarted, StageFinished)) and event.stage == "bench":
                marks[event.EVENT] = time.perf_counter()

        summary = run_study(load_recipe(root / "recipe.yaml"), observer=observe, install_signal_handlers=False)
        assert summary.exit_code == 0, summary.failures[:3]
        return marks["stage_finished"] - marks["stage_started"]


def run_executor(n: int, ms: float, workers: int) -> float:
    with concurrent.futures.ProcessPoolExecutor(workers) as ex:
        list(ex.map(busy_plain, [0.0] * workers * 2))
        t0 = time.perf_counter()
        for _ in ex.map(busy_plain, [ms] * n, chunksize=1):
            pass
        return time.perf_counter() - t0


def run_mp_pool(n: int, ms: float, workers: int) -> float:
    with multiprocessing.Pool(workers) as pool:
        pool.map(busy_plain, [0.0] * workers * 2)
        t0 = time.perf_counter()
        for _ in pool.imap(busy_plain, [ms] * n, chunksize=1):
            pass
        return time.perf_counter() - t0


def run_joblib(n: int, ms: float, workers: int) -> float:
    from joblib import Parallel, delayed

    with Parallel(n_jobs=workers, backend="loky") as par:
        par(delayed(busy_plain)(0.0) for _ in range(workers * 2))
        t0 = time.perf_counter()
        par(delayed(busy_plain)(ms) for _ in range(n))
        return time.perf_counter() - t0


def run_spawn_per_subject(n: int, ms: float, workers: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, max_tasks_per_child=1) as ex:
        t0 = time.perf_counter()
        for _ in ex.map(busy_plain, [ms] * n):
            pass
        return time.perf_counter() - t0


def run_habitrun_dask(n: int, ms: float, workers: int) -> float:
    """habitrun's Dask backend on a warm 2-worker local cluster (see dispatch_dask.py)."""
    from dispatch_dask import run_habitrun_dask as run_on

    from habitrun.engine.dask_backend import DaskBackend
    from habitrun.spec.policy import RunPolicy

    policy = RunPolicy(backend="dask", workers=workers, subject_timeout_sec=600)
    with tempfile.TemporaryDirectory() as tmp, DaskBackend.from_policy(policy) as backend:
        run_on(backend, 8, 0.0, Path(tmp) / "warm")
        return run_on(backend, n, ms, Path(tmp))


def run_dask_client_map(n: int, ms: float, workers: int) -> float:
    """Plain ``client.map`` on a warm local cluster: no per-subject records, logs or timeouts."""
    import logging

    from distributed import Client, LocalCluster

    # silence_logs: its workers' heartbeats to the closing scheduler log harmless tracebacks
    with LocalCluster(n_workers=workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=None,
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        client.gather(client.map(busy_plain, [0.0] * 8, pure=False))
        t0 = time.perf_counter()
        client.gather(client.map(busy_plain, [ms] * n, pure=False))
        return time.perf_counter() - t0


COLUMNS = {
    "habitrun-engine": run_habitrun_engine,
    "habitrun-backend": run_habitrun,
    "ProcessPoolExecutor": run_executor,
    "mp.Pool.imap": run_mp_pool,
    "joblib-loky": run_joblib,
}
if importlib.util.find_spec("distributed") is not None:  # the [dask] extra
    COLUMNS["habitrun-dask"] = run_habitrun_dask
    COLUMNS["dask client.map"] = run_dask_client_map


def row(name: str, n: int, ms: float, workers: int, wall: float) -> str:
    ideal = n * ms / 1000.0 / workers
    overhead_us = (wall - ideal) / n * 1e6
    eff = f"{ideal / wall * 100:6.1f}%" if ms > 0 else "    n/a"
    return f"{name:<22} {n:>6} {ms:>5g} {wall:>9.3f} {overhead_us:>11.1f} {eff:>8}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N=1000 only")
    parser.add_argument("--n", type=int, nargs="*", help="subject counts (default 2000 20000)")
    parser.add_argument("--ms", type=float, nargs="*", default=[0.0, 1.0, 10.0], help="busy ms per subject")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=list(COLUMNS), help="columns to run")
    parser.add_argument("--isolated-n", type=int, default=60, help="subjects for the isolated table")
    parser.add_argument("--memory-budget", type=budget_value, default="auto",
                        help="policy.memory_budget_mb of the habitrun-engine column: MB, auto (the default) or null")
    args = parser.parse_args()
    POLICY["memory_budget_mb"] = args.memory_budget
    sizes = args.n or ([1000] if args.quick else [2000, 20000])
    columns = {k: v for k, v in COLUMNS.items() if not args.only or k in args.only}
    print(f"# {os.cpu_count()} cpus, {args.workers} workers, python {sys.version.split()[0]}")
    print(f"{'column':<22} {'N':>6} {'w ms':>5} {'wall s':>9} {'us/subject':>11} {'eff':>8}")
    for n in sizes:
        for ms in args.ms:
            for name, fn in columns.items():
                print(row(name, n, ms, args.workers, fn(n, ms, args.workers)), flush=True)
    m = args.isolated_n
    print(f"\n# isolated mode: a fresh process per subject, N={m}, w=0")
    iso = run_habitrun(m, 0.0, args.workers, mode="isolated")
    spawn = run_spawn_per_subject(m, 0.0, args.workers)
    print(f"{'habitrun isolated':<22} {iso / m * 1e3:8.2f} ms/subject")
    print(f"{'spawn per subject':<22} {spawn / m * 1e3:8.2f} ms/subject")
    print(f"{'ratio':<22} {iso / spawn:8.2f} (target < 0.33)")


if __name__ == "__main__":
    main()
