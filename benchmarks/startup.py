"""Start-up of `habitrun run` on the demo study, and what the operator check adds to it.

`run` and `resume` import every operator in a child process before any subject
runs (so a bad one stops the run with exit 2). The child starts right after the
recipe is loaded and is waited for after planning, just before the run folder;
a run with nothing to do does not wait for it. This prints, over --repeat runs
(median, ms):

* `python -c pass` and `python -c "import numpy"` (what the demo's operators
  import), as the floor a child process cannot go below;
* `habitrun validate` and a no-op `habitrun run` (everything stored), whole
  commands as a user types them;
* for a run with work (one map stage stale), as `habitrun run` does it (the
  child started before the commands are imported, importing the modules the
  recipe names while the parent imports its own): time from the start of the
  command to the point where it needs the check, and how long it then waited
  for it (0 when the child had finished by then); and, for comparison, the
  same with the child started only once the recipe is loaded.

    /work/venv/bin/python benchmarks/startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from habitrun.engine.runner import run_study
from habitrun.spec.loader import load_recipe
from habitrun.spec.opcheck import OperatorCheck

DEMO = Path(__file__).resolve().parent.parent / "recipes" / "demo"
STAGE = "synthesize"


def wall(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    return (time.perf_counter() - start) * 1000


def with_work(recipe: Path, i: int) -> tuple[float, float, float]:
    """(ms to the point the check is needed, ms waited for it, ms for the whole run) of a one-stage run."""
    start = time.perf_counter()
    loaded = load_recipe(recipe, (f"stages.{STAGE}.params.noise={20 + i + 0.5}",))
    check = OperatorCheck.start(loaded)
    seen: list[float] = []

    def preflight() -> None:
        reached = time.perf_counter()
        check.raise_problems()
        seen.extend([(reached - start) * 1000, (time.perf_counter() - reached) * 1000])

    with check:
        run_study(loaded, preflight=preflight, only_stage=STAGE, install_signal_handlers=False)
    return seen[0], seen[1], (time.perf_counter() - start) * 1000


TIMED_CLI = """
import sys, time
t0 = time.perf_counter()
import habitrun.spec.opcheck as oc
real = oc.OperatorCheck.raise_problems
def timed(self):
    reached = time.perf_counter()
    real(self)
    print(f"CHECK {(reached - t0) * 1000:.1f} {(time.perf_counter() - reached) * 1000:.1f}", file=sys.stderr)
oc.OperatorCheck.raise_problems = timed
from habitrun.cli.app import main
main(sys.argv[1:])
"""


def cli_with_work(recipe: Path, i: int) -> tuple[float, float, float]:
    """The same as with_work, through the real command line (early start included)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", TIMED_CLI, "run", str(recipe), "--stage", STAGE,
                           f"stages.{STAGE}.params.noise={40 + i + 0.5}", "-q"],
                          cwd=recipe.parent, capture_output=True, text=True, check=False)
    total = (time.perf_counter() - start) * 1000
    line = next(x for x in done.stderr.splitlines() if x.startswith("CHECK "))
    reached, waited = (float(v) for v in line.split()[1:])
    return reached, waited, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "demo"
        shutil.copytree(DEMO, study)
        recipe = study / "recipe.yaml"
        habitrun = [sys.executable, "-m", "habitrun.cli.app"]
        subprocess.run([*habitrun, "run", str(recipe), "--stage", "features", "-q"], cwd=study,
                       capture_output=True, check=True)
        rows: dict[str, list[float]] = {
            "python -c pass": [wall([sys.executable, "-c", "pass"], study) for _ in range(opts.repeat)],
            "python -c 'import numpy'": [wall([sys.executable, "-c", "import numpy"], study)
                                         for _ in range(opts.repeat)],
            "habitrun validate": [wall([*habitrun, "validate", str(recipe)], study) for _ in range(opts.repeat)],
            "habitrun run (no-op, --stage features)": [
                wall([*habitrun, "run", str(recipe), "--stage", "features", "-q"], study) for _ in range(opts.repeat)],
        }
        cli = [cli_with_work(recipe, i) for i in range(opts.repeat)]
        rows[f"habitrun run, work in {STAGE}: command start -> check needed"] = [w[0] for w in cli]
        rows[f"habitrun run, work in {STAGE}: waited for the check"] = [w[1] for w in cli]
        rows[f"habitrun run, work in {STAGE}: whole command, 24 subjects"] = [w[2] for w in cli]
        work = [with_work(recipe, i) for i in range(opts.repeat)]
        rows["child started after the recipe loads: waited for the check"] = [w[1] for w in work]
    width = max(len(k) for k in rows)
    print(f"{'what':<{width}}  {'median ms':>9}  {'min ms':>7}")
    for name, values in rows.items():
        print(f"{name:<{width}}  {statistics.median(values):9.0f}  {min(values):7.0f}")


if __name__ == "__main__":
    main()
