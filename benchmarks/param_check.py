"""What checking params against the operators' annotations costs `validate` (issue 32).

A study of two annotated operators (``float``, ``int``, ``list[float]``, ``Literal``, ``Path``, an
annotated ``**kwargs``) with values that fit; `habitrun validate` is timed N times, whole processes,
alternating with the same command of another tree (``--baseline DIR``: a checkout whose ``habitrun/``
has no annotation check, put first on PYTHONPATH) so a load spike hits both. ``--pydantic`` makes the
operator module import pydantic itself (then the check's own use of it costs nothing more).
Printed: median and min-max wall time of each.

    python benchmarks/param_check.py --baseline /tmp/base --repeat 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPS = '''
{extra}
from pathlib import Path
from typing import Literal


def measure(subject, offset: float, n: int = 1, spacing: list[float] = (1.0,),
            mode: Literal["fast", "slow"] = "fast", out: Path = Path("x")):
    return {{"offset": offset}}


class Model:
    def __init__(self, scale: float = 1.0, **rest: int) -> None:
        self.scale = scale

    def __call__(self, subject):
        return self.scale
'''

RECIPE = """\
habitrun: 1
name: types
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - name: a
    operator: ops:measure
    params: {offset: 1, n: 3, spacing: [1, 1, 1], mode: slow, out: data/out.nii.gz}
  - name: b
    operator: ops:Model
    params: {scale: 2, extra: 5}
    needs: [a]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another tree: DIR/habitrun is timed alongside")
    parser.add_argument("--pydantic", action="store_true", help="the operator module imports pydantic")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    trees = {"this tree": here, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp)
        (study / "ops.py").write_text(OPS.format(extra="import pydantic" if args.pydantic else ""))
        (study / "subjects.csv").write_text("subject_id\nS1\nS2\n")
        (study / "recipe.yaml").write_text(RECIPE)
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, root in trees.items():
                env = {**os.environ, "PYTHONPATH": str(root)}
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "validate", "recipe.yaml"],
                                      cwd=study, capture_output=True, text=True, env=env, timeout=120)
                times[name].append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise SystemExit(f"{name}: validate failed: {done.stdout}{done.stderr}")
    for name, values in times.items():
        print(f"validate ({name}): median {statistics.median(values) * 1000:.0f} ms "
              f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f}; N={len(values)})")


if __name__ == "__main__":
    main()
