"""habitrun: run a study's per-subject batch pipeline from a YAML recipe."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"


def results(recipe: object, stage: str, *, manifest: bool = False, meta: bool = False,
            run: str | None = None, overrides: tuple[str, ...] = ()) -> object:
    """A stage's current results: a map stage's as a pandas DataFrame indexed by subject id.

    ``habitrun.results("recipe.yaml", "features")``: one row per subject, the
    operator's result keys as columns (nested keys joined with ``.``; paths
    absolute); ``meta=True`` adds status, error, duration, CPU and peak memory,
    ``manifest=True`` the manifest's fields. By default the results of the
    latest run (its overrides); ``run`` names another run, ``overrides``
    (``("stages.f.params.bins=64",)``) select others. A collect or train stage's
    result comes as it is, a table as a DataFrame. Imported on first call, so
    ``import habitrun`` stays cheap. Needs the ``tables`` extra (pandas).
    """
    # By name: the package root sits beside the layers (store.provenance reads __version__
    # from it), so it must not import a layer statically.
    module = importlib.import_module("habitrun.study.results")
    return module.results(recipe, stage, manifest=manifest, meta=meta, run=run, overrides=tuple(overrides))


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
