"""The typer application and the one place where habitrun's errors become exit codes.

Each command lives in its own module and registers itself on ``app``;
:func:`main` imports them, runs the app and turns a :class:`HabitrunError`
into its message and exit code (never a traceback).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer
from rich.console import Console

from habitrun import __version__
from habitrun.cli.text import esc
from habitrun.errors import EXIT_INTERRUPTED, HabitrunError
from habitrun.spec.opcheck import discard_early, start_early

app = typer.Typer(
    name="habitrun",
    help="Run a study's per-subject pipeline from a YAML recipe; resume it after any crash.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

err_console = Console(stderr=True, highlight=False, soft_wrap=True)



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


COMMAND_MODULES = ("validate", "schema", "init", "plan", "run", "resume", "status", "gc", "trace", "results",
                   "report")


def load_commands() -> typer.Typer:
    """Import every command module so its ``@app.command`` registers."""
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
    """Console-script entry point; ``argv`` (default: ``sys.argv[1:]``) lets a test run it in-process."""
    recipe = early_recipe(sys.argv[1:] if argv is None else argv)
    if recipe is not None:
        # Started before the commands are imported: its imports overlap with ours.
        start_early(recipe)
    try:
        load_commands()
        app(args=argv, prog_name="habitrun")
    except HabitrunError as exc:
        sys.exit(report_error(exc))
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    finally:
        discard_early()


if __name__ == "__main__":  # pragma: no cover
    # `python -m habitrun.cli.app` runs this file as __main__, a second copy of
    # the module; the commands register on the imported one, so run that.
    from habitrun.cli.app import main as _main

    _main()
