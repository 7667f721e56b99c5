"""What the environment lock costs a run: the distributions listed, and the lock written at N subjects.

First the installed distributions: habitrun's header read of each ``*.dist-info`` / ``*.egg-info``
(store/environment.py ``installed_distributions``) against ``importlib.metadata.distributions()`` with
each one's Name and Version (what ``pip freeze`` does), in this interpreter, warm.

Then, for a study of N subjects with two file columns (plan_scale.py's ``build_with_files``), the
plan's context is built once and the run folder's lock (``environment.json`` + ``inputs.tsv``, what
the runner writes before its first subject: engine/environment_lock.py ``write_lock``) is written
``--repeat`` times into a fresh folder: median seconds, and per subject.

    python benchmarks/environment_lock.py [--subjects 1000,100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_scale import build_with_files  # noqa: E402

from habitrun.engine.environment_lock import write_lock  # noqa: E402
from habitrun.planner.context import build_context  # noqa: E402
from habitrun.spec.loader import load_recipe  # noqa: E402
from habitrun.spec.subjects import load_subjects  # noqa: E402
from habitrun.store.checkpoint import CheckpointStore  # noqa: E402
from habitrun.store.environment import installed_distributions  # noqa: E402


def median_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _writer(tmp: Path, context: object, subjects: object):  # noqa: ANN202
    """One lock written into a new run folder per call."""
    count = [0]

    def write() -> None:
        count[0] += 1
        folder = tmp / f"run{count[0]}"
        folder.mkdir()
        write_lock(folder, git={"commit": None}, context=context, subjects=subjects)  # type: ignore[arg-type]

    return write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subjects", default="1000,100000", help="comma-separated study sizes")
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    ours = median_of(installed_distributions, opts.repeat)
    theirs = median_of(lambda: [(d.metadata["Name"], d.version) for d in md.distributions()], opts.repeat)
    print(f"{len(installed_distributions())} distributions: header read {ours * 1e3:.1f} ms, "
          f"importlib.metadata {theirs * 1e3:.1f} ms (median of {opts.repeat}, warm)")
    for n in (int(x) for x in opts.subjects.split(",")):
        with tempfile.TemporaryDirectory(prefix="envlock-bench-") as tmp:
            (Path(tmp) / "study").mkdir()
            recipe, _ = build_with_files(Path(tmp) / "study", n, 64)
            loaded = load_recipe(recipe)
            subjects = load_subjects(loaded)
            with CheckpointStore.open(loaded.store_dir()) as store:
                context = build_context(loaded, subjects, store)
            sec = median_of(_writer(Path(tmp), context, subjects), opts.repeat)
            print(f"{n:>9} subjects: lock written in {sec * 1e3:.1f} ms ({sec / n * 1e6:.2f} us a subject)")


if __name__ == "__main__":
    main()
