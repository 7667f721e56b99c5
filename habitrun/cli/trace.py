"""`habitrun trace RECIPE [-o trace.csv|trace.jsonl] [--stage S] [--run RUN_ID]`: one row per subject attempt.

The rows come from the store's trace table (store/trace.py): what each
attempt cost (wall and CPU seconds, peak memory, bytes read and written)
and how it ended, with its worker, host and GPU. Times come twice: ISO-8601 UTC
(``started``) for people and spreadsheets, Unix seconds (``started_at``) for arithmetic. By default the latest run's
rows; ``--run all`` gives every run's. Nothing is written to the store.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from habitrun.cli.app import app, err_console
from habitrun.cli.findrecipe import given_or_found
from habitrun.cli.tables import write_table
from habitrun.cli.text import esc
from habitrun.errors import UsageError
from habitrun.planner.results import open_store
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.store.runs import latest_run, list_runs
from habitrun.store.trace import TRACE_COLUMNS

# Each epoch column (Unix seconds, kept for arithmetic) gets an ISO-8601 UTC twin before it, for people
# and spreadsheets: ``2026-12-06T02:30:01.123Z``.
ISO_TWINS = {"queued_at": "queued", "started_at": "started", "ended_at": "ended"}
COLUMNS: tuple[str, ...] = tuple(c for name in TRACE_COLUMNS for c in (
    (ISO_TWINS[name], name) if name in ISO_TWINS else (name,)))


def iso_utc(seconds: float | None) -> str | None:
    """Unix seconds as ISO-8601 UTC to the millisecond, ``Z``-suffixed (None stays None)."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_iso_times(row: tuple[object, ...]) -> dict[str, object]:
    """A stored trace row as the command writes it: the epoch columns with their ISO-8601 twins."""
    values = dict(zip(TRACE_COLUMNS, row, strict=True))
    for epoch, iso in ISO_TWINS.items():
        values[iso] = iso_utc(values[epoch])  # type: ignore[arg-type]
    return {c: values[c] for c in COLUMNS}


def pick_run(loaded: LoadedRecipe, run_id: str | None) -> str | None:
    """The run id to show: the given one (checked), the latest, or None for ``all``."""
    if run_id == "all":
        return None
    if run_id is None:
        latest = latest_run(loaded.run_root())
        if latest is None:
            raise UsageError(f"no run yet for {loaded.path}: run the study first "
                             f"({shlex.join(['habitrun', 'run', str(loaded.path)])})")
        return latest.run_id
    known = [r.run_id for r in list_runs(loaded.run_root())]
    if run_id not in known:
        shown = ", ".join(known[-5:]) or "none"
        raise UsageError(f"no run {run_id!r} under {loaded.run_root() / 'runs'} (latest: {shown}; or --run all)")
    return run_id


@app.command()
def trace(
    recipe: Optional[Path] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="File to write: .csv .tsv .jsonl .parquet (default: CSV on stdout)."),  # noqa: UP045
    stage: Optional[str] = typer.Option(None, "--stage", help="Only this stage's attempts."),  # noqa: UP045
    run: Optional[str] = typer.Option(None, "--run", help="A run id (default: the latest run; 'all': every run)."),  # noqa: UP045
) -> None:
    """Write one row per subject attempt: outcome, times, CPU, peak memory, I/O, worker, host, GPU."""
    loaded = load_recipe(given_or_found(recipe))
    if stage is not None and stage not in {s.name for s in loaded.recipe.stages}:
        raise UsageError(f"the recipe has no stage {stage!r}; its stages are: "
                         f"{', '.join(s.name for s in loaded.recipe.stages)}")
    run_id = pick_run(loaded, run)
    with open_store(loaded) as store:
        rows = store.trace(run_id=run_id, stage=stage)
    write_table(output, COLUMNS, [with_iso_times(row) for row in rows])
    if output is not None:
        err_console.print(f"wrote {len(rows)} attempt(s) to {esc(str(output))}", highlight=False)
