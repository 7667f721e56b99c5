"""What `status` says of a study's SLURM arrays: each open batch, its tasks' states, its shards' progress.

Read only: the shards are counted, never merged into the store (``habitrun
resume`` merges them, under the store lock). An outcome is counted from its
record's head (done or failed), so counting never imports the study's code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from habitrun.engine.slurm import commands
from habitrun.engine.slurm.backend import open_batches, read_arrays, slurm_folder
from habitrun.engine.slurm.shard import ShardFollower, outcome_ok
from habitrun.errors import SlurmError


@dataclass
class BatchView:
    """One open batch: its stage, array ids, task states now, and the outcomes its shards hold."""

    name: str
    stage: str
    arrays: list[str]
    subjects: int
    tasks: int
    states: dict[str, int] = field(default_factory=dict)  # SLURM state -> tasks in it (live ones)
    done: int = 0
    failed: int = 0

    @property
    def live(self) -> int:
        return sum(self.states.values())

    def as_dict(self) -> dict[str, Any]:
        return {"batch": self.name, "stage": self.stage, "arrays": self.arrays, "subjects": self.subjects,
                "tasks": self.tasks, "states": dict(self.states), "ended": self.tasks - self.live,
                "done": self.done, "failed": self.failed}


@dataclass
class ArraysView:
    """The study's open batches, and why their states are unknown (squeue failing or missing), if so."""

    batches: list[BatchView]
    squeue_error: str | None = None

    @property
    def live(self) -> int:
        return sum(b.live for b in self.batches)

    def as_dict(self) -> dict[str, Any]:
        return {"batches": [b.as_dict() for b in self.batches], "live_tasks": self.live,
                **({"squeue_error": self.squeue_error} if self.squeue_error else {})}


def arrays_view(run_root: Path) -> ArraysView | None:
    """The open batches under the study's run root (None: it never used the slurm backend, or all merged)."""
    folders = open_batches(slurm_folder(run_root))
    if not folders:
        return None
    views: list[BatchView] = []
    for folder in folders:
        arrays = read_arrays(folder)
        if arrays is None:
            continue
        view = BatchView(name=folder.name, stage=str(arrays.get("stage")),
                         arrays=[str(p["job"]) for p in arrays.get("parts", [])],
                         subjects=int(arrays.get("subjects") or 0), tasks=int(arrays.get("chunks") or 0))
        seen: dict[str, bool] = {}
        for record in ShardFollower(folder).poll():
            if record.kind == "outcome" and record.key is not None and record.key not in seen:
                seen[record.key] = outcome_ok(record)
        view.done = sum(1 for ok in seen.values() if ok)
        view.failed = len(seen) - view.done
        views.append(view)
    out = ArraysView(views)
    ids = sorted({a for v in views for a in v.arrays})
    if ids:
        try:
            live = commands.live_tasks(ids)
        except SlurmError as exc:
            out.squeue_error = exc.message
        else:
            for view in views:
                for (job, _index), state in live.items():
                    if job in view.arrays:
                        view.states[state] = view.states.get(state, 0) + 1
    return out


def arrays_lines(view: ArraysView) -> list[str]:
    """The view in words, one line per batch (plain text: the caller escapes it)."""
    lines = [f"SLURM arrays: {len(view.batches)} batch(es) not yet merged into the store "
             "(`habitrun resume` merges them)"]
    for b in view.batches:
        states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(b.states.items())) or "none queued or running"
        lines.append(f"  {b.stage}: array(s) {', '.join(b.arrays) or '-'}: {b.tasks} task(s), {states}; "
                     f"shards hold {b.done} done, {b.failed} failed of {b.subjects} subject(s)")
    if view.squeue_error:
        lines.append(f"  task states unknown: {view.squeue_error}")
    return lines
