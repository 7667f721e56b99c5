"""Collect every subject's features into one CSV table (the input of the train stage)."""

from __future__ import annotations

import csv


def write_table(results, label_column: str = "label") -> dict:
    ids = sorted(results)
    columns = sorted(results[ids[0]]) if ids else []
    path = results.workdir / "features.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["subject_id", "label", *columns])
        for sid in ids:
            label = results.fields.get(sid, {}).get(label_column, "")
            writer.writerow([sid, label, *(results[sid][c] for c in columns)])
    print(f"wrote {len(ids)} subjects x {len(columns)} features to {path}")
    return {"table": str(path), "n_subjects": len(ids), "features": columns}
