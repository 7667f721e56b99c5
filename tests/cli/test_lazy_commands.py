"""The CLI imports only the command it runs; the help it lists without importing them is the commands' own."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

from habitrun.cli.app import COMMANDS, app, load_commands

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "recipe.yaml"

# Runs the CLI in a fresh interpreter, then names the habitrun/pydantic modules it imported.
SCRIPT = """
import sys
from habitrun.cli import app as cli
if sys.argv[1] == "eager":
    cli.load_commands()
try:
    cli.main(sys.argv[2:])
except SystemExit:
    pass
print("MODULES", *sorted(m for m in sys.modules if m.startswith(("habitrun", "pydantic"))))
"""


def cli(*argv: str, eager: bool = False) -> tuple[str, set[str]]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, "eager" if eager else "lazy", *argv],
                          capture_output=True, text=True, timeout=60, check=False)
    out, _, modules = done.stdout.rpartition("MODULES")
    return out, set(modules.split())


def test_help_lists_every_command_without_importing_any() -> None:
    lazy, modules = cli("--help")
    eager, _ = cli("--help", eager=True)
    assert lazy == eager  # same listing, word for word, as with every command imported
    for name in COMMANDS:
        assert name in lazy
    assert not {f"habitrun.cli.{name}" for name in COMMANDS} & modules
    assert "pydantic" not in modules and "habitrun.spec.loader" not in modules


# typer's own drawing of the listing (its rich_utils), for comparison with ours.
TYPERS_LISTING = """
import typer.main, typer.rich_utils
from habitrun.cli.app import app
group = typer.main.get_command(app)
ctx = group.make_context("habitrun", [], resilient_parsing=True)
group._listing = True  # the placeholders, as `habitrun --help` lists them
typer.rich_utils.rich_format_help(obj=group, ctx=ctx, markup_mode="rich")
"""


def test_help_draws_the_listing_as_typer_does_without_its_help_module() -> None:
    env = {**os.environ, "FORCE_COLOR": "1", "TERMINAL_WIDTH": "71"}  # colours and wrapping compared too
    ours = subprocess.run([sys.executable, "-c", SCRIPT + "print('RICH_UTILS', 'typer.rich_utils' in sys.modules)",
                           "lazy", "--help"], capture_output=True, text=True, timeout=60, check=False, env=env)
    typers = subprocess.run([sys.executable, "-c", TYPERS_LISTING], capture_output=True, text=True,
                            timeout=60, check=False, env=env)
    assert typers.returncode == 0, typers.stderr
    listing = ours.stdout.partition("MODULES")[0]
    assert "\x1b[" in listing and "Commands" in listing
    assert listing == typers.stdout + "\n"  # click echoes the (empty) help string after the drawing
    assert "RICH_UTILS False" in ours.stdout


def test_a_command_imports_its_own_module_only() -> None:
    out, modules = cli("validate", str(DEMO))
    assert "the recipe is valid" in out
    assert "habitrun.cli.validate" in modules
    assert not {"habitrun.cli.run", "habitrun.cli.resume", "habitrun.cli.status", "habitrun.engine.runner"} & modules


def test_a_typo_still_gets_a_suggestion() -> None:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "statu"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Did you mean 'status'?" in done.stderr


def test_listed_help_is_each_commands_docstring() -> None:
    load_commands()
    docs = {c.name or c.callback.__name__: inspect.getdoc(c.callback) for c in app.registered_commands}
    assert set(docs) == set(COMMANDS)  # registration order depends on what the session imported first
    for name, summary in COMMANDS.items():
        assert docs[name].split("\n\n")[0].replace("\n", " ") == summary, name


def test_status_and_plan_import_neither_the_engine_nor_the_operator_check() -> None:
    for command in ("status", "plan"):
        _, modules = cli(command, str(DEMO))
        assert f"habitrun.cli.{command}" in modules
        assert not {m for m in modules if m.startswith("habitrun.engine")}, command
        assert not {"habitrun.spec.opcheck", "habitrun.cli.validate", "habitrun.cli.resume"} & modules, command
