"""What a command stage costs per subject, against a plain ``subprocess.run`` loop of the same tool.

The tool is ``cp SRC out.txt`` (about a millisecond): what is measured is what
habitrun adds around it, not the tool. A: `habitrun run` of a recipe whose one
map stage is ``command: [cp, "{src}", out.txt]`` with ``outputs: {copy: out.txt}``
(process backend, a fresh store each time). B: a Python script that reads the
same manifest and calls ``subprocess.run(["cp", src, DIR/out.txt], check=True)``
per subject, then checks the output exists, from ``workers`` threads. Both are
whole processes. Each is timed at two sizes, and the per-subject cost is the
slope, (T(large) - T(small)) / (large - small), so start-up (the interpreter,
habitrun's imports, the store) is left out. Sizes alternate A/B so a load spike
on the shared machine hits both; the medians over ``--repeat`` are printed.

    python benchmarks/command_stage.py                    # 50 and 400 subjects, workers 1 and 2
    python benchmarks/command_stage.py --small 100 --large 1000 --repeat 5 --workers 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PLAIN = textwrap.dedent('''
    import csv, os, subprocess, sys
    from concurrent.futures import ThreadPoolExecutor

    manifest, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(manifest, newline="") as handle:
        rows = list(csv.DictReader(handle))
    root = os.path.dirname(manifest)

    def one(row):
        folder = os.path.join(out, row["subject_id"])
        os.makedirs(folder, exist_ok=True)
        subprocess.run(["cp", os.path.join(root, row["src"]), os.path.join(folder, "out.txt")], check=True)
        if not os.path.exists(os.path.join(folder, "out.txt")):
            raise SystemExit("missing output")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, rows))
''')


def make_study(folder: Path, n: int, workers: int) -> Path:
    (folder / "data").mkdir(parents=True)
    lines = ["subject_id,src"]
    for i in range(n):
        (folder / "data" / f"s{i}.txt").write_text(f"subject {i}\n")
        lines.append(f"s{i},data/s{i}.txt")
    (folder / "subjects.csv").write_text("\n".join(lines) + "\n")
    (folder / "recipe.yaml").write_text(textwrap.dedent(f"""
        habitrun: 1
        name: bench-command
        subjects: {{manifest: subjects.csv, files: [src]}}
        policy: {{backend: process, workers: {workers}}}
        stages:
          - name: copy
            command: [cp, "{{src}}", out.txt]
            outputs: {{copy: out.txt}}
    """))
    (folder / "plain.py").write_text(PLAIN)
    return folder


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(n: int, workers: int) -> tuple[float, float]:
    """(habitrun seconds, plain loop seconds) for ``n`` subjects, each on a fresh study."""
    with tempfile.TemporaryDirectory(prefix="bench-cmd-") as tmp:
        study = make_study(Path(tmp) / "study", n, workers)
        a = timed([sys.executable, "-m", "habitrun.cli.app", "run", str(study / "recipe.yaml"), "-q"])
        out = Path(tmp) / "plain-out"
        b = timed([sys.executable, str(study / "plain.py"), str(study / "subjects.csv"), str(out), str(workers)])
        shutil.rmtree(out, ignore_errors=True)
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--large", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for workers in args.workers:
        runs: dict[int, list[tuple[float, float]]] = {args.small: [], args.large: []}
        for _ in range(args.repeat):
            for n in (args.small, args.large):
                runs[n].append(measure(n, workers))
        med = {n: (statistics.median(a for a, _ in r), statistics.median(b for _, b in r)) for n, r in runs.items()}
        span = args.large - args.small
        per_a = (med[args.large][0] - med[args.small][0]) / span * 1000
        per_b = (med[args.large][1] - med[args.small][1]) / span * 1000
        print(f"workers={workers}: habitrun {med[args.small][0]:.2f} s / {med[args.large][0]:.2f} s, "
              f"plain loop {med[args.small][1]:.2f} s / {med[args.large][1]:.2f} s "
              f"({args.small} / {args.large} subjects, median of {args.repeat})")
        print(f"  per subject: command stage {per_a:.2f} ms, subprocess.run loop {per_b:.2f} ms, "
              f"overhead {per_a - per_b:+.2f} ms")


if __name__ == "__main__":
    main()
