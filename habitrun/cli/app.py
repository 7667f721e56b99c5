"""The typer application and the one place where habitrun's errors become exit codes.

Each command lives in its own module and registers itself on ``app``. Only
the command being run is imported (:class:`LazyCommands`): a command module
pulls in pydantic, the YAML reader, the planner or the engine, which together
cost several times Python's own start, and `habitrun --help` or `status` need
none of the others. :func:`main` runs the app and turns a
:class:`HabitrunError` into its message and exit code (never a traceback).
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m habitrun.cli.app`: stop signals are handled before the imports below
    from habitrun.cli.entry import install as _install_stop_handlers

    _install_stop_handlers()

import gc
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
import typer.main
from rich.console import Console

from habitrun import __version__
from habitrun.cli import consoleout, entry
from habitrun.cli.text import esc
from habitrun.errors import EXIT_INTERRUPTED, HabitrunError

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
    "debug": "Run one subject's map stages in this process (no workers, no timeout, output to the terminal).",
    "resume": "Finish the latest run: nothing that finished is repeated, nothing is lost.",
    "status": "Show the last run: outcome, per stage counts, each failed subject with its log file.",
    "gc": "Delete work folders and stored records that no current cache key uses (dry run by default).",
    "trace": "Write one row per subject attempt: outcome, times, CPU, peak memory, I/O, worker, host, GPU.",
    "results": "Write a stage's current results: one row per subject, the result's keys as columns.",
    "report": "Write a run's report: one HTML file that opens offline, charts included.",
    "diff": "Name what changed between two runs: recipe values, code files, packages, data files, habitrun, Python.",
    "export": "Export a run as a Workflow Run RO-Crate: the recipe, one action per stage, files with digests.",
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

    def get_params(self, ctx: typer.Context) -> list[typer.core.click.Parameter]:  # type: ignore[name-defined,override]
        return plain_params(super().get_params(ctx))

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
                print_listing(self, ctx, (c for c in commands if c is not None and not c.hidden))
            else:
                super().format_help(ctx, formatter)  # type: ignore[arg-type]
        finally:
            self._listing = False


class _Placeholder(typer.core.TyperCommand):
    """A command not imported yet: its name and help only."""


class Command(typer.core.TyperCommand):
    """Every habitrun command: its help lists flags as flags and arguments as ``RECIPE``, ``[RECIPE]``.

    typer draws a boolean option as ``--json <bool>`` (as if it took a value) and an
    argument as ``{recipe}``; people expect ``--json`` and ``RECIPE`` (git, pip, docker).
    """

    def get_params(self, ctx: typer.Context) -> list[typer.core.click.Parameter]:  # type: ignore[name-defined,override]
        return plain_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                name = param.metavar or param.name or ""
                shown = name if param.required else f"[{name}]"
                pieces.append(shown + ("..." if param.nargs != 1 else ""))
        return pieces


def plain_params(params: list[Any]) -> list[Any]:
    """``params`` with flags shown without a type and arguments named in capitals (their help only)."""
    for param in params:
        if isinstance(param, typer.core.TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
        elif isinstance(param, typer.core.TyperArgument) and param.metavar is None:
            param.metavar = (param.name or "").upper()
    return params


def _import_command(name: str) -> typer.core.TyperCommand:
    """Import ``habitrun.cli.<name>`` (its ``@app.command`` registers) and build its click command."""
    importlib.import_module(f"habitrun.cli.{name}")
    _end_startup_pause()
    info = next(c for c in app.registered_commands
                if (c.name or typer.main.get_command_name(c.callback.__name__)) == name)  # type: ignore[union-attr]
    _use_our_command(info)
    return typer.main.get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                            rich_markup_mode=app.rich_markup_mode)  # type: ignore[return-value]


app = typer.Typer(
    name="habitrun",
    cls=LazyCommands,
    help="Run a study's per-subject pipeline from a YAML recipe; resume it after any crash.",
    no_args_is_help=True,
    add_completion=False,  # typer's own options guess the shell from the parent process: ours take its name
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


err_console = Console(stderr=True, highlight=False, soft_wrap=True)



def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"habitrun {__version__}")
        raise typer.Exit(0)


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _check_shell(ctx: typer.Context, value: str | None) -> str | None:
    if value is not None and value not in SHELLS:
        raise typer.BadParameter(f"{value!r} is not a shell habitrun completes; one of: {', '.join(SHELLS)}", ctx=ctx)
    return value


def _show_completion(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> None:
    """Print the completion script for that shell (typer's), to source or to save where the shell reads it."""
    if value is not None and not ctx.resilient_parsing:
        from typer.completion import show_callback

        show_callback(ctx, param, _check_shell(ctx, value))


def _install_completion(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> None:
    """Add the completion script to that shell's start-up file (typer's installer)."""
    if value is not None and not ctx.resilient_parsing:
        from typer.completion import install_callback

        install_callback(ctx, param, _check_shell(ctx, value))


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", help="Print habitrun's version and exit.",
                                 callback=_print_version, is_eager=True),
    show_completion: Optional[str] = typer.Option(  # noqa: UP045
        None, "--show-completion", metavar="SHELL", callback=_show_completion, is_eager=True,
        help="Print the shell completion script for SHELL (bash, zsh, fish, powershell) and exit."),
    install_completion: Optional[str] = typer.Option(  # noqa: UP045
        None, "--install-completion", metavar="SHELL", callback=_install_completion, is_eager=True,
        help="Install shell completion for SHELL in its start-up file and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Print the engine's decisions on stderr as it makes them (a run also keeps "
                                      "them in its folder's debug.log; HABITRUN_DEBUG=1 keeps them there only)."),
) -> None:
    """Run a study's per-subject pipeline from a YAML recipe; resume it after any crash."""
    if verbose:
        from habitrun.cli.verbose import to_stderr

        to_stderr()


def load_commands() -> typer.Typer:
    """Import every command module so its ``@app.command`` registers (the CLI itself imports only the one it runs)."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"habitrun.cli.{name}")
    for info in app.registered_commands:
        _use_our_command(info)
    return app


def _use_our_command(info: typer.models.CommandInfo) -> None:
    """Build the command as a :class:`Command` (typer's default class is recorded as the one given)."""
    if info.cls in (None, typer.core.TyperCommand):
        info.cls = Command


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
    from habitrun.cli.findrecipe import is_override, search_upward

    given = next((a for a in argv[1:] if not a.startswith("-")), None)
    if given is None or is_override(given):  # left out: found as the command will find it
        return search_upward()[0]
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
    entry.install()  # already done by the console script (habitrun.cli.entry); again for other callers
    consoleout.install()
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
    entry.note_command(argv_command if argv_command in COMMANDS else None)
    if os.environ.get("_HABITRUN_COMPLETE"):  # the shell asks for completions (see --show-completion)
        from typer.completion import completion_init

        completion_init()  # typer's shell classes (add_completion=False does not register them)
    recipe = early_recipe(args)
    if recipe is not None:
        from habitrun.spec.opcheck import start_early

        # Started before the command is imported: its imports overlap with ours (what these three
        # save, measured: docs/architecture.md, "Start-up").
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
        if argv is None:  # the console script: the outcome is decided and printed, so a stop signal
            # in the last milliseconds of shutdown has nothing left to stop (it would turn a
            # success into 130/143); in-process callers keep their own handlers
            entry.ignore_stop_signals()
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
