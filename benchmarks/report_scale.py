"""The HTML report at scale: how long `habitrun report` takes and how large the file is.

Builds a study in a temporary folder (manifest of N subjects, recipe with two
map stages), a finished run folder with its provenance, and N trace rows per
stage in the checkpoint store (16 workers, 1 % failures with log files),
then times ``habitrun report`` as a user runs it (a fresh process: import,
load the recipe, read the trace, draw, write) and reports the file's size.
Targets for 100,000 subjects: at most 5 s and 10 MB.

    /work/venv/bin/python benchmarks/report_scale.py [--subjects 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from habitrun.spec.loader import load_recipe
from habitrun.store import CheckpointStore
from habitrun.store.runs import RunFolder
from habitrun.store.trace import TRACE_COLUMNS

RECIPE = """\
habitrun: 1
name: report-scale
subjects: {manifest: subjects.csv}
policy: {backend: process, workers: 16, subject_timeout_sec: 120, worker_memory_limit_mb: 4096}
stages:
  - {name: qc, operator: "ops:qc"}
  - {name: features, operator: "ops:features", needs: [qc]}
"""


def build(folder: Path, n: int) -> Path:
    (folder / "ops.py").write_text("def qc(subject):\n    return 1\n\ndef features(subject):\n    return 2\n")
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"sub-{i:06d}\n" for i in range(n)))
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE)
    loaded = load_recipe(recipe)
    run = RunFolder.create(loaded.run_root(), resolved_yaml=loaded.resolved_yaml(), recipe_path=recipe, argv=["bench"])
    t0 = time.time() - 3 * 3600
    rows = []
    for s, stage in enumerate(("qc", "features")):
        for i in range(n):
            lane = i % 16
            start = t0 + s * 5000 + (i // 16) * 0.8 + lane * 0.01
            wall = 0.2 + (i * 7919 % 550) / 1000  # below the 0.8 s between a worker's starts
            failed = i % 100 == 7
            log = None
            if failed:
                log = str(run.stage_log_dir(stage) / f"sub-{i:06d}.log")
                os.makedirs(os.path.dirname(log), exist_ok=True)
                Path(log).write_text("".join(f"line {k} of the log\n" for k in range(40)) + "ValueError: bad\n")
            row = dict.fromkeys(TRACE_COLUMNS) | {
                "run_id": run.run_id, "stage": stage, "subject": f"sub-{i:06d}", "attempt": 1,
                "outcome": "failed" if failed else "done", "kind": "exception" if failed else None,
                "error": "ValueError: bad" if failed else None, "queued_at": t0, "started_at": start,
                "ended_at": start + wall, "wall_sec": wall, "cpu_sec": wall * 0.9,
                "peak_rss_mb": 200 + (i * 104729 % 3000), "child_peak_rss_mb": 0, "read_bytes": 1 << 20,
                "write_bytes": 1 << 16, "pid": 5000 + lane, "host": "node1", "key": f"{stage}.{i}", "log": log}
            rows.append(tuple(row[c] for c in TRACE_COLUMNS))
    with CheckpointStore.open(loaded.store_dir()) as store:
        for start in range(0, len(rows), 5000):
            store.put([], rows[start:start + 5000])
    run.write_provenance({"run_id": run.run_id, "recipe_name": "report-scale", "subjects": n, "outcome": "failed",
                          "started_at": "2026-01-01T00:00:00+00:00", "ended_at": "2026-01-01T03:00:00+00:00",
                          "summary": {"duration_sec": 10800.0, "stages": {
                              "qc": {"total": n, "done": n - n // 100, "failed": n // 100},
                              "features": {"total": n, "done": n - n // 100, "failed": n // 100}}}})
    return recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="habitrun-report-") as tmp:
        recipe = build(Path(tmp), args.subjects)
        out = Path(tmp) / "report.html"
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "habitrun.cli.app", "report", str(recipe), "-o", str(out)],
                           check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        size = out.stat().st_size
    print(f"{'subjects':<10}{'attempts':>10}{'best s':>10}{'median s':>10}{'size MB':>10}  (targets: 5 s, 10 MB)")
    print(f"{args.subjects:<10}{2 * args.subjects:>10}{min(times):>10.2f}{sorted(times)[len(times) // 2]:>10.2f}"
          f"{size / 1e6:>10.2f}")


if __name__ == "__main__":
    main()
