"""What `run` and `resume` share: the selection options, the operator check, the display, the summary.

``--retry-failed`` and ``--rerun`` are sugar for the policy fields
``retry_failed_subjects`` and ``force_rerun_subjects``: they become overrides,
so the run's provenance records them and a ``resume`` replays them.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from habitrun.cli import consoleout, entry
from habitrun.cli.app import err_console
from habitrun.cli.progress import RunDisplay
from habitrun.cli.summary import print_summary
from habitrun.cli.text import esc
from habitrun.engine.events import Event, RunStarted
from habitrun.engine.runner import run_study
from habitrun.errors import LostRecordsError, StoreWriteError, UsageError
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.spec.opcheck import OperatorCheck
from habitrun.store.runindex import note_run_elsewhere
from habitrun.store.runs import RUNS
from habitrun.study.which import home_elsewhere

RETRY_FAILED_HELP = "Rerun the subjects whose failure an earlier run recorded (policy.retry_failed_subjects=true)."
RERUN_HELP = "Rerun this subject even if it is stored as done (repeat for several; with --stage, only in that stage)."
STAGE_HELP = "Run only this stage and the stages it needs."
RECORD_NOOP_HELP = "Write a run folder even when nothing is left to run."
DETACH_HELP = ("Backend slurm: submit the next stage's job arrays and return (the run ends 'detached'); "
               "`habitrun status` follows them, `habitrun resume` merges their results and goes on.")
ACCEPT_LOSS_HELP = ("Go on when records an earlier run committed are lost from the store and its journal cannot "
                    "restore them (their subjects run again).")


@dataclass(frozen=True)
class Selection:
    """What the command line chose to (re)run beyond the recipe."""

    retry_failed: bool = False
    rerun: tuple[str, ...] = ()
    stage: str | None = None
    record_noop: bool = False

    def overrides(self, loaded: LoadedRecipe) -> tuple[str, ...]:
        """The policy overrides this selection stands for (ids added to those the recipe lists)."""
        out: list[str] = []
        if self.retry_failed:
            out.append("policy.retry_failed_subjects=true")
        if self.rerun:
            if self.stage is not None and self.stage in {s.name for s in loaded.recipe.stages}:
                listed = loaded.stage_policy(self.stage).force_rerun_subjects
                where = f"stages.{self.stage}.policy.force_rerun_subjects"
            else:
                listed = loaded.recipe.policy.force_rerun_subjects
                where = "policy.force_rerun_subjects"
            ids = list(dict.fromkeys([*listed, *self.rerun]))
            out.append(f"{where}={json.dumps(ids, ensure_ascii=False)}")
        return tuple(out)

    def options(self) -> list[str]:
        """The options that chose what ran (for the retry command: --rerun is not repeated)."""
        words: list[str] = []
        if self.stage is not None:
            words += ["--stage", self.stage]
        return words


def load_selected(path: Path, overrides: Sequence[str], selection: Selection, **kwargs: Any) -> LoadedRecipe:
    """The recipe with the selection's overrides after the user's."""
    loaded = load_recipe(path, tuple(overrides), **kwargs)
    extra = selection.overrides(loaded)
    return load_recipe(path, (*overrides, *extra), **kwargs) if extra else loaded


def retry_command(command: str, target: str, overrides: Sequence[str], selection: Selection) -> str:
    """The exact command that retries the recorded failures of what was just run."""
    words = ["habitrun", command, target, *overrides, *selection.options(), "--retry-failed"]
    return shlex.join(words)


def execute(console: Console, loaded: LoadedRecipe, *, quiet: bool, recipe_arg: str, retry: str,
            selection: Selection, resume: str, report: bool = False, accept_loss: bool = False,
            detach: bool = False, **run_kwargs: Any) -> NoReturn:
    """Check the operators (in a child, while the manifest loads), run, print the summary, exit.

    ``resume`` is the command that continues the run, named when a full disk stops it.
    ``report`` (or ``policy.report``) writes the run's HTML report into its folder at the end.
    ``accept_loss``: go on when committed records are lost for good (engine/recovering.py).
    ``detach``: submit to SLURM and return (refused unless a stage that runs uses backend slurm).
    """
    if detach:
        refuse_detach_without_slurm(loaded)
    home = home_elsewhere(loaded, run_kwargs.get("source_path"))  # run_dir given: listed in the study's own
    try:
        with OperatorCheck.start(loaded) as operators, RunDisplay(console, quiet=quiet) as display:
            def observe(event: Event) -> None:
                if isinstance(event, RunStarted):  # the run folder exists from here on
                    folder = loaded.run_root() / RUNS / event.run_id
                    consoleout.attach(folder)  # what a closed console could not show goes there
                    entry.note_run(str(folder), resume)  # a stop signal names it
                    if home is not None:
                        list_elsewhere(console, home, folder)
                display.on_event(event)

            summary = run_study(loaded, argv=sys.argv, observer=observe,
                                preflight=operators.raise_problems, only_stage=selection.stage,
                                record_noop=selection.record_noop, rerun=selection.rerun,
                                accept_loss=accept_loss, detach=detach, **run_kwargs)
    except StoreWriteError as exc:  # a full disk: stopped; say how to go on from here
        raise exc.with_resume(resume) from None
    except LostRecordsError as exc:  # the same command, accepting the loss
        raise exc.with_command(shlex.join([*_command_line(), "--accept-loss"])) from None
    entry.note_ended()
    print_summary(console, summary, recipe_arg=recipe_arg, retry_command=retry, err=err_console)
    if report or loaded.recipe.policy.report:
        # imported only when asked: it brings plan's display and the report's modules
        from habitrun.cli.report import write_run_report

        write_run_report(console, loaded, summary.run)
    raise typer.Exit(summary.exit_code)


def refuse_detach_without_slurm(loaded: LoadedRecipe) -> None:
    """--detach only means something where a stage runs as SLURM arrays: refused (exit 2) before running."""
    if not any(loaded.stage_policy(stage.name).backend == "slurm" for stage in loaded.recipe.stages):
        raise UsageError("--detach submits a stage's subjects as SLURM job arrays and returns, but no stage of this "
                         "recipe uses backend 'slurm' (set policy.backend: slurm, or run without --detach)")


def list_elsewhere(console: Console, home: Path, folder: Path) -> None:
    """List a run folder made outside the study's own run root there, so read commands find it."""
    try:
        note_run_elsewhere(home, folder)
    except OSError as exc:
        console.print(f"[yellow]warning:[/] cannot list this run in {esc(str(home))} ({esc(exc.strerror or str(exc))}): "
                      f"`habitrun status` finds it only with its overrides", highlight=False)


def _command_line() -> list[str]:
    """The command as the user typed it (``habitrun run ...``), for a message that repeats it."""
    return ["habitrun", *sys.argv[1:]]
