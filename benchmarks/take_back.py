"""A long subject among short ones: what the runs queued behind it cost.

Subjects learned to be short are queued several deep in a worker. When a long
one arrives among them, the short ones sent behind it would wait for it while
the other worker runs out of work; the runner takes them back (RECALL) and
sends them to the idle worker. This times one stage of 300 x 0 ms, then 1 x 2 s,
then 200 x 10 ms on 2 workers (ideal: 2.0 s, the long one) in a fresh process
per run, alternating with ``--against`` another checkout.

    python benchmarks/take_back.py --against /path/to/other/checkout --repeat 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
OPS = '''
import time


def busy(subject):
    end = time.perf_counter() + float(subject.fields["ms"]) / 1000.0
    while time.perf_counter() < end:
        pass
    return 1
'''


def child(ops_dir: str) -> None:
    from habitrun.engine.contract import OperatorRef, SubjectTask
    from habitrun.engine.control import StopFlag
    from habitrun.engine.process import ProcessBackend
    from habitrun.spec.policy import RunPolicy

    root = Path(ops_dir)

    def tasks(prefix: str, mss: list[float]) -> list[SubjectTask]:
        return [SubjectTask(key=f"{prefix}{i}", subject_id=f"{prefix}{i}", fields={"ms": ms}, inputs={},
                            workdir=str(root / prefix / str(i)), attempt=1,
                            log_path=str(root / "logs" / f"{prefix}{i}.log")) for i, ms in enumerate(mss)]

    backend = ProcessBackend.from_policy(RunPolicy(workers=2))
    op = OperatorRef(stage="s", path="tb_ops:busy", params={}, kind="map", search_path=(ops_dir,))
    try:
        backend.run_tasks(op, tasks("W", [0.0] * 4), lambda batch: None, StopFlag())  # workers started
        started = time.perf_counter()
        backend.run_tasks(op, tasks("S", [0.0] * 300 + [2000.0] + [10.0] * 200), lambda batch: None, StopFlag())
        print(f"{time.perf_counter() - started:.3f}")
    finally:
        backend.close()


def one_run(tree: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "tb_ops.py").write_text(OPS)
        done = subprocess.run([sys.executable, __file__, "--child", tmp], env={**os.environ, "PYTHONPATH": str(tree)},
                              capture_output=True, text=True, timeout=600, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each tree (default 3)")
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run in alternation")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    trees = [HERE] + ([args.against.resolve()] if args.against else [])
    runs: dict[Path, list[float]] = {tree: [] for tree in trees}
    for _ in range(args.repeat):
        for tree in trees:
            runs[tree].append(one_run(tree))
    print("300 x 0 ms, 1 x 2 s, 200 x 10 ms on 2 workers (ideal 2.0 s): wall s per run")
    for tree, times in runs.items():
        print(f"{str(tree)[-40:]:<40} " + " ".join(f"{t:6.2f}" for t in times))


if __name__ == "__main__":
    main()
