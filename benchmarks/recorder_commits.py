"""The recorder thread's CPU per commit, piece by piece: where its share of ``engine_cpu.py`` goes.

Runs ``engine_cpu.py``'s study (a warm-up stage, then N subjects of ``ms`` busy
milliseconds on 2 workers) with the recorder's pieces wrapped in per-thread CPU
clocks, counted over the measured stage only: a whole commit (``Recorder._write``),
the store's transaction (``CheckpointStore.put``: rows, BEGIN, the inserts, COMMIT) and of it
SQLite's ``BEGIN IMMEDIATE`` and ``COMMIT`` (as diskcache runs them),
the events (``EventStream.emit_many``: the log lines, then the observer) and of those
the log file's lines and write (``EventLog.write_many``). Each wrapped call costs two
clock reads (about a microsecond): the figures are a breakdown, not a replacement for
``engine_cpu.py``'s totals. With ``--against`` the other tree runs in alternation.

    python benchmarks/recorder_commits.py --n 2000 --ms 10 --against /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_cpu import CHILD, HERE, OPS  # noqa: E402 - the same study, measured the same way

# Prepended to engine_cpu's child: the wrappers count only between the measured stage's start and end.
WRAP = r'''
import atexit, collections, time as _time
from habitrun.engine.event_stream import EventStream
from habitrun.engine.recorder import Recorder
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.events import EventLog
_acc = collections.defaultdict(lambda: [0, 0.0])

def _wrap(cls, name, label):
    inner = getattr(cls, name)
    def timed(*args, **kwargs):
        if "stage_started" not in marks or "stage_finished" in marks:
            return inner(*args, **kwargs)
        start = _time.thread_time()
        result = inner(*args, **kwargs)
        if "stage_finished" not in marks:  # (the call that ends the stage runs the benchmark's own probe)
            cell = _acc[label]
            cell[0] += 1
            cell[1] += _time.thread_time() - start
        return result
    setattr(cls, name, timed)

for _cls, _name, _label in ((Recorder, "_write", "commit"), (CheckpointStore, "put", "put"),
                            (EventStream, "emit_many", "emit"), (EventLog, "write_many", "log lines")):
    _wrap(_cls, _name, _label)

import diskcache
_sql = diskcache.Cache._sql.fget

def _statement(execute):
    def timed(sql, *args):
        if sql not in ("BEGIN IMMEDIATE", "COMMIT") or "stage_started" not in marks or "stage_finished" in marks:
            return execute(sql, *args)
        start = _time.thread_time()
        result = execute(sql, *args)
        cell = _acc[sql.split()[0]]
        cell[0] += 1
        cell[1] += _time.thread_time() - start
        return result
    return timed

diskcache.Cache._sql = property(lambda cache: _statement(_sql(cache)))
atexit.register(lambda: print(json.dumps({k: [c, s] for k, (c, s) in _acc.items()})))
'''
LABELS = ("commit", "put", "BEGIN", "COMMIT", "emit", "log lines")


def one_run(tree: Path, n: int, ms: float) -> dict[str, list[float]]:
    """One fresh runner process of ``tree``: label -> [calls, CPU seconds] over the measured stage."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = "marks = {}\n" + WRAP + CHILD.replace("\nmarks = {}\n", "\n", 1)
    done = subprocess.run([sys.executable, "-c", child, str(n), str(ms), OPS], env=env, capture_output=True,
                          text=True, timeout=1800, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternate(description: str, run: Callable[[Path, int, float], Any]) -> tuple[argparse.Namespace, dict[Path, list]]:
    """Parse --n/--ms/--repeat/--against, then run this tree and the other in alternation: tree -> runs."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="subjects in the measured stage (default 2000)")
    parser.add_argument("--ms", type=float, default=10.0, help="busy ms per subject (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each tree (default 3)")
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run in alternation")
    args = parser.parse_args()
    trees = [HERE] + ([args.against.resolve()] if args.against else [])
    runs: dict[Path, list] = {tree: [] for tree in trees}
    for _ in range(args.repeat):
        for tree in trees:
            runs[tree].append(run(tree, args.n, args.ms))
    return args, runs


def main() -> None:
    args, runs = alternate(__doc__ or "", one_run)
    print(f"recorder CPU, N={args.n} x {args.ms:g} ms, 2 workers, {args.repeat} alternating runs: "
          "µs per call (µs per subject), medians")
    print(f"{'tree':<40} {'commits':>8} " + " ".join(f"{label:>16}" for label in LABELS))
    for tree, rows in runs.items():
        commits = statistics.median(r.get("commit", [0, 0.0])[0] for r in rows)
        cells = []
        for label in LABELS:
            per_call = statistics.median(r[label][1] / r[label][0] * 1e6 if r.get(label) else 0.0 for r in rows)
            per_subject = statistics.median(r[label][1] / args.n * 1e6 if r.get(label) else 0.0 for r in rows)
            cells.append(f"{per_call:7.1f} ({per_subject:5.1f})")
        print(f"{str(tree)[-40:]:<40} {commits:>8.0f} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
