"""The runner's own CPU per subject, thread by thread: what the engine costs beside the workers.

``benchmarks/dispatch.py`` times a stage's wall clock, which on a shared machine
moves by a fifth between two runs of one tree. This one runs the same study
(``run_study``: a warm-up stage, then N subjects of ``ms`` busy milliseconds on 2
workers, every outcome stored) and reads, over the measured stage, the CPU
seconds of each runner thread (the dispatch loop in MainThread, the store and
event log in habitrun-recorder) from the kernel, and the CPU of every process
below it (the fork server and the workers: what a subject costs on their side
beyond the operator). With ``--against`` the other
tree runs in alternation with this one and the table shows both, medians and
minima over ``--repeat`` runs.

    python benchmarks/engine_cpu.py                          # N=20000, 0 ms, this tree
    python benchmarks/engine_cpu.py --against /path/to/other/checkout --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# The study: a warm-up stage, then the measured one; ``observe`` sees every event.
STUDY = r'''
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    (root / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i}\n" for i in range(n)))
    (root / "ops.py").write_text(ops)
    recipe = {"habitrun": 1, "name": "engine-cpu", "subjects": {"manifest": "subjects.csv"},
              "policy": {"workers": 2, "subject_timeout_sec": 600, "auto_retry_rounds": 0, **policy},
              "stages": [{"name": "warm", "operator": "ops:busy", "params": {"ms": 0.0}},
                         {"name": "bench", "operator": "ops:busy", "params": {"ms": ms}}]}
    (root / "recipe.yaml").write_text(json.dumps(recipe))
    summary = run_study(load_recipe(root / "recipe.yaml"), observer=observe, install_signal_handlers=False)
    assert summary.exit_code == 0
'''

# Runs inside a fresh interpreter with the tree under test first on sys.path; prints one JSON line.
CHILD = r'''
import json, sys, tempfile, threading, time
from pathlib import Path
import psutil
from habitrun.engine.runner import run_study
from habitrun.spec.loader import load_recipe

n, ms, ops, policy = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
marks = {}

def threads():
    names = {t.native_id: t.name for t in threading.enumerate()}
    me = psutil.Process()
    cpu = {names.get(t.id, "other"): t.user_time + t.system_time for t in me.threads()}
    cpu["workers"] = 0.0  # every process below the runner: the fork server and the workers it forked
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        cpu["workers"] += times.user + times.system
    return cpu

def observe(event):
    kind = event.get("event") if isinstance(event, dict) else getattr(event, "EVENT", None)
    stage = event.get("stage") if isinstance(event, dict) else getattr(event, "stage", None)
    if stage == "bench" and kind in ("stage_started", "stage_finished"):
        marks[kind] = (time.perf_counter(), time.process_time(), threads())

''' + STUDY + r'''    (w0, c0, t0), (w1, c1, t1) = marks["stage_started"], marks["stage_finished"]
    per = {name: (t1[name] - t0.get(name, 0.0)) / n * 1e6 for name in t1}
    print(json.dumps({"wall": (w1 - w0) / n * 1e6, "cpu": (c1 - c0) / n * 1e6,
                      "main": per.get("MainThread", 0.0), "recorder": per.get("habitrun-recorder", 0.0),
                      "workers": per.get("workers", 0.0)}))
'''

OPS = """
import time


def busy(subject, ms=0.0):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass
    return 1
"""


def one_run(tree: Path, n: int, ms: float, policy: dict | None = None) -> dict[str, float]:
    """One fresh runner process of ``tree``: µs per subject (wall, process CPU, two threads, workers)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(n), str(ms), OPS, json.dumps(policy or {})], env=env, capture_output=True,
                          text=True, timeout=1800, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def budget_policy(text: str | None) -> dict:
    """The policy a --memory-budget value adds: none (the default), or memory_budget_mb as MB, auto or null."""
    if text is None:
        return {}
    return {"memory_budget_mb": None if text in ("null", "none") else text if text == "auto" else int(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000, help="subjects in the measured stage (default 20000)")
    parser.add_argument("--ms", type=float, default=0.0, help="busy ms per subject (default 0)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each tree (default 5)")
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run in alternation")
    parser.add_argument("--memory-budget", default=None,
                        help="policy.memory_budget_mb (MB, auto or null) of this tree's runs (default: the recipe's "
                             "default); with --against-budget, this tree runs with both, in alternation")
    parser.add_argument("--against-budget", default=None, help="a second memory_budget_mb for this tree's runs")
    args = parser.parse_args()
    trees: list[tuple[str, Path, dict]] = [(str(HERE), HERE, budget_policy(args.memory_budget))]
    if args.against_budget is not None:
        trees.append((f"{HERE} (budget {args.against_budget})", HERE, budget_policy(args.against_budget)))
        trees[0] = (f"{HERE} (budget {args.memory_budget or 'default'})", HERE, trees[0][2])
    if args.against:
        trees.append((str(args.against.resolve()), args.against.resolve(), {}))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in trees}
    started = time.perf_counter()
    for _ in range(args.repeat):
        for name, tree, policy in trees:
            runs[name].append(one_run(tree, args.n, args.ms, policy))
    print(f"runner µs per subject, N={args.n} x {args.ms:g} ms, 2 workers, {args.repeat} alternating runs "
          f"({time.perf_counter() - started:.0f} s): median (min)")
    print(f"{'tree':<40} {'wall':>14} {'process CPU':>14} {'MainThread':>14} {'recorder':>14} {'workers':>14}")
    for name, rows in runs.items():
        cells = [f"{statistics.median(r[k] for r in rows):7.1f} ({min(r[k] for r in rows):5.1f})"
                 for k in ("wall", "cpu", "main", "recorder", "workers")]
        print(f"{name[-40:]:<40} " + " ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
