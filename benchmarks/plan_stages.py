"""Planning many stages: `habitrun plan` of a recipe of N stages over a few subjects.

A chain (stage i needs stage i-1) and a fan (every stage needs stage 0; a
last collect stage needs them all) of N map stages over 4 subjects, their
operators spread over a few modules; nothing stored yet. Each study is built
in a temporary folder and planned by the real CLI in a fresh process
(``python -m habitrun.cli.app plan``), the best of ``--repeat`` wall times
printed per shape and N (planning should grow linearly with the stages).

    python benchmarks/plan_stages.py [--stages 250 500 1000 2000] [--repeat 3] [--shape chain fan] [--subjects 4]
    python benchmarks/plan_stages.py --write DIR --stages 2000   # only write the study, to profile it:
    python -m cProfile -s cumtime -m habitrun.cli.app plan DIR/recipe.yaml
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULES = 4  # operators spread over this many modules
SUBJECTS = 4

OPS = """\
def step(subject, k=0):
    return k

def gather(results):
    return len(results)
"""


def recipe_text(n: int, shape: str) -> str:
    """A recipe of ``n`` stages: a ``chain`` (each needs the last) or a ``fan`` (each needs the first)."""
    lines = ["habitrun: 1", f"name: {shape}-{n}", "subjects: {manifest: subjects.csv}",
             "policy: {backend: serial, subject_timeout_sec: null}", "stages:"]
    for i in range(n):
        needs = "" if i == 0 else f", needs: [s{i - 1 if shape == 'chain' else 0}]"
        lines.append(f'  - {{name: s{i}, operator: "ops{i % MODULES}:step", params: {{k: {i}}}{needs}}}')
    if shape == "fan":
        lines.append('  - {name: gather, kind: collect, operator: "ops0:gather", needs: ['
                     + ", ".join(f"s{i}" for i in range(1, n)) + "]}")
    return "\n".join(lines) + "\n"


def write_study(folder: Path, n: int, shape: str, subjects: int = SUBJECTS) -> Path:
    """The recipe, its manifest and its operator modules in ``folder``; returns the recipe's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for m in range(MODULES):
        (folder / f"ops{m}.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i}\n" for i in range(subjects)))
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe_text(n, shape))
    return recipe


def time_plan(recipe: Path) -> float:
    """Wall seconds of one `habitrun plan` in a fresh process (exit 0 required)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "plan", recipe.name], cwd=recipe.parent,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"plan of {recipe} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, nargs="*", default=[250, 500, 1000, 2000])
    parser.add_argument("--shape", nargs="*", choices=["chain", "fan"], default=["chain", "fan"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--subjects", type=int, default=SUBJECTS)
    parser.add_argument("--write", type=Path, help="only write the study of the first --stages and --shape here")
    args = parser.parse_args()
    if args.write:
        print(write_study(args.write, args.stages[0], args.shape[0], args.subjects))
        return
    print(f"{'shape':<6} {'stages':>7} {'plan s':>8} {'ms/stage':>9}")
    with tempfile.TemporaryDirectory(prefix="plan-stages-") as tmp:
        for shape in args.shape:
            for n in args.stages:
                recipe = write_study(Path(tmp) / f"{shape}{n}", n, shape, args.subjects)
                best = min(time_plan(recipe) for _ in range(args.repeat))
                print(f"{shape:<6} {n:>7} {best:>8.2f} {1000 * best / n:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
