"""The typer application and the one place where habitrun's errors become exit codes.

Each command lives in its own module and registers itself on ``app``. Only
the command being run is imported (:class:`LazyCommands`): a command module
pulls in pydantic, the YAML reader, the planner or the engine, which together
cost several times Python's own start, and `habitrun --help` or `status` need
none of the others. :func:`main` runs the app and turns a
:class:`HabitrunError` into its message and exit code (never a traceback).
"""

from __future__ import annotations

import gc
import importlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import typer.core
import typer.main

from habitrun import __version__
from habitrun.cli.text import esc
from habitrun.errors import EXIT_INTERRUPTED, HabitrunError
from habitrun.spec.pluginsoff import plugins_off

if TYPE_CHECKING:
    from rich.console import Console

# Every command, in help order, with the one-line help `habitrun --help` shows
# for it: listing the commands (and suggesting one for a typo) needs no import
# of their modules. tests/cli/test_lazy_commands.py checks these against the
# commands' docstrings.
COMMANDS: dict[str, str] = {
    "validate": "Check a recipe without running it: schema, stage graph, manifest, operators.",
    "schema": "Write schemas/recipe.schema.json and schemas/run-policy.schema.json.",
    "init": "Write a small working study: recipe.yaml, data/ (found by subjects.from), clinical.csv, study_ops/.",
    "plan": "Show what a run would do, per stage: done / failed / stale / pending / forced / blocked.",
    "run": "Run every stage for every subject; subjects already stored as done are skipped.",
    "resume": "Finish the latest run: nothing that finished is repeated, nothing is lost.",
    "status": "Show the last run: outcome, per stage counts, each failed subject with its log file.",
    "gc": "Delete work folders and stored records that no current cache key uses (dry run by default).",
    "trace": "Write one row per subject attempt: outcome, times, CPU, peak memory, I/O, worker, host, GPU.",
    "results": "Write a stage's current results: one row per subject, the result's keys as columns.",
    "report": "Write a run's report: one HTML file that opens offline, charts included.",
}
COMMAND_MODULES = tuple(COMMANDS)


class LazyCommands(typer.core.TyperGroup):
    """The CLI's command group: a command's module is imported when that command is looked up to run.

    Until then each command is a placeholder carrying its name and one-line
    help (what the group's help listing and typo suggestions use).
    """

    def __init__(self, **attrs: object) -> None:
        super().__init__(**attrs)  # type: ignore[arg-type]
        self._listing = False
        for name, summary in COMMANDS.items():
            if name not in self.commands:  # already registered: load_commands() ran first
                self.commands[name] = _Placeholder(name=name, help=summary)
        order = {name: i for i, name in enumerate(COMMANDS)}
        self.commands = dict(sorted(self.commands.items(), key=lambda kv: order.get(kv[0], len(order))))

    def get_command(self, ctx: typer.Context, cmd_name: str) -> typer.core.TyperCommand | None:  # type: ignore[override]
        cmd = self.commands.get(cmd_name)
        if isinstance(cmd, _Placeholder) and not self._listing:
            cmd = self.commands[cmd_name] = _import_command(cmd_name)
        return cmd  # type: ignore[return-value]

    def format_help(self, ctx: typer.Context, formatter: object) -> None:  # type: ignore[override]
        self._listing = True  # the listing shows placeholders as they are
        try:
            if self.rich_markup_mode == "rich":
                from habitrun.cli.listing import print_listing

                commands = (self.get_command(ctx, name) for name in self.list_commands(ctx))
                print_listing(self, ctx, (c for c in commands if c is not None and not c.hidden))  # type: ignore[misc]
            else:
                super().format_help(ctx, formatter)  # type: ignore[arg-type]
        finally:
            self._listing = False


class _Placeholder(typer.core.TyperCommand):
    """A command not imported yet: its name and help only."""


def _import_command(name: str) -> typer.core.TyperCommand:
    """Import ``habitrun.cli.<name>`` (its ``@app.command`` registers) and build its click command."""
    with plugins_off():  # the models its modules define are built as they import (see spec/pluginsoff)
        importlib.import_module(f"habitrun.cli.{name}")
    _end_startup_pause()
    info = next(c for c in app.registered_commands
                if (c.name or typer.main.get_command_name(c.callback.__name__)) == name)  # type: ignore[union-attr]
    return typer.main.get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                            rich_markup_mode=app.rich_markup_mode)  # type: ignore[return-value]


app = typer.Typer(
    name="habitrun",
    cls=LazyCommands,
    help="Run a study's per-subject pipeline from a YAML recipe; resume it after any crash.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



class _ErrConsole:
    """stderr's rich Console, made on first use: a command that prints no error needs no rich (16 ms)."""

    _console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            type(self)._console = Console(stderr=True, highlight=False, soft_wrap=True)
        return getattr(self._console, name)


err_console: Console = _ErrConsole()  # type: ignore[assignment]



def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"habitrun {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print habitrun's version and exit.",
                                 callback=_print_version, is_eager=True),
) -> None:
    """Run a study's per-subject pipeline from a YAML recipe; resume it after any crash."""


def load_commands() -> typer.Typer:
    """Import every command module so its ``@app.command`` registers (the CLI itself imports only the one it runs)."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"habitrun.cli.{name}")
    return app


def report_error(exc: HabitrunError) -> int:
    """Print an error the user can act on; return its exit code."""
    if "\n" not in exc.message:
        err_console.print(f"[bold red]error:[/] {esc(exc.message)}", highlight=False)
    else:
        err_console.print("[bold red]error:[/]")
        err_console.print(exc.message, markup=False, highlight=False)
    return exc.exit_code


def early_recipe(argv: list[str]) -> Path | None:
    """The recipe file a `run`, `resume` or `validate` command line names, found without parsing it fully."""
    if not argv or argv[0] not in ("run", "resume", "validate"):
        return None
    given = next((a for a in argv[1:] if not a.startswith("-")), None)
    if given is None or "=" in given:
        given = "recipe.yaml" if argv[0] == "resume" else None
    if given is None:
        return None
    path = Path(given)
    if path.is_dir():
        path = path / "recipe.yaml"
    return path if path.is_file() else None


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; ``argv`` (default: ``sys.argv[1:]``) lets a test run it in-process.

    The console script ends with the interpreter's normal exit: skipping its teardown
    (``os._exit`` after the ``atexit`` handlers) saved 2-9 ms of commands taking 80-500 ms
    (1-7 %, see docs/performance.md), too little for an exit path of its own.
    """
    if argv is not None:
        _run_cli(argv)
        return
    _startup_pause()
    _run_cli(None)


_paused = False


def _startup_pause() -> None:
    """Stop the cycle collector while the command's modules import (pydantic, the planner, the engine).

    Imports make many objects and few cycles, and every collection on the way walks them all
    again: about 10 ms of `plan`'s 0.24 s. The console script only; :func:`_end_startup_pause`
    resumes it once the command is imported, before any of its work.
    """
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def _end_startup_pause() -> None:
    """Resume the collector; what the imports made is frozen (never walked again: it lives till exit)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def _run_cli(argv: list[str] | None) -> None:
    args = sys.argv[1:] if argv is None else argv
    argv_command = args[0] if args else None
    recipe = early_recipe(args)
    if recipe is not None:
        from habitrun.spec.opcheck import start_early

        # Started before the command is imported: its imports overlap with ours.
        start_early(recipe)
        if argv_command in ("run", "resume"):
            from habitrun.engine.process import early

            early.start()  # the workers' fork server boots meanwhile too
            from habitrun.store.provenance import start_git_state

            start_git_state(recipe.parent)  # and the run's provenance reads git
    try:
        app(args=argv, prog_name="habitrun")
    except HabitrunError as exc:
        sys.exit(report_error(exc))
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if argv is None:  # the console script: the outcome is decided and printed, so a Ctrl-C in
            # the last milliseconds of shutdown has nothing left to stop (it would end the
            # process by SIGINT after a success); in-process callers keep their own handler
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if recipe is not None:
            from habitrun.spec.opcheck import discard_early

            discard_early()
        if "habitrun.engine.process.early" in sys.modules:
            from habitrun.engine.process import early

            early.discard()


if __name__ == "__main__":  # pragma: no cover
    # `python -m habitrun.cli.app` runs this file as __main__, a second copy of
    # the module; the commands register on the imported one, so run that.
    from habitrun.cli.app import main as _main

    _main()
