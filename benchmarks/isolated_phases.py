"""Where an isolated subject's time goes: wall and CPU per subject, and the runner's view of each phase.

N subjects of w ms (default 0) in isolated mode on 2 workers (the process backend alone, no
store), after warm-up stages that get the fork server with the operator's
module preloaded up. Printed per run: wall per subject; CPU per subject of the
runner, of the fork servers themselves and of the workers (reaped by the
servers); and medians, in the runner, of: a slot's subject answered -> the
next subject sent (what a subject waits for a process), the start call
(a fork request to the server), started -> BOUND (the child's set-up and
bind), RUN sent -> DONE, DONE -> buried.

    nice python benchmarks/isolated_phases.py --runs 3 --against /tmp/base
    nice python benchmarks/isolated_phases.py --ms 10 --workers 1 --n 100 --against /tmp/base
    # one process per run and tree, alternating: this tree, then the other

The phases are timed by wrapping the pool's and the stage loop's methods
(WorkerPool.start, or spawn where there is no start; StageRun.on_message;
WorkerHandle.write; WorkerPool.bury).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)


def _instrument(events: list[tuple[str, int, float]]) -> None:
    """Record (what, pid, when) from the runner's side of every worker."""
    from habitrun.engine.process import pool, stage
    from habitrun.engine.process import protocol as P

    def wrap(owner: type, name: str, before: str | None, after: str | None, pid_of) -> None:
        original = getattr(owner, name)

        def timed(self, *args, **kwargs):
            if before:
                events.append((before, pid_of(self, args), time.perf_counter()))
            out = original(self, *args, **kwargs)
            if after:
                events.append((after, out.pid, time.perf_counter()))
            return out

        setattr(owner, name, timed)

    start = "start" if hasattr(pool.WorkerPool, "start") else "spawn"
    wrap(pool.WorkerPool, start, "start0", "start1", lambda self, args: 0)
    wrap(pool.WorkerPool, "bury", "buried", None, lambda self, args: args[0].pid)
    wrap(stage.WorkerHandle, "write", "sent", None, lambda self, args: self.pid)
    tags = {P.BOUND: "bound", P.DONE: "done"}
    original = stage.StageRun.on_message

    def on_message(self, w, msg, now):
        if msg[0] in tags:
            events.append((tags[msg[0]], w.pid, time.perf_counter()))
        return original(self, w, msg, now)

    stage.StageRun.on_message = on_message


def _run(n: int, ms: float, workers: int,
         events: list[tuple[str, int, float]]) -> tuple[float, float, float, float]:
    """Wall, runner CPU, fork servers' own CPU and their reaped workers' CPU, for n subjects of ``ms``."""
    import psutil

    from habitrun.engine.contract import OperatorRef, SubjectTask
    from habitrun.engine.control import StopFlag
    from habitrun.engine.process import ProcessBackend
    from habitrun.spec.policy import RunPolicy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        backend = ProcessBackend.from_policy(RunPolicy(workers=workers, parallel_mode="isolated", subject_timeout_sec=600))
        op = OperatorRef("bench", "dispatch:busy", {"ms": ms}, search_path=(HERE,))

        def tasks(prefix: str, k: int) -> list[SubjectTask]:
            return [SubjectTask(key=f"{prefix}{i}", subject_id=f"{prefix}{i}", fields={}, inputs={},
                                workdir=str(root / "wd"), log_path=str(root / "logs" / f"{prefix}{i}.log"))
                    for i in range(k)]

        backend.run_tasks(op, tasks("w", 20), lambda batch: None, StopFlag())
        time.sleep(2.0)  # the server with the operator's module preloaded boots meanwhile
        backend.run_tasks(op, tasks("v", 20), lambda batch: None, StopFlag())
        servers = [psutil.Process(s.pid) for s in backend.pool.spawner.servers()]

        def server_cpu() -> tuple[float, float]:
            times = [s.cpu_times() for s in servers]
            return sum(t.user + t.system for t in times), sum(t.children_user + t.children_system for t in times)

        events.clear()
        (own0, kids0), cpu0, t0 = server_cpu(), time.process_time(), time.perf_counter()
        backend.run_tasks(op, tasks("k", n), lambda batch: None, StopFlag())
        wall, cpu, (own, kids) = time.perf_counter() - t0, time.process_time() - cpu0, server_cpu()
        backend.close()
        return wall, cpu, own - own0, kids - kids0


def _phases(events: list[tuple[str, int, float]]) -> dict[str, float]:
    """Median ms of each phase, from the recorded events."""
    per_pid: dict[int, dict[str, float]] = {}
    waits, starts, open_start = [], [], 0.0
    for i, (what, pid, when) in enumerate(events):
        if what == "start0":
            open_start = when
            continue
        if what == "start1":
            starts.append(when - open_start)
        per_pid.setdefault(pid, {}).setdefault(what, when)
        if what == "done":
            nxt = next((t for w, _, t in events[i + 1:] if w == "sent"), None)
            if nxt is not None:
                waits.append(nxt - when)
    rows = per_pid.values()

    def med(a: str, b: str) -> float:
        gaps = [r[b] - r[a] for r in rows if a in r and b in r]
        return statistics.median(gaps) * 1e3 if gaps else float("nan")

    return {"answered->next sent": statistics.median(waits) * 1e3, "start call": statistics.median(starts) * 1e3,
            "started->BOUND": med("start1", "bound"), "RUN sent->DONE": med("sent", "done"),
            "DONE->buried": med("done", "buried")}


def measure(n: int, ms: float, workers: int) -> str:
    """One run in this process: its line of figures (wall per subject beyond its ``ms`` of work)."""
    events: list[tuple[str, int, float]] = []
    _instrument(events)
    wall, cpu, own, kids = _run(n, ms, workers, events)
    wall -= n * ms / 1000.0 / workers
    phases = "  ".join(f"{k} {v:.2f}" for k, v in _phases(events).items())
    return (f"{wall / n * 1e3:5.2f} ms/subject wall | CPU ms/subject: runner {cpu / n * 1e3:.2f}, fork servers "
            f"{own / n * 1e3:.2f}, workers {kids / n * 1e3:.2f} | median ms: {phases}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="subjects per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree, alternating")
    parser.add_argument("--ms", type=float, default=0.0, help="busy ms per subject")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--against", help="another checkout, run alternately with this one")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args()
    if args.one:
        print(measure(args.n, args.ms, args.workers), flush=True)
        return
    trees = [str(Path(HERE).parent)] + ([str(Path(args.against).resolve())] if args.against else [])
    print(f"# isolated mode, N={args.n}, {args.ms:g} ms subjects, {args.workers} workers, {os.cpu_count()} cpus;"
          " wall: per subject, beyond its work")
    for _ in range(args.runs):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=tree)
            cmd = [sys.executable, __file__, "--one", "--n", str(args.n), "--ms", str(args.ms),
                   "--workers", str(args.workers)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.strip()
            rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip()
            print(f"{rev or tree:<10} {out}", flush=True)


if __name__ == "__main__":
    main()
