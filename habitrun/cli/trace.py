"""`habitrun trace [RECIPE] [OVERRIDES...] [-o trace.csv|trace.jsonl] [--stage S] [--run RUN_ID]`: one row per subject attempt.

The rows come from the store's trace table (store/trace.py): what each
attempt cost (wall and CPU seconds, peak memory, bytes read and written)
and how it ended, with its worker, host and GPU. Times come twice: ISO-8601 UTC
(``started``) for people and spreadsheets, Unix seconds (``started_at``) for arithmetic. By default the latest run's
rows (from its store, wherever ``run_dir`` put it); ``--run ID`` another run's, ``--run all`` every run's; with
``key=value`` overrides that no run used, the attempts behind the results they select. The first line on stderr
says which run and overrides. Nothing is written to the store.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from habitrun.cli.app import app, err_console
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.tables import write_table
from habitrun.cli.text import esc
from habitrun.errors import UsageError
from habitrun.store.trace import TRACE_COLUMNS
from habitrun.study.facade import Study

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


@app.command()
def trace(
    recipe_word: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: Optional[list[str]] = typer.Argument(None, help="Overrides like run's (key=value): the attempts behind the results they select."),  # noqa: UP045
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="File to write: .csv .tsv .jsonl .parquet (default: CSV on stdout)."),  # noqa: UP045
    stage: Optional[str] = typer.Option(None, "--stage", help="Only this stage's attempts."),  # noqa: UP045
    run: Optional[str] = typer.Option(None, "--run", help="A run id (default: the latest run; 'all': every run)."),  # noqa: UP045
) -> None:
    """Write one row per subject attempt: outcome, times, CPU, peak memory, I/O, worker, host, GPU."""
    recipe, overrides = recipe_and_overrides(recipe_word, overrides)
    study = Study.at_run(recipe, overrides, None if run == "all" else run)
    if stage is not None and stage not in {s.name for s in study.loaded.recipe.stages}:
        raise UsageError(f"the recipe has no stage {stage!r}; its stages are: "
                         f"{', '.join(s.name for s in study.loaded.recipe.stages)}")
    if run != "all" and study.run is None and not overrides:
        raise UsageError(f"no run yet for {study.loaded.path}: run the study first "
                         f"({shlex.join(['habitrun', 'run', str(study.loaded.path)])})")
    if run == "all" or study.run is not None:
        run_id = None if run == "all" or study.run is None else study.run.run_id
        store = study.store(required=True)
        assert store is not None
        with store:
            rows = store.trace(run_id=run_id, stage=stage)
    else:  # values no run used: the attempts behind the results they select
        subjects, store = study.subjects_and_store()
        if store is None:
            study.store(required=True)
        assert store is not None
        with store:
            plan = study.plan(subjects, store)
            keys = [key for s in plan if stage in (None, s.name) for key in s.keys.values()]
            rows = store.trace(stage=stage, keys=keys)
    typer.echo("about every run" if run == "all" else study.about.line(), err=True)  # plain: no rich
    write_table(output, COLUMNS, [with_iso_times(row) for row in rows])
    if output is not None:
        err_console.print(f"wrote {len(rows)} attempt(s) to {esc(str(output))}", highlight=False)
