"""`habitrun debug RECIPE SUBJECT`: one subject's map stages in the CLI's own process, a debugger at the failure.

Debugging one subject through `run` takes a serial backend, one worker and
no timeout, and its output goes to a log. Here the subject's inputs, keys and
work folders are a run's (:mod:`habitrun.engine.debug_subject`), but the
operator is called directly: prints reach the terminal, a breakpoint() works,
and ``--pdb`` opens ``pdb.post_mortem`` in the frame that raised. Nothing is
stored unless ``--store`` (then each success is stored as a run stores it,
under the same key; a failure is never stored). ``--stage S`` runs S alone,
its upstream results read from the store; one that is missing is an error
(exit 2) naming the command that makes it. Collect and train stages are
refused (exit 2): they are not one subject's work.
"""

from __future__ import annotations

import difflib
import pdb
import signal
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Optional

import typer
from rich.console import Console

import habitrun
from habitrun.cli.app import app, err_console
from habitrun.cli.text import esc
from habitrun.engine.debug_subject import Attempt, SubjectDebugger, stages_to_debug
from habitrun.engine.runner import lock_path_for
from habitrun.errors import EXIT_FAILED_SUBJECTS, EXIT_INTERRUPTED, HabitrunError, UsageError
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.spec.roots import declared_roots
from habitrun.spec.subjects import load_subjects, rows_by_id, subject_ids
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.folders import ensure_folder
from habitrun.store.lock import StoreLock

RESULT_SHOWN_CHARS = 300  # a result's repr is cut past this
_PACKAGE_DIR = str(Path(habitrun.__file__).resolve().parent)


def _close(word: str, names: list[str]) -> list[str]:
    return difflib.get_close_matches(word, names, n=3, cutoff=0.6)


def _open_store(loaded: LoadedRecipe, *, write: bool) -> CheckpointStore | None:
    """The store to write (``--store``: created if needed, as a run does), else the existing one read-only."""
    store_dir = loaded.store_dir()
    if write:
        ensure_folder(loaded.run_root())
        ensure_folder(store_dir.parent)
        store = CheckpointStore.open(store_dir)
        store.set_roots(loaded.run_root(), loaded.root, declared_roots(loaded).data)
        warning = store.check_recipe(loaded.recipe.name, loaded.sha256,
                                     strict=loaded.recipe.policy.strict_checkpoint_hash)
        if warning:
            err_console.print(f"[yellow]warning:[/] {esc(warning)}", highlight=False)
        return store
    if not CheckpointStore.exists(store_dir):
        return None
    store = CheckpointStore.open(store_dir, create=False, read_only=True)
    store.set_roots(loaded.run_root(), loaded.root, declared_roots(loaded).data)
    return store


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame outside habitrun: the operator's own, not the call into it."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    return tb


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C as in plain Python while the operator (or pdb) runs: a KeyboardInterrupt where it is, not the CLI's
    immediate exit (cli/entry.py), so a hung subject shows its traceback and pdb keeps its own Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _shown(result: Any) -> str:
    text = repr(result)
    return text if len(text) <= RESULT_SHOWN_CHARS else text[:RESULT_SHOWN_CHARS] + " ..."


def _failed(attempt: Attempt, exc: BaseException, *, post_mortem: bool) -> None:
    """The user's traceback, a one-line summary; the debugger in the raising frame with ``--pdb``."""
    tb = _user_frames(exc.__traceback__) or exc.__traceback__
    sys.stdout.flush()
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    sys.stderr.flush()
    line = traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()
    verdict = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    err_console.print(f"[bold red]{verdict}:[/] stage {esc(attempt.stage.name)}, subject {esc(attempt.task.subject_id)}: "
                      f"{esc(line[0] if line else type(exc).__name__)}", highlight=False)
    if post_mortem:
        err_console.print("entering the debugger at the exception (q quits)", highlight=False)
        pdb.post_mortem(tb)
    else:
        err_console.print("add --pdb to stop in the debugger where it was raised", highlight=False)


@app.command()
def debug(
    recipe: Path = typer.Argument(..., help="The recipe file."),
    subject: str = typer.Argument(..., help="The subject's id."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Overrides like stages.features.params.bins=64."),  # noqa: UP045
    stage: Optional[str] = typer.Option(None, "--stage", help="Run this map stage only; what it needs is read "  # noqa: UP045
                                        "from the store."),
    post_mortem: bool = typer.Option(False, "--pdb", help="On an exception, stop in the debugger (pdb) where "
                                     "it was raised."),
    store_results: bool = typer.Option(False, "--store", help="Store each success as a run would (default: "
                                       "nothing is stored)."),
) -> None:
    """Run one subject's map stages in this process (no workers, no timeout, output to the terminal).

    Every map stage in order, or only --stage S. The subject's inputs, work
    folders and keys are a run's. Exit 0: every stage succeeded; 1: the
    operator raised (its traceback is printed; --pdb stops there); 2: bad
    recipe, unknown subject or stage, a needed result not stored, or a
    collect/train stage asked for; 130: Ctrl-C (the operator's traceback
    printed, --pdb stops there too).
    """
    loaded = load_recipe(recipe, tuple(overrides or ()))
    subjects = load_subjects(loaded)
    row = rows_by_id(subjects).get(subject)
    if row is None:
        near = _close(subject, subject_ids(subjects))
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UsageError(f"no subject {subject!r} in {loaded.path} ({len(subjects)} subjects){hint}")
    stages = stages_to_debug(loaded, stage, _close)
    if not stages:
        raise UsageError(f"{loaded.path} has no map stage: `habitrun debug` runs one subject's map stages")
    out_console = Console(highlight=False, soft_wrap=True)
    lock = StoreLock(lock_path_for(loaded.store_dir())) if store_results else None
    if lock is not None:
        lock.acquire()  # a run going on: refused now (exit 2), not after the subject ran
    store = None
    try:
        store = _open_store(loaded, write=store_results)
        debugger = SubjectDebugger(loaded, subjects, row, store, stages)
        for chosen in stages:
            attempt = debugger.attempt(chosen)
            with interruptible():
                try:
                    err_console.print(f"debug: stage {esc(chosen.name)}, subject {esc(row.id)} (plan: "
                                      f"{attempt.status.value}); work folder {esc(attempt.task.workdir)}",
                                      highlight=False)  # said once Ctrl-C reaches the operator as it would
                    result, took = debugger.call(debugger.bind(chosen), attempt)
                except HabitrunError:  # the operator could not be imported: the recipe's error (exit 2)
                    raise
                except KeyboardInterrupt as exc:  # a hung subject: where it was is worth seeing
                    _failed(attempt, exc, post_mortem=post_mortem)
                    raise typer.Exit(EXIT_INTERRUPTED) from None
                except (Exception, SystemExit) as exc:  # the operator's: reported as such, never as habitrun's
                    _failed(attempt, exc, post_mortem=post_mortem)
                    raise typer.Exit(EXIT_FAILED_SUBJECTS) from None
            sys.stdout.flush()
            err_console.print(f"[green]done:[/] stage {esc(chosen.name)}, subject {esc(row.id)} in {took:.3f} s",
                              highlight=False)
            out_console.print(f"{esc(chosen.name)} {esc(row.id)}: {esc(_shown(result))}", highlight=False)
            if store is not None and store_results:
                store.put([debugger.record(attempt, result, took)])
                err_console.print(f"stored under key {esc(attempt.key)}", highlight=False)
        if not store_results:
            err_console.print("nothing stored (--store stores each success as a run would)", highlight=False)
    finally:
        if store is not None:
            store.close()
        if lock is not None:
            lock.release()
