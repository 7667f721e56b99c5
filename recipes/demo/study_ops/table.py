"""Collect every subject's features into CSV tables: one row per subject (the train stage's input)
and one row per lesion."""

from __future__ import annotations

import csv


def write_table(results, label_column: str = "label") -> dict:
    ids = sorted(results)
    first = results[ids[0]] if ids else {}
    columns = sorted(k for k, v in first.items() if isinstance(v, (int, float)))
    path = results.workdir / "features.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["subject_id", "label", *columns])
        for sid in ids:
            label = results.fields.get(sid, {}).get(label_column, "")
            writer.writerow([sid, label, *(results[sid][c] for c in columns)])
    lesion_path = results.workdir / "lesions.csv"
    lesion_columns = sorted(next(iter(first.get("lesions", {}).values()), {}))
    lesion_rows = 0
    with open(lesion_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["subject_id", "lesion", *lesion_columns])
        for sid in ids:
            for lesion, features in sorted(results[sid].get("lesions", {}).items()):
                writer.writerow([sid, lesion, *(features[c] for c in lesion_columns)])
                lesion_rows += 1
    print(f"wrote {len(ids)} subjects x {len(columns)} features to {path}, {lesion_rows} lesions to {lesion_path}")
    return {"table": str(path), "lesions": str(lesion_path), "n_subjects": len(ids), "features": columns}
