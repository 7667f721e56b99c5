"""How long reading a large subject manifest takes, per format.

    python benchmarks/manifest_scale.py [ROWS]

Writes a study with ROWS subjects (default 100,000; 5 columns) in a temporary
folder and times ``load_subjects`` (read, id checks, safe names, filters),
best of 3, for each manifest format. CPU time is shown beside wall time
because the machine is often shared; µs/row is CPU time per row.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects

RECIPE = """\
habitrun: 1
name: scale
subjects: {{manifest: {manifest}, exclude: [S000007]}}
stages:
  - name: a
    operator: ops:a
"""


def write(folder: Path, fmt: str, rows: int) -> str:
    records = [{"subject_id": f"S{i:06d}", "seed": i, "label": i % 2, "site": "north", "age": 20 + i % 60} for i in range(rows)]
    path = folder / f"subjects.{fmt}"
    if fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        lines = [sep.join(records[0])] + [sep.join(str(v) for v in r.values()) for r in records]
        path.write_text("\n".join(lines) + "\n")
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "json":
        path.write_text(json.dumps(records, indent=1))
    return path.name


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    print(f"{'format':<8} {'rows':>9} {'MB':>6} {'wall s':>8} {'cpu s':>8} {'µs/row':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for fmt in ("csv", "tsv", "jsonl", "json"):
            name = write(folder, fmt, rows)
            recipe = folder / f"recipe-{fmt}.yaml"
            recipe.write_text(RECIPE.format(manifest=name))
            loaded = load_recipe(recipe)
            best = cpu = float("inf")
            for _ in range(3):
                start, start_cpu = time.perf_counter(), time.process_time()
                subjects = load_subjects(loaded)
                best = min(best, time.perf_counter() - start)
                cpu = min(cpu, time.process_time() - start_cpu)
            assert len(subjects) == rows - 1
            size = (folder / name).stat().st_size / 1e6
            print(f"{fmt:<8} {rows:>9,} {size:>6.1f} {best:>8.3f} {cpu:>8.3f} {cpu / rows * 1e6:>8.2f}")


if __name__ == "__main__":
    main()
