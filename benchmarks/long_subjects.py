"""Few long subjects: does every worker get one at once?

Issue 14's first target. A worker queued two subjects ahead used to run 4 x 3 s
on `workers: 4` in 6.6 s (two workers did all the work). This times `habitrun
run` of N subjects that sleep S seconds on W workers against a hand-written
spawn ``ProcessPoolExecutor`` script doing the same (``chunksize=1``), in
alternating runs, beside the ideal (rounds of S seconds).

    python benchmarks/long_subjects.py                   # 4 x 3 s and 9 x 2 s on 4 workers
    python benchmarks/long_subjects.py --cases 8x1x4 --repeat 5
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

from cli_overhead import Series, habitrun_cmd, pool_script, timed, write_study

OPS = textwrap.dedent('''
    import time


    def nap(subject, sec=0.0):
        time.sleep(sec)
        return {"n": int(subject.fields["n"])}


    def nap_plain(row, sec=0.0):
        time.sleep(sec)
        return {"n": int(row["n"])}
''')

POOL_SCRIPT = pool_script("nap_plain", "sec")


def make_study(folder: Path, n: int, sec: float, workers: int) -> Path:
    """A one-stage study of ``n`` subjects that sleep ``sec`` seconds each on ``workers`` workers."""
    return write_study(folder, n, OPS, POOL_SCRIPT, "nap", sec, "sec", workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="4x3x4,9x2x4", help="N x seconds x workers, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side (default 3)")
    opts = parser.parse_args()
    print(f"habitrun run vs a spawn ProcessPoolExecutor script, {opts.repeat} alternating runs: median (min-max)")
    print(f"{'N x s on W':>12}  {'ideal':>6}  {'habitrun run':>36}  {'pool script':>36}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in opts.cases.split(","):
            n_text, sec_text, workers_text = case.split("x")
            n, sec, workers = int(n_text), float(sec_text), int(workers_text)
            ours, pool = Series(), Series()
            for i in range(opts.repeat):
                recipe = make_study(Path(tmp) / f"{case}-{i}", n, sec, workers)
                timed(ours, [*habitrun_cmd(), "run", str(recipe), "-q"], recipe.parent)
                timed(pool, [sys.executable, "pool.py", "subjects.csv", str(sec), str(workers), "out.json"],
                      recipe.parent)
                shutil.rmtree(recipe.parent, ignore_errors=True)
            ideal = math.ceil(n / workers) * sec
            label = f"{n}x{sec:g}s on {workers}"
            print(f"{label:>12}  {ideal:5.1f}s  {ours!s:>36}  {pool!s:>36}", flush=True)


if __name__ == "__main__":
    main()
