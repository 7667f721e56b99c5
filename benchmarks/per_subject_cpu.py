"""Where the CPU of one subject goes, runner and workers, user and kernel: the whole bill in one table.

``engine_cpu.py`` gives the runner's threads and the workers' processes as totals
(the workers' total is mostly the operator); ``recorder_commits.py`` splits the
recorder. This one runs the same study (a warm-up stage, then N subjects of
``ms`` busy milliseconds on 2 workers, every outcome stored) and, over the
measured stage, splits every thread's CPU into user and system (kernel) time:

- runner dispatch: the runner's MainThread (the dispatch loop and the report);
- recorder put / emit / rest: the recorder thread, with ``CheckpointStore.put`` and
  ``EventStream.emit_many`` timed by a per-thread clock (as ``recorder_commits.py``);
- worker loop: each worker's main thread less the operator's own CPU (the
  ``cpu_sec`` every ``subject_done`` carries: what ``usage.Meter`` measured around
  the call) -- the reply, the meter, output capture, the log file, the beacon;
- worker inbox / outbox: the reader thread, and the timer thread that sends held replies;
- other runner threads, and the fork server.

A log file is written only for a subject that printed or failed, so the busy
operator here writes none. With ``--against`` the other tree runs in alternation.

    python benchmarks/per_subject_cpu.py --n 2000 --ms 10 --against /path/to/other/checkout
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_cpu import OPS, STUDY  # noqa: E402 - the same operator and study
from recorder_commits import WRAP, alternate  # noqa: E402 - the same recorder wrappers and alternation

CHILD = r'''
import json, os, sys, tempfile, threading, time
from pathlib import Path
import psutil
from habitrun.engine.runner import run_study
from habitrun.spec.loader import load_recipe

n, ms, ops = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
op_cpu = [0.0]

def thread_cpu(proc):
    # schedstat: the thread's run time in ns (exact); stat: user and system in clock ticks, only for the ratio.
    out = {}
    for t in proc.threads():
        base = f"/proc/{proc.pid}/task/{t.id}/"
        try:
            with open(base + "schedstat") as f:
                ran = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
        out[t.id] = (ran, t.user_time, t.system_time)
    return out

def snapshot():
    me = psutil.Process()
    names = {t.native_id: t.name for t in threading.enumerate()}
    runner = {names.get(tid, "other"): ut for tid, ut in thread_cpu(me).items()}
    below = {}
    for child in me.children(recursive=True):
        try:
            below[child.pid] = (child.ppid() == me.pid, thread_cpu(child))
        except psutil.Error:
            continue
    return runner, below

def observe(event):
    kind = event.get("event") if isinstance(event, dict) else getattr(event, "EVENT", None)
    stage = event.get("stage") if isinstance(event, dict) else getattr(event, "stage", None)
    if stage != "bench":
        return
    if kind in ("stage_started", "stage_finished"):
        marks[kind] = snapshot()
    elif kind == "subject_done" and "stage_started" in marks and "stage_finished" not in marks:
        op_cpu[0] += getattr(event, "cpu_sec", None) or 0.0

def diff(t0, t1):
    """[user, system] over the stage: the exact run time, split as the ticks were."""
    ran, user, system = (t1[0] - t0[0], t1[1] - t0[1], t1[2] - t0[2]) if t0 else t1
    ticks = user + system
    share = system / ticks if ticks > 0 else 0.0
    return [ran * (1 - share), ran * share]

''' + STUDY + r'''    (r0, b0), (r1, b1) = marks["stage_started"], marks["stage_finished"]
    out = {}
    def add(label, pair):
        cell = out.setdefault(label, [0.0, 0.0])
        cell[0] += pair[0]
        cell[1] += pair[1]
    for name, ut in r1.items():
        label = {"MainThread": "runner dispatch", "habitrun-recorder": "recorder"}.get(name, "runner other")
        add(label, diff(r0.get(name), ut))
    for pid, (is_server, threads) in b1.items():
        old = b0.get(pid, (is_server, {}))[1]
        # A worker's threads start in this order: main, inbox (reader), outbox (held replies' timer).
        order = {tid: i for i, tid in enumerate(sorted(threads, key=lambda t: (t != pid, t)))}
        for tid, ut in threads.items():
            if is_server:
                label = "fork server"
            else:
                label = ("worker main", "worker inbox", "worker outbox")[min(order[tid], 2)]
            add(label, diff(old.get(tid), ut))
    out["operator"] = op_cpu[0]
    out["recorder parts"] = {k: v[1] for k, v in _acc.items()}
    print(json.dumps(out))
'''

ROWS = ("runner dispatch", "recorder put", "recorder emit", "recorder rest", "runner other",
        "worker loop", "worker inbox", "worker outbox", "fork server")


def one_run(tree: Path, n: int, ms: float) -> dict[str, list[float]]:
    """One fresh runner process of ``tree``: row -> [user, system] µs per subject over the measured stage."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = "marks = {}\n" + WRAP.replace("atexit.register", "(lambda *a: None)") + CHILD
    done = subprocess.run([sys.executable, "-c", child, str(n), str(ms), OPS], env=env, capture_output=True,
                          text=True, timeout=1800, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-2000:]}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    parts = raw.pop("recorder parts")
    operator = raw.pop("operator")
    per = {k: [v[0] / n * 1e6, v[1] / n * 1e6] for k, v in raw.items()}
    rec = per.pop("recorder", [0.0, 0.0])
    put, emit = parts.get("put", 0.0) / n * 1e6, parts.get("emit", 0.0) / n * 1e6
    # The per-thread clocks do not split user from system: the parts take the recorder's ratio.
    share = rec[1] / (rec[0] + rec[1]) if rec[0] + rec[1] > 0 else 0.0
    for label, total in (("recorder put", put), ("recorder emit", emit)):
        per[label] = [total * (1 - share), total * share]
    per["recorder rest"] = [rec[0] - per["recorder put"][0] - per["recorder emit"][0],
                            rec[1] - per["recorder put"][1] - per["recorder emit"][1]]
    main = per.pop("worker main", [0.0, 0.0])
    op = operator / n * 1e6
    # The operator's cpu_sec is user and system together; a busy loop is all user time.
    per["worker loop"] = [main[0] - op, main[1]]
    return per


def main() -> None:
    args, runs = alternate(__doc__ or "", one_run)
    trees = list(runs)
    print(f"CPU µs per subject, N={args.n} x {args.ms:g} ms, 2 workers, {args.repeat} alternating runs: "
          "median of user + system (user, system)")
    print(f"{'':<20} " + " ".join(f"{str(tree)[-26:]:>26}" for tree in trees))
    for label in (*ROWS, "total"):
        cells = []
        for tree in trees:
            rows = runs[tree]
            if label == "total":
                pairs = [[sum(r[k][0] for k in ROWS if k in r), sum(r[k][1] for k in ROWS if k in r)] for r in rows]
            else:
                pairs = [r.get(label, [0.0, 0.0]) for r in rows]
            both = statistics.median(u + s for u, s in pairs)
            user, system = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
            cells.append(f"{both:7.1f} ({user:6.1f},{system:6.1f})")
        print(f"{label:<20} " + " ".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
