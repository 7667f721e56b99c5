"""What the runner's ``running.json`` costs (engine/running_file.py): one tick, measured.

The file is rewritten once a second by a thread of the runner; its cost to the
run is one tick's time (CPU and GIL held) per second. A real ProcessBackend runs
``--workers`` subjects that sleep while the tick (the backend's view of its
workers' beacons, then the atomic rewrite) is timed ``--ticks`` times.

    python benchmarks/running_file.py [--workers 2] [--ticks 2000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)


def sleepy(subject, sec=5.0):
    """The operator: sleep (a subject that runs while the ticks are timed)."""
    time.sleep(sec)
    return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ticks", type=int, default=2000)
    args = parser.parse_args()

    from habitrun.engine.contract import OperatorRef, SubjectTask
    from habitrun.engine.control import StopFlag
    from habitrun.engine.process import ProcessBackend
    from habitrun.engine.running_file import RunningFile
    from habitrun.spec.policy import RunPolicy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        backend = ProcessBackend.from_policy(RunPolicy(workers=args.workers, subject_timeout_sec=600))
        op = OperatorRef("bench", "running_file:sleepy", {"sec": 5.0}, search_path=(HERE,))
        tasks = [SubjectTask(key=f"k{i}", subject_id=f"S{i}", fields={}, inputs={}, workdir=str(root / f"S{i}"),
                             log_path=str(root / f"S{i}.log")) for i in range(args.workers)]
        stop = StopFlag()
        runner = threading.Thread(target=backend.run_tasks, args=(op, tasks, lambda batch: None, stop))
        runner.start()
        writer = RunningFile(root / "running.json", lambda: ("bench", backend))
        deadline = time.monotonic() + 30
        while len(writer.snapshot()["subjects"]) < args.workers and time.monotonic() < deadline:
            time.sleep(0.05)
        wall, cpu = [], []
        for _ in range(args.ticks):
            w0, c0 = time.perf_counter(), time.thread_time()
            writer.write(writer.snapshot())
            wall.append(time.perf_counter() - w0)
            cpu.append(time.thread_time() - c0)
        running = len(writer.snapshot()["subjects"])
        runner.join()
        backend.close()
    print(f"# {args.workers} workers, {running} subjects running, {args.ticks} ticks")
    print(f"tick wall median {statistics.median(wall) * 1e6:.0f} us, p95 "
          f"{sorted(wall)[int(0.95 * len(wall))] * 1e6:.0f} us; thread CPU median {statistics.median(cpu) * 1e6:.0f} us")
    print(f"cost at one tick a second: {statistics.median(wall) * 100:.4f}% of one core")


if __name__ == "__main__":
    main()
