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

from cli_overhead import Series, habitrun_cmd, timed

OPS = textwrap.dedent('''
    import time


    def nap(subject, sec=0.0):
        time.sleep(sec)
        return {"n": int(subject.fields["n"])}


    def nap_plain(row, sec=0.0):
        time.sleep(sec)
        return {"n": int(row["n"])}
''')

POOL_SCRIPT = textwrap.dedent('''
    import csv, json, multiprocessing, sys
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    from ops import nap_plain

    if __name__ == "__main__":
        csv_path, sec, workers, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(partial(nap_plain, sec=sec), rows, chunksize=1))
        with open(out, "w") as f:
            json.dump({row["subject_id"]: r for row, r in zip(rows, results)}, f)
''')


def make_study(folder: Path, n: int, sec: float, workers: int) -> Path:
    """A one-stage study of ``n`` subjects that sleep ``sec`` seconds each on ``workers`` workers."""
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "pool.py").write_text(POOL_SCRIPT)
    (folder / "subjects.csv").write_text("subject_id,n\n" + "".join(f"S{i:03d},{i}\n" for i in range(n)))
    (folder / "recipe.yaml").write_text(textwrap.dedent(f"""\
        habitrun: 1
        name: long-subjects
        subjects: {{manifest: subjects.csv, id: subject_id}}
        policy: {{backend: process, workers: {workers}, subject_timeout_sec: 600}}
        stages:
          - name: nap
            operator: ops:nap
            params: {{sec: {sec}}}
        """))
    return folder / "recipe.yaml"


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
