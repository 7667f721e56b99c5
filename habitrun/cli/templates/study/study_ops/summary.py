"""A collect operator: called once with every subject's result."""

from __future__ import annotations

import csv


def summarize(results) -> dict:
    """``results`` maps subject id -> result; ``results.workdir`` is a folder for files."""
    table = results.workdir / "scores.csv"
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["subject_id", "group", "score"])
        for subject_id, result in sorted(results.items()):
            writer.writerow([subject_id, result["group"], result["score"]])
    scores = [r["score"] for r in results.values()]
    return {"subjects": len(scores), "mean_score": sum(scores) / len(scores) if scores else None, "table": str(table)}
