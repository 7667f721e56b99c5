"""Finding a study's run by its id, for `diff` and `export`: one function, over store/runs.py.

Kept to :func:`find_run` so it can move into a shared run lookup later. An id
may be given whole or by a prefix that names one run; ``latest`` is the newest.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from habitrun.errors import UsageError
from habitrun.store.runs import RUNS, RunFolder, list_runs


def find_run(run_root: Path, run_id: str | None, *, recipe: Path) -> RunFolder:
    """The run ``run_id`` (whole, a unique prefix, or None / ``latest``: the newest) of the study
    whose runs live under ``run_root``; UsageError (exit 2) naming the runs there when none matches."""
    runs = list_runs(run_root)
    if not runs:
        raise UsageError(f"no run yet for {recipe}: run the study first ({shlex.join(['habitrun', 'run', str(recipe)])})")
    if run_id is None or run_id == "latest":
        return runs[-1]
    exact = [r for r in runs if r.run_id == run_id]
    matches = exact or [r for r in runs if r.run_id.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    shown = ", ".join(r.run_id for r in (matches or runs)[-5:])
    if matches:
        raise UsageError(f"{run_id!r} names {len(matches)} runs under {Path(run_root) / RUNS}: {shown}; "
                         "give more of the id")
    raise UsageError(f"no run {run_id!r} under {Path(run_root) / RUNS} (the latest: {shown})")
