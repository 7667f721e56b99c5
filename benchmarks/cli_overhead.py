"""What a user pays for typing `habitrun run` instead of writing the pool by hand.

A: `habitrun run study/recipe.yaml -q` (one map stage, `workers: 2`, a fresh
store each run). B: a hand-written script that reads the same CSV, maps the
same operator over it with a spawn ``ProcessPoolExecutor`` of 2 workers and
dumps the results as JSON. Both are whole processes started the way a user
starts them; A and B alternate so a load spike on the shared machine hits
both. Printed: median and spread (min-max) of each, and the ratio A/B.

Then the wall time of the commands a user types to look at a study:
`habitrun --help`, `validate`, `plan`, `status` on a recipe (default: the
demo; the demo is run once first so `plan` and `status` have records).

    python benchmarks/cli_overhead.py                     # N=10 x 0 ms and N=2000 x 5 ms
    python benchmarks/cli_overhead.py --repeat 7 --recipe path/to/recipe.yaml
    python benchmarks/cli_overhead.py --baseline /tmp/main   # /tmp/main/habitrun: another tree, side by side
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "recipes" / "demo" / "recipe.yaml"
WORKERS = 2

OPS = textwrap.dedent('''
    import time


    def spin(ms):
        end = time.perf_counter() + ms / 1000.0
        while time.perf_counter() < end:
            pass


    def busy(subject, ms=0.0):
        spin(ms)
        return {"n": int(subject.fields["n"])}


    def busy_plain(row, ms=0.0):
        spin(ms)
        return {"n": int(row["n"])}
''')

POOL_SCRIPT = textwrap.dedent('''
    import csv, json, multiprocessing, sys
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    from ops import busy_plain

    if __name__ == "__main__":
        csv_path, ms, workers, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(partial(busy_plain, ms=ms), rows, chunksize=1))
        with open(out, "w") as f:
            json.dump({row["subject_id"]: r for row, r in zip(rows, results)}, f)
''')


def make_study(folder: Path, n: int, ms: float) -> Path:
    """A one-stage study of ``n`` subjects that spin ``ms`` milliseconds each."""
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "pool.py").write_text(POOL_SCRIPT)
    (folder / "subjects.csv").write_text("subject_id,n\n" + "".join(f"S{i:05d},{i}\n" for i in range(n)))
    (folder / "recipe.yaml").write_text(textwrap.dedent(f"""\
        habitrun: 1
        name: cli-overhead
        subjects: {{manifest: subjects.csv, id: subject_id}}
        policy: {{backend: process, workers: {WORKERS}, subject_timeout_sec: 600}}
        stages:
          - name: busy
            operator: ops:busy
            params: {{ms: {ms}}}
        """))
    return folder / "recipe.yaml"


def timed(argv: list[str], cwd: Path, source: Path | None = None) -> float:
    """Wall seconds of one command (habitrun imported from ``source`` if given); it must succeed."""
    env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return took


def habitrun_cmd() -> list[str]:
    """The console script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "habitrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "habitrun.cli.app"]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s ({min(values):.3f}-{max(values):.3f})"


def run_vs_pool(root: Path, n: int, ms: float, repeat: int,
                baseline: Path | None) -> tuple[list[float], list[float], list[float]]:
    """Alternating A (habitrun run) / B (pool script) [/ A from the baseline tree] runs, each on a fresh store."""
    a: list[float] = []
    b: list[float] = []
    base: list[float] = []
    for i in range(repeat):
        study = make_study(root / f"n{n}-ms{ms:g}-{i}", n, ms)
        a.append(timed([*habitrun_cmd(), "run", str(study), "-q"], study.parent))
        b.append(timed([sys.executable, "pool.py", "subjects.csv", str(ms), str(WORKERS), "out.json"],
                       study.parent))
        if baseline is not None:
            shutil.rmtree(study.parent / ".habitrun", ignore_errors=True)
            base.append(timed([*habitrun_cmd(), "run", str(study), "-q"], study.parent, baseline))
        shutil.rmtree(study.parent, ignore_errors=True)
    return a, b, base


def inspect_commands(recipe: Path, repeat: int, baseline: Path | None) -> dict[str, list[float]]:
    """Wall seconds of --help / validate / plan / status on ``recipe`` (after one run, so records exist)."""
    cmd = habitrun_cmd()
    subprocess.run([*cmd, "run", str(recipe), "-q"], cwd=recipe.parent, capture_output=True, check=False)
    argvs = {
        "habitrun --help": [*cmd, "--help"],
        "habitrun validate": [*cmd, "validate", str(recipe)],
        "habitrun plan": [*cmd, "plan", str(recipe)],
        "habitrun status": [*cmd, "status", str(recipe)],
    }
    sources = {"": None} if baseline is None else {"": None, " (baseline)": baseline}
    times: dict[str, list[float]] = {name + tag: [] for name in argvs for tag in sources}
    for _ in range(repeat):  # interleaved, like A/B above
        for name, argv in argvs.items():
            for tag, source in sources.items():
                times[name + tag].append(timed(argv, recipe.parent, source))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("--recipe", type=Path, default=DEMO, help="recipe for the inspect commands (default: demo)")
    parser.add_argument("--sizes", default="10x0,2000x5", help="N x ms pairs (default 10x0,2000x5)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a folder holding another habitrun package (e.g. `git archive main habitrun`): "
                             "time its `habitrun` too, alternating with this one")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"habitrun run vs a spawn ProcessPoolExecutor script, {WORKERS} workers, "
              f"{opts.repeat} alternating runs each: median (min-max)")
        head = f"{'N x ms':>10}  {'habitrun run':>26}  {'pool script':>26}  {'ratio':>5}"
        if opts.baseline is not None:
            head += f"  {'baseline habitrun run':>26}  {'ratio':>5}"
        print(head)
        for pair in opts.sizes.split(","):
            n_text, ms_text = pair.split("x")
            a, b, base = run_vs_pool(root, int(n_text), float(ms_text), opts.repeat, opts.baseline)
            line = f"{pair:>10}  {spread(a):>26}  {spread(b):>26}  {statistics.median(a) / statistics.median(b):5.2f}"
            if base:
                line += f"  {spread(base):>26}  {statistics.median(base) / statistics.median(b):5.2f}"
            print(line, flush=True)
        study = root / "inspect"
        shutil.copytree(opts.recipe.resolve().parent, study)
        times = inspect_commands(study / opts.recipe.name, opts.repeat, opts.baseline)
        print(f"\ncommands on {opts.recipe}: median (min-max)")
        for name, values in times.items():
            print(f"{name:>29}  {spread(values)}")


if __name__ == "__main__":
    main()
