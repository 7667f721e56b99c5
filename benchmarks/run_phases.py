"""Where a small `habitrun run` spends its time after the imports, phase by phase.

A profiler inflates Python-heavy phases several-fold and hides waits (a fork
server's exit, a store's fsyncs), so each phase is timed with the wall clock
by wrapping it in place, in a fresh process per run: the command's imports,
then the lock, the store's opening and closing, planning, starting the
workers, the run folder, the stages (which include stopping the workers).
The study is cli_overhead.py's: N subjects of 0 ms, one map stage, 2 workers,
a fresh store each run, bytecode cached. With ``--baseline``, runs of the two trees alternate.

    python benchmarks/run_phases.py --repeat 6 --baseline /tmp/base   # from /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_overhead import make_study  # noqa: E402

PHASES = [  # (module, attribute path): wrapped where the runner looks them up
    ("habitrun.store.lock", "StoreLock.acquire"),
    ("habitrun.store.checkpoint", "CheckpointStore.open"),
    ("habitrun.engine.runner", "StudyRunner.prepare"),
    ("habitrun.engine.runner", "StudyRunner.warm_backend"),
    ("habitrun.engine.runner", "StudyRunner.open_run_folder"),
    ("habitrun.engine.runner", "StudyRunner.run_stages"),
    ("habitrun.engine.backend_choice", "BackendPool.close"),
    ("habitrun.engine.runner", "StudyRunner.finish"),
    ("habitrun.store.checkpoint", "CheckpointStore.close"),
]

CHILD = '''
import functools, importlib, json, sys, time
t0 = time.perf_counter()
from habitrun.cli.app import main
import habitrun.cli.execute, habitrun.cli.run
t1 = time.perf_counter()
spent = {}
def wrap(module, path):
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    raw = owner.__dict__[name]
    is_cm = isinstance(raw, classmethod)
    fn = raw.__func__ if is_cm else raw
    @functools.wraps(fn)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[path] = spent.get(path, 0.0) + time.perf_counter() - t
    setattr(owner, name, classmethod(timed) if is_cm else timed)
for module, path in json.loads(sys.argv[1]):
    wrap(module, path)
t2 = time.perf_counter()
try:
    main(["run", "recipe.yaml", "-q"])
except SystemExit:
    pass
spent["imports (cli.app, run, execute)"] = t1 - t0
spent["run, after the imports"] = time.perf_counter() - t2
print("PHASES " + json.dumps(spent), file=sys.stderr)
'''


def one_run(study: Path, source: Path) -> dict[str, float]:
    """Phase -> wall seconds of one `habitrun run` of ``study`` with habitrun from ``source``."""
    shutil.rmtree(study.parent / ".habitrun", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(source))
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(PHASES)], cwd=study.parent, env=env,
                          capture_output=True, text=True, check=False)
    for line in done.stderr.splitlines():
        if line.startswith("PHASES "):
            return json.loads(line[len("PHASES "):])
    raise SystemExit(f"the run failed:\n{done.stderr[-2000:]}")


def main() -> None:
    """Print the median wall milliseconds of each phase, per tree."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each tree (default 5)")
    parser.add_argument("--n", type=int, default=10, help="subjects (default 10)")
    parser.add_argument("--baseline", type=Path, default=None, help="another tree, run alternately")
    args = parser.parse_args()
    trees = {"this tree": Path(__file__).resolve().parent.parent}
    if args.baseline is not None:
        trees["baseline"] = args.baseline
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as an installed package has it
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        study = make_study(Path(tmp) / "study", args.n, 0.0)
        for source in trees.values():  # warm the bytecode and the page cache
            one_run(study, source)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, source in trees.items():
                runs[name].append(one_run(study, source))
    names = list(runs["this tree"][0])
    print(f"`habitrun run`, {args.n} x 0 ms, 2 workers: median wall ms of {args.repeat} runs each")
    print(f"{'phase':36}" + "".join(f"{name:>12}" for name in trees))
    for phase in names:
        cells = [statistics.median(r.get(phase, 0.0) for r in runs[name]) * 1000 for name in trees]
        print(f"{phase:36}" + "".join(f"{c:12.1f}" for c in cells))


if __name__ == "__main__":
    main()
