"""habitrun: run a study's per-subject batch pipeline from a YAML recipe."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"


def results(recipe: object, stage: str, *, manifest: bool = False) -> object:
    """A map stage's current results as a pandas DataFrame indexed by subject id.

    ``habitrun.results("recipe.yaml", "features")``: one row per subject of the
    manifest (failed ones with their error), the result's keys as columns
    (nested keys joined with ``.``), plus status, duration and peak memory;
    ``manifest=True`` adds the manifest's fields. Imported on first call, so
    ``import habitrun`` stays cheap. Needs the ``tables`` extra (pandas).
    """
    # By name: the package root sits beside the layers (store.provenance reads __version__
    # from it), so it must not import a layer statically.
    module = importlib.import_module("habitrun.planner.results")
    return module.results(recipe, stage, manifest=manifest)


def run_tool(argv: object, **options: object) -> object:
    """Run a command-line tool for the subject being run: ``habitrun.run_tool(["mrconvert", a, b])``.

    Never through a shell; its stdout and stderr go into the subject's log, its CPU, peak
    memory and I/O into the subject's trace row, and a timeout or Ctrl-C ends it with the
    subject. A non-zero exit raises ``habitrun.errors.ToolError`` naming the exit code (or
    signal) and the last lines of its stderr. Options: ``cwd``, ``env`` (added to the
    environment), ``check`` (False: return the result instead of raising). See
    :func:`habitrun.engine.command.runtool.run_tool`.
    """
    module = importlib.import_module("habitrun.engine.command.runtool")
    return module.run_tool(argv, **options)
