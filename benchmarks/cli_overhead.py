"""What a user pays for typing `habitrun run` instead of writing the pool by hand.

A: `habitrun run study/recipe.yaml -q` (one map stage, `workers: 2`, a fresh
store each run). B: a hand-written script that reads the same CSV, maps the
same operator over it with a spawn ``ProcessPoolExecutor`` of 2 workers and
dumps the results as JSON. Both are whole processes started the way a user
starts them; A and B alternate so a load spike on the shared machine hits
both. Printed: median and spread (min-max) of each, its median CPU seconds
(user + system of every process it waited for: steadier than wall time on a
shared machine), and the ratio A/B of the wall medians. The commands run with
their bytecode cached, as an installed package does (``--no-bytecode-cache``:
as the environment says).

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
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
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


def pool_script(func: str, param: str) -> str:
    """The hand-written peer: read the CSV, map ``ops.func`` (``param`` from argv) with a spawn pool, dump JSON."""
    return textwrap.dedent(f'''
        import csv, json, multiprocessing, sys
        from concurrent.futures import ProcessPoolExecutor
        from functools import partial

        from ops import {func}

        if __name__ == "__main__":
            csv_path, value, workers, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
            with open(csv_path, newline="") as f:
                rows = list(csv.DictReader(f))
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
                results = list(pool.map(partial({func}, {param}=value), rows, chunksize=1))
            with open(out, "w") as f:
                json.dump({{row["subject_id"]: r for row, r in zip(rows, results)}}, f)
    ''')


POOL_SCRIPT = pool_script("busy_plain", "ms")


def write_study(folder: Path, n: int, ops: str, pool: str, stage: str, value: float, param: str,
                workers: int = WORKERS) -> Path:
    """A one-stage study of ``n`` subjects running ``ops:stage`` with ``param: value``, beside its pool script."""
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(ops)
    (folder / "pool.py").write_text(pool)
    (folder / "subjects.csv").write_text("subject_id,n\n" + "".join(f"S{i:05d},{i}\n" for i in range(n)))
    (folder / "recipe.yaml").write_text(textwrap.dedent(f"""\
        habitrun: 1
        name: {stage}-study
        subjects: {{manifest: subjects.csv, id: subject_id}}
        policy: {{backend: process, workers: {workers}, subject_timeout_sec: 600}}
        stages:
          - name: {stage}
            operator: ops:{stage}
            params: {{{param}: {value}}}
        """))
    return folder / "recipe.yaml"


def make_study(folder: Path, n: int, ms: float) -> Path:
    """A one-stage study of ``n`` subjects that spin ``ms`` milliseconds each."""
    return write_study(folder, n, OPS, POOL_SCRIPT, "busy", ms, "ms")


# Where the timed commands keep their bytecode (set in main): an installed package has its
# .pyc files, so the runs get them too, even where PYTHONDONTWRITEBYTECODE is set.
PYCACHE: Path | None = None


def child_env(source: Path | None) -> dict[str, str]:
    """The environment of a timed command: habitrun from ``source`` if given, bytecode cached."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    if PYCACHE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


@dataclass
class Series:
    """Wall seconds of each run, and the CPU seconds (user + system) of the processes it reaped."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{statistics.median(self.wall):7.3f} s ({min(self.wall):.3f}-{max(self.wall):.3f}) cpu {statistics.median(self.cpu):.3f}"

    def median(self) -> float:
        return statistics.median(self.wall)


def timed(series: Series, argv: list[str], cwd: Path, source: Path | None = None) -> None:
    """Time one command (habitrun imported from ``source`` if given) into ``series``; it must succeed.

    CPU counts every process the command waited for; on a shared machine it moves less than wall time.
    """
    env = child_env(source)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    series.wall.append(took)
    series.cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def habitrun_cmd() -> list[str]:
    """The console script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "habitrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "habitrun.cli.app"]


def run_vs_pool(root: Path, n: int, ms: float, repeat: int,
                baseline: Path | None) -> tuple[Series, Series, Series]:
    """Alternating A (habitrun run) / B (pool script) [/ A from the baseline tree] runs, each on a fresh store."""
    a, b, base = Series(), Series(), Series()
    for i in range(repeat):
        study = make_study(root / f"n{n}-ms{ms:g}-{i}", n, ms)
        timed(a, [*habitrun_cmd(), "run", str(study), "-q"], study.parent)
        timed(b, [sys.executable, "pool.py", "subjects.csv", str(ms), str(WORKERS), "out.json"], study.parent)
        if baseline is not None:
            shutil.rmtree(study.parent / ".habitrun", ignore_errors=True)
            timed(base, [*habitrun_cmd(), "run", str(study), "-q"], study.parent, baseline)
        shutil.rmtree(study.parent, ignore_errors=True)
    return a, b, base


def inspect_commands(recipe: Path, repeat: int, baseline: Path | None) -> dict[str, Series]:
    """Wall seconds of --help / validate / plan / status on ``recipe`` (after one run, so records exist)."""
    cmd = habitrun_cmd()
    subprocess.run([*cmd, "run", str(recipe), "-q"], cwd=recipe.parent, capture_output=True, check=False,
                   env=child_env(None))
    argvs = {
        "habitrun --help": [*cmd, "--help"],
        "habitrun validate": [*cmd, "validate", str(recipe)],
        "habitrun plan": [*cmd, "plan", str(recipe)],
        "habitrun status": [*cmd, "status", str(recipe)],
    }
    sources = {"": None} if baseline is None else {"": None, " (baseline)": baseline}
    times = {name + tag: Series() for name in argvs for tag in sources}
    for _ in range(repeat):  # interleaved, like A/B above
        for name, argv in argvs.items():
            for tag, source in sources.items():
                timed(times[name + tag], argv, recipe.parent, source)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("--recipe", type=Path, default=DEMO, help="recipe for the inspect commands (default: demo)")
    parser.add_argument("--sizes", default="10x0,2000x5", help="N x ms pairs (default 10x0,2000x5)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a folder holding another habitrun package (e.g. `git archive main habitrun`): "
                             "time its `habitrun` too, alternating with this one")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="run the commands as the environment says (with PYTHONDONTWRITEBYTECODE set, "
                             "habitrun's modules are compiled again in every command)")
    opts = parser.parse_args()
    global PYCACHE
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not opts.no_bytecode_cache:
            PYCACHE = root / "pycache"
            for source in (None, opts.baseline):  # fill the cache: the first import compiles
                subprocess.run([*habitrun_cmd(), "--help"], capture_output=True, check=False, env=child_env(source))
                subprocess.run([sys.executable, "-c", "import habitrun.cli.run, habitrun.cli.status, "
                                "habitrun.cli.plan, habitrun.cli.resume, habitrun.engine.process.worker"],
                               capture_output=True, check=False, env=child_env(source))
        print(f"habitrun run vs a spawn ProcessPoolExecutor script, {WORKERS} workers, "
              f"{opts.repeat} alternating runs each: median (min-max)")
        head = f"{'N x ms':>10}  {'habitrun run':>36}  {'pool script':>36}  {'ratio':>5}"
        if opts.baseline is not None:
            head += f"  {'baseline habitrun run':>36}  {'ratio':>5}"
        print(head)
        for pair in opts.sizes.split(","):
            n_text, ms_text = pair.split("x")
            a, b, base = run_vs_pool(root, int(n_text), float(ms_text), opts.repeat, opts.baseline)
            line = f"{pair:>10}  {a!s:>36}  {b!s:>36}  {a.median() / b.median():5.2f}"
            if base.wall:
                line += f"  {base!s:>36}  {base.median() / b.median():5.2f}"
            print(line, flush=True)
        study = root / "inspect"
        shutil.copytree(opts.recipe.resolve().parent, study)
        times = inspect_commands(study / opts.recipe.name, opts.repeat, opts.baseline)
        print(f"\ncommands on {opts.recipe}: median (min-max), median CPU")
        for name, series in times.items():
            print(f"{name:>29}  {series}")


if __name__ == "__main__":
    main()
