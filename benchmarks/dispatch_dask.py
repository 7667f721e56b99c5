"""Dispatch overhead of habitrun's Dask backend against plain ``client.map``, on a 2-worker local cluster.

Same columns as ``benchmarks/dispatch.py`` (wall, per-subject overhead,
efficiency). habitrun-dask pays for per-subject outcomes, logs, timeouts
and store writes (when ``habitrun.store.checkpoint`` is importable); plain
``client.map`` returns bare values. Both run on one warm cluster.

    python benchmarks/dispatch_dask.py --quick      # N=1000, w=1 ms
    python benchmarks/dispatch_dask.py              # N=2000, w=0/1/10 ms

Per-subject overhead = (wall - N*w/workers) / N; efficiency = ideal / wall.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
sys.path.insert(0, HERE)

from dispatch import busy_plain, row  # noqa: E402  (same operator and table as dispatch.py)


def run_habitrun_dask(backend, n: int, ms: float, root: Path) -> float:
    from habitrun.engine.contract import OperatorRef, SubjectTask
    from habitrun.engine.control import StopFlag

    try:
        from habitrun.store.checkpoint import CheckpointStore, Record
    except ImportError:
        CheckpointStore = Record = None  # noqa: N806
    store = CheckpointStore.open(root / f"store-{n}-{ms}") if CheckpointStore else None
    op = OperatorRef(f"bench-{ms}", "dispatch:busy", {"ms": ms}, search_path=(HERE,))
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
    if store is not None:
        store.close()
    assert done == n, (done, n)
    return wall


def run_client_map(client, n: int, ms: float) -> float:
    t0 = time.perf_counter()
    client.gather(client.map(busy_plain, [ms] * n, pure=False))
    return time.perf_counter() - t0


def main() -> None:
    from habitrun.engine.dask_backend import DaskBackend
    from habitrun.spec.policy import RunPolicy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N=1000, w=1 ms only")
    parser.add_argument("--n", type=int, nargs="*", help="subject counts (default 2000)")
    parser.add_argument("--ms", type=float, nargs="*", help="busy ms per subject (default 0 1 10)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    sizes = args.n or ([1000] if args.quick else [2000])
    loads = args.ms or ([1.0] if args.quick else [0.0, 1.0, 10.0])
    policy = RunPolicy(backend="dask", workers=args.workers, subject_timeout_sec=600)
    print(f"# {os.cpu_count()} cpus, {args.workers} dask workers (local cluster), python {sys.version.split()[0]}")
    print(f"{'column':<22} {'N':>6} {'w ms':>5} {'wall s':>9} {'us/subject':>11} {'eff':>8}")
    with tempfile.TemporaryDirectory() as tmp, DaskBackend.from_policy(policy) as backend:
        client = backend._client()
        client.gather(client.map(busy_plain, [0.0] * 8, pure=False))  # warm both workers
        run_habitrun_dask(backend, 8, 0.0, Path(tmp) / "warm")
        for n in sizes:
            for ms in loads:
                wall = run_habitrun_dask(backend, n, ms, Path(tmp))
                print(row("habitrun-dask", n, ms, args.workers, wall), flush=True)
                wall = run_client_map(client, n, ms)
                print(row("dask client.map", n, ms, args.workers, wall), flush=True)


if __name__ == "__main__":
    main()
